//! Damaged versions of real inputs — a number made zero, negative or huge, a line dropped, doubled
//! or moved, the file cut short — are refused with an error or processed to the end: never a panic
//! or an overflow. Deterministic (`wasmsched_sim::generate::mutate_text`); `MUTATIONS=N` runs N per
//! file instead of the default, to search further.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;

use wasmsched_core::{NativePlugin, PolicySet};
use wasmsched_plugin_fair_share::FairSharePolicy;
use wasmsched_plugin_gpu_share_score::GpuShareScore;
use wasmsched_plugin_priority_preempt::PriorityPreempt;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_sim::generate::{Rng, mutate_text};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn policies() -> PolicySet {
    let score = Arc::new(NativePlugin::<GpuShareScore>::new(r#"{"policy":"best-fit"}"#, 1).unwrap());
    PolicySet::builder()
        .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
        .score(score.clone(), 1)
        .devices(score)
        .fair_share(Arc::new(NativePlugin::<FairSharePolicy>::new("", 1).unwrap()))
        .preempt(Arc::new(NativePlugin::<PriorityPreempt>::new("", 1).unwrap()))
        .build()
}

fn per_file(default: u64) -> u64 {
    std::env::var("MUTATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Feed `mutations` damaged versions of `text` to `process`, which says whether it accepted the
/// input; a panic fails the test with the input that caused it. Returns (refused, accepted).
fn mutated(name: &str, text: &str, mutations: u64, process: impl Fn(&str) -> bool) -> (u64, u64) {
    let mut rng = Rng::new(0x5eed ^ text.len() as u64);
    let (mut refused, mut accepted) = (0, 0);
    for i in 0..mutations {
        let mut input = mutate_text(text, &mut rng);
        // Two mutations now and then: more shapes get past the first checks.
        if rng.below(3) == 0 {
            input = mutate_text(&input, &mut rng);
        }
        match catch_unwind(AssertUnwindSafe(|| process(&input))) {
            Ok(true) => accepted += 1,
            Ok(false) => refused += 1,
            Err(_) => panic!("{name}, mutation {i}: panicked on\n{input}"),
        }
    }
    (refused, accepted)
}

fn files(dir: &str, ext: &[&str]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(Path::new(ROOT).join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| ext.iter().any(|x| e == *x)))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap()))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no {ext:?} files in {dir}");
    out
}

#[test]
fn damaged_scenarios_are_refused_or_replayed() {
    use wasmsched_sim::timed::{self, Scenario};
    let set = policies();
    let (mut refused, mut accepted) = (0, 0);
    for (name, text) in files("examples/scenarios", &["yaml", "json"]) {
        let (r, a) = mutated(&name, &text, per_file(100), |input| {
            let lenient = input.len().is_multiple_of(2);
            let Ok((s, _)) = Scenario::parse_lenient(&name, input, lenient) else { return false };
            let Ok(tree) = s.queue_tree() else { return false };
            // The replay may refuse (a job no node can hold); it must end either way.
            let _ = timed::run(&set, &s.node_table(), &tree, &s.jobs);
            true
        });
        (refused, accepted) = (refused + r, accepted + a);
    }
    assert!(refused > 0 && accepted > 0, "refused {refused}, replayed {accepted}: the mutations tested nothing");
}

#[test]
fn damaged_openb_traces_are_refused_or_replayed() {
    use wasmsched_sim::{replay, trace, workload};
    let head = |file: &str, lines: usize| -> String {
        let text = std::fs::read_to_string(Path::new(ROOT).join("examples/traces/openb").join(file)).unwrap();
        text.lines().take(lines).collect::<Vec<_>>().join("\n")
    };
    let nodes = head("openb_node_list_gpu_node.csv", 25);
    let pods = head("openb_pod_list_default.csv", 120);
    let set = policies();
    let run = |nodes_csv: &str, pods_csv: &str| -> bool {
        let Ok(nodes) = trace::parse_nodes("nodes.csv", nodes_csv) else { return false };
        let Ok((pods, _)) = trace::parse_pods_lenient("pods.csv", pods_csv, pods_csv.len().is_multiple_of(2)) else {
            return false;
        };
        let w = workload::build(&pods, &nodes, 42, 1.3);
        replay::run(&set, &w.nodes, &w.pods, &workload::target_workload(&pods));
        true
    };
    let (r1, a1) = mutated("nodes", &nodes, per_file(60), |n| run(n, &pods));
    let (r2, a2) = mutated("pods", &pods, per_file(60), |p| run(&nodes, p));
    assert!(r1 + r2 > 0 && a1 + a2 > 0, "refused {}, replayed {}", r1 + r2, a1 + a2);
}

#[test]
fn damaged_nvidia_smi_topologies_are_refused_or_used() {
    use wasmsched_topology::{LinkCosts, NumaPolicy, Prepared, smi};
    let (mut refused, mut accepted) = (0, 0);
    for (name, text) in files("host/topology/tests/fixtures", &["txt"]) {
        let (r, a) = mutated(&name, &text, per_file(100), |input| {
            let Ok(topology) = smi::parse(input) else { return false };
            let prepared = Prepared::new(&topology, &LinkCosts::default());
            for k in 1..=prepared.len() as u32 {
                let _ = prepared.select(prepared.all(), k, NumaPolicy::Restricted);
            }
            true
        });
        (refused, accepted) = (refused + r, accepted + a);
    }
    assert!(refused > 0 && accepted > 0, "refused {refused}, used {accepted}");
}

#[test]
fn damaged_policy_set_files_are_refused_or_read() {
    use wasmsched_registry::PolicySetSpec;
    let (mut refused, mut accepted) = (0, 0);
    for dir in ["examples/policies/packing", "examples/policies/reclaim"] {
        for (name, text) in files(dir, &["yaml"]) {
            let (r, a) = mutated(&name, &text, per_file(200), |input| PolicySetSpec::parse(&name, input).is_ok());
            (refused, accepted) = (refused + r, accepted + a);
        }
    }
    assert!(refused > 0 && accepted > 0, "refused {refused}, read {accepted}");
}
