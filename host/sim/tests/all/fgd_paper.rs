//! The FGD paper's experiment on the protocol's worked example and on the real `default` trace.

use std::sync::Arc;

use wasmsched_core::{NativePlugin, PolicySet};
use wasmsched_plugin_gpu_share_score::GpuShareScore;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_sim::{replay, trace, workload};

const DEFAULT_PODS: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/traces/openb/openb_pod_list_default.csv"));

fn paper_set(config: &str) -> PolicySet {
    let score = Arc::new(NativePlugin::<GpuShareScore>::new(config, 1).unwrap());
    PolicySet::builder()
        .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
        .score(score.clone(), 1000)
        .devices(score)
        .build()
}

/// `docs/openb-protocol.md` §6: nodes A (2 GPUs, rank 0) and B (1 GPU, rank 1); pods P1..P4.
fn worked_example() -> (wasmsched_core::NodeTable, Vec<trace::TracePod>) {
    let nodes = trace::parse_nodes(
        "nodes",
        "sn,cpu_milli,memory_mib,gpu,model\n0000-A,8000,1048576,2,T4\n0001-B,8000,1048576,1,T4\n",
    )
    .unwrap();
    let mut table = wasmsched_core::NodeTable::new();
    for n in nodes {
        table.upsert(n);
    }
    let pods = trace::parse_pods(
        "pods",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nP1,1000,1,1,200\nP2,2000,1,1,1000\nP3,1000,1,1,200\nP4,2000,1,1,1000\n",
    )
    .unwrap();
    (table, pods)
}

const EXAMPLE_TYPICAL: &str = r#"[
    {"cpu_milli":1000,"milli":500,"count":1,"weight":0.5},
    {"cpu_milli":1000,"milli":1000,"count":1,"weight":0.4},
    {"cpu_milli":1000,"milli":0,"count":0,"weight":0.1}]"#;

#[test]
fn worked_example_fgd_places_all_four_and_best_fit_strands_p4() {
    let (nodes, pods) = worked_example();
    let typical: Vec<_> = serde_json::from_str(EXAMPLE_TYPICAL).unwrap();

    let fgd =
        replay::run(&paper_set(&format!(r#"{{"policy":"fgd","typical":{EXAMPLE_TYPICAL}}}"#)), &nodes, &pods, &typical);
    let used: Vec<u64> = fgd.series.iter().map(|p| p.used_milli).collect();
    assert_eq!(used, [200, 1200, 1400, 2400]);
    assert_eq!((fgd.placed, fgd.failed), (4, 0));
    // Final fragmentation: A [600, 0] → 300 of 600 idle; B [0] → 0.
    let last = fgd.series.last().unwrap();
    assert_eq!((last.frag_milli, last.frag_ratio), (300.0, 50.0));

    let best = replay::run(&paper_set(r#"{"policy":"best-fit"}"#), &nodes, &pods, &typical);
    let used: Vec<u64> = best.series.iter().map(|p| p.used_milli).collect();
    assert_eq!(used, [200, 1200, 1400, 1400]);
    assert_eq!((best.placed, best.failed), (3, 1));

    let (f, b) = (replay::allocation_columns(&fgd, 130), replay::allocation_columns(&best, 130));
    assert_eq!((f[80], b[80]), (Some(80.0), Some(46.67)));
    assert_eq!((f[7], f[8], f[40], f[47]), (Some(6.67), Some(6.67), Some(40.0), Some(46.67)));
    assert_eq!(f[20], None, "no event within ±1 of 20 %");
}

#[test]
fn target_workload_of_the_default_trace_matches_the_protocol() {
    let pods = trace::parse_pods("default", DEFAULT_PODS).unwrap();
    let typical = workload::target_workload(&pods);
    assert_eq!(typical.len(), 35);
    let first = &typical[0];
    assert_eq!((first.cpu_milli, first.count, first.milli), (3152, 1, 810));
    assert_eq!(first.weight, 0.13481843935101726);
    assert_eq!((typical[1].cpu_milli, typical[1].milli), (11300, 1000));
    assert!((typical[1].weight - 0.11254).abs() < 1e-5);
    assert_eq!((typical[4].cpu_milli, typical[4].milli), (11908, 470));
    let sum: f64 = typical.iter().map(|t| t.weight).sum();
    assert!((sum - 1.0).abs() < 1e-12);
}
