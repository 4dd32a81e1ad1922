//! Which idle GPU share a typical pod could use: the complement is what FGD calls fragmented.
//!
//! The paper's measure ([`Usable::AnyFit`]) counts all the free share of every GPU with room for
//! the pod, as long as the node's CPU fits *one* copy of it. On openb that overstates what is left:
//! a node whose CPU holds one more 12-core pod still shows eight free GPUs as usable by it, so FGD
//! happily spends a node's CPU on a pod while the node's GPUs stay idle for good. `fgd-cpu`
//! ([`Usable::CpuBounded`]) counts no more GPUs than copies of the pod the CPU can still hold;
//! `docs/openb/fgd-cpu.md` has the grid and the ablations ([`Usable::Copies`],
//! [`Usable::CpuBoundedCopies`]).

use serde::Deserialize;
use wasmsched_sdk::fragmentation::{TypicalPod, measure};

/// The measure of usable share.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Usable {
    /// The FGD paper's: every GPU with room for the pod (when enough have room and the CPU fits
    /// one copy), all of its free share.
    #[default]
    AnyFit,
    /// `fgd-cpu`: as [`Usable::AnyFit`], on at most as many GPUs (the roomiest) as copies of the
    /// pod the node's CPU holds need.
    CpuBounded,
    /// Ablation: whole copies of the pod on the GPUs (`⌊free / share⌋` per GPU for a sharing pod,
    /// `⌊GPUs with room / count⌋` copies otherwise), the CPU fitting one copy.
    Copies,
    /// Ablation: whole copies, as many as both the GPUs and the CPU hold.
    CpuBoundedCopies,
}

/// The fragmented share of a node (milli-GPU, weighted by popularity) under `usable`, for the
/// target workload `typical`; `access[i]` says whether typical pod `i` accepts the node's GPUs.
///
/// [`Usable::AnyFit`] is the paper's measure, bit for bit. The others leave CPU-only typical pods
/// out: they use no GPU, and the paper's measure adds their whole weight of the node's free share,
/// the same amount for every node a pod could go to.
pub fn fragmented(usable: Usable, typical: &[TypicalPod], access: &[bool], cpu_left: u64, lefts: &[u32]) -> f64 {
    if usable == Usable::AnyFit {
        return measure(typical, access, cpu_left, lefts).fragmented;
    }
    let total: u64 = lefts.iter().map(|&l| u64::from(l)).sum();
    // Roomiest first: the GPUs a CPU-bounded number of copies would take.
    let mut roomiest = lefts.to_vec();
    roomiest.sort_unstable_by(|a, b| b.cmp(a));
    let mut fragmented = 0.0;
    for (t, &ok) in typical.iter().zip(access) {
        if t.milli == 0 {
            continue;
        }
        let by_cpu = cpu_left.checked_div(t.cpu_milli).unwrap_or(u64::MAX);
        let usable_share = if !ok || by_cpu == 0 {
            0
        } else if usable == Usable::CpuBounded {
            let with_room = roomiest.iter().take_while(|&&l| l >= t.milli).count() as u64;
            if with_room < u64::from(t.count) {
                0
            } else {
                let gpus = by_cpu.saturating_mul(u64::from(t.count)).min(with_room) as usize;
                roomiest[..gpus].iter().map(|&l| u64::from(l)).sum()
            }
        } else {
            let by_gpu = if t.count == 1 {
                lefts.iter().map(|&l| u64::from(l / t.milli)).sum::<u64>()
            } else {
                lefts.iter().filter(|&&l| l >= t.milli).count() as u64 / u64::from(t.count)
            };
            let copies = if usable == Usable::CpuBoundedCopies { by_cpu.min(by_gpu) } else { by_gpu };
            copies * u64::from(t.milli) * u64::from(t.count)
        };
        fragmented += t.weight * total.saturating_sub(usable_share) as f64;
    }
    fragmented
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(cpu: u64, milli: u32, count: u32, weight: f64) -> TypicalPod {
        TypicalPod { cpu_milli: cpu, milli, count, models: vec![], weight }
    }

    #[test]
    fn any_fit_is_the_papers_measure() {
        let w = [t(1000, 500, 1, 0.5), t(1000, 1000, 1, 0.4), t(1000, 0, 0, 0.1)];
        assert_eq!(fragmented(Usable::AnyFit, &w, &[true; 3], 7000, &[800, 1000]), 500.0);
        assert_eq!(fragmented(Usable::AnyFit, &w, &[true; 3], 4000, &[600, 0]), 300.0);
    }

    #[test]
    fn cpu_bounded_counts_only_the_gpus_the_cpu_can_feed() {
        // 8 free GPUs, CPU for 3 copies of a 12-core single-GPU pod: 5 GPUs are stranded.
        let w = [t(12_000, 1000, 1, 1.0)];
        let free = [1000; 8];
        assert_eq!(fragmented(Usable::AnyFit, &w, &[true], 36_000, &free), 0.0);
        assert_eq!(fragmented(Usable::CpuBounded, &w, &[true], 36_000, &free), 5000.0);
        assert_eq!(fragmented(Usable::CpuBounded, &w, &[true], 96_000, &free), 0.0, "CPU for all 8");
        assert_eq!(fragmented(Usable::CpuBounded, &w, &[true], 11_999, &free), 8000.0, "not one copy");
        // The roomiest GPUs count: CPU for one 500-milli copy, GPUs at 300, 900, 600 free.
        let share = [t(4_000, 500, 1, 1.0)];
        assert_eq!(fragmented(Usable::CpuBounded, &share, &[true], 4_000, &[300, 900, 600]), 900.0);
        // Multi-GPU: CPU for one 4-GPU copy of 8 free GPUs.
        let four = [t(32_000, 1000, 4, 1.0)];
        assert_eq!(fragmented(Usable::CpuBounded, &four, &[true], 40_000, &free), 4000.0);
        assert_eq!(fragmented(Usable::CpuBounded, &four, &[true], 40_000, &[1000, 1000, 1000, 0]), 3000.0);
        // No access to the model: all of it.
        assert_eq!(fragmented(Usable::CpuBounded, &w, &[false], 96_000, &free), 8000.0);
    }

    #[test]
    fn copies_count_whole_pods_per_gpu() {
        let w = [t(1000, 400, 1, 1.0)];
        // 1000 → 2 copies (800), 700 → 1 (400): 1700 free, 1200 usable.
        assert_eq!(fragmented(Usable::Copies, &w, &[true], 64_000, &[1000, 700]), 500.0);
        // With CPU for 2 copies only: 800 usable.
        assert_eq!(fragmented(Usable::CpuBoundedCopies, &w, &[true], 2_000, &[1000, 700]), 900.0);
        let two = [t(1000, 1000, 2, 1.0)];
        assert_eq!(fragmented(Usable::Copies, &two, &[true], 64_000, &[1000, 1000, 1000]), 1000.0);
    }

    #[test]
    fn cpu_only_typical_pods_do_not_count_outside_the_papers_measure() {
        let w = [t(1000, 0, 0, 0.5), t(1000, 1000, 1, 0.5)];
        assert_eq!(fragmented(Usable::CpuBounded, &w, &[true; 2], 8000, &[1000, 1000]), 0.0);
        assert_eq!(fragmented(Usable::AnyFit, &w, &[true; 2], 8000, &[1000, 1000]), 1000.0);
    }
}
