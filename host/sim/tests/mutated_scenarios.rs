//! Mutated scenarios (a number made huge, zero or negative, a line dropped, doubled or swapped,
//! the text cut short) are refused with an error or replayed to the end: never a panic, an
//! overflow or a hang. Deterministic; `MUTATIONS=N` runs N per example instead of the default.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use wasmsched_core::{NativePlugin, PolicySet};
use wasmsched_plugin_fair_share::FairSharePolicy;
use wasmsched_plugin_gpu_share_score::GpuShareScore;
use wasmsched_plugin_priority_preempt::PriorityPreempt;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_sim::generate::Rng;
use wasmsched_sim::timed::{self, Scenario};

fn full_set() -> PolicySet {
    let score = Arc::new(NativePlugin::<GpuShareScore>::new(r#"{"policy":"best-fit"}"#, 1).unwrap());
    PolicySet::builder()
        .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
        .score(score.clone(), 1)
        .devices(score)
        .fair_share(Arc::new(NativePlugin::<FairSharePolicy>::new("", 1).unwrap()))
        .preempt(Arc::new(NativePlugin::<PriorityPreempt>::new("", 1).unwrap()))
        .build()
}

const NUMBERS: [&str; 8] = ["0", "-1", "1", "65", "4294967296", "9223372036854775807", "18446744073709551615", "1e300"];

/// Byte offsets of the decimal numbers in `text`.
fn numbers(text: &str) -> Vec<(usize, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'-')) {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i == b.len() || !b[i].is_ascii_alphabetic() {
                out.push((start, i));
            }
        } else {
            i += 1;
        }
    }
    out
}

fn mutate(text: &str, rng: &mut Rng) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return text.to_string();
    }
    let pick_line = |rng: &mut Rng| rng.below(lines.len() as u64) as usize;
    match rng.below(6) {
        0 | 1 => {
            let spots = numbers(text);
            if spots.is_empty() {
                return text.to_string();
            }
            let (a, b) = spots[rng.below(spots.len() as u64) as usize];
            format!("{}{}{}", &text[..a], rng.pick(&NUMBERS), &text[b..])
        }
        2 => {
            let drop = pick_line(rng);
            lines.iter().enumerate().filter(|(i, _)| *i != drop).map(|(_, l)| *l).collect::<Vec<_>>().join("\n")
        }
        3 => {
            let twice = pick_line(rng);
            let mut out: Vec<&str> = lines.clone();
            out.insert(twice, lines[twice]);
            out.join("\n")
        }
        4 => {
            let (a, b) = (pick_line(rng), pick_line(rng));
            let mut out = lines.clone();
            out.swap(a, b);
            out.join("\n")
        }
        _ => {
            let mut cut = rng.below(text.len() as u64) as usize;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text[..cut].to_string()
        }
    }
}

#[test]
fn mutated_example_scenarios_are_refused_or_replayed_never_a_panic() {
    let per_file: u64 = std::env::var("MUTATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(150);
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios");
    let set = full_set();
    let (mut refused, mut replayed) = (0, 0);
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut rng = Rng::new(0x5eed ^ text.len() as u64);
        for i in 0..per_file {
            // Two mutations at a time now and then: more shapes reach validation's later checks.
            let mut mutated = mutate(&text, &mut rng);
            if rng.below(3) == 0 {
                mutated = mutate(&mutated, &mut rng);
            }
            let lenient = rng.below(2) == 0;
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                let Ok((s, _)) = Scenario::parse_lenient(&name, &mutated, lenient) else { return false };
                let Ok(tree) = s.queue_tree() else { return false };
                // A replay may still refuse (e.g. a job no node can ever hold); it must not panic.
                let _ = timed::run(&set, &s.node_table(), &tree, &s.jobs);
                true
            }));
            match outcome {
                Ok(true) => replayed += 1,
                Ok(false) => refused += 1,
                Err(_) => panic!("{name}, mutation {i} (lenient: {lenient}) panicked; the scenario:\n{mutated}"),
            }
        }
    }
    // Both outcomes occur, or the mutations tested nothing.
    assert!(refused > 0 && replayed > 0, "refused {refused}, replayed {replayed}");
}
