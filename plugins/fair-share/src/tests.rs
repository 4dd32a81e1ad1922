//! The digest-001 §7 fair-share scenarios (H1–H5, D1–D2, D4) and tree validation.

use super::*;

fn res(cpu: u64, mem: u64, gpu: u64) -> Resources {
    Resources { cpu_milli: cpu, memory_bytes: mem, gpu_milli: gpu, extended: Default::default() }
}

fn all(x: u64) -> Resources {
    res(x, x, x)
}

fn queue(name: &str, parent: Option<u32>, weight: u32, guarantee: u64, request: u64) -> QueueState {
    QueueState {
        name: name.into(),
        parent,
        weight,
        guarantee: all(guarantee),
        request: all(request),
        ..Default::default()
    }
}

fn compute(policy: &str, queues: &[QueueState], cluster: &Resources) -> ShareDecision {
    FairSharePolicy::new(&format!(r#"{{"policy":"{policy}"}}"#)).unwrap().compute(queues, cluster).unwrap()
}

fn gpu(d: &ShareDecision) -> Vec<u64> {
    d.deserved.iter().map(|r| r.gpu_milli).collect()
}

#[test]
fn h1_guarantees_then_weights() {
    let q = [queue("A", None, 3, 10, 100), queue("B", None, 1, 10, 100)];
    assert_eq!(gpu(&compute("proportion", &q, &all(100))), vec![70, 30]);
}

#[test]
fn h2_work_conserving_when_a_queue_wants_less() {
    let q = [queue("A", None, 3, 10, 100), queue("B", None, 1, 10, 10)];
    assert_eq!(gpu(&compute("proportion", &q, &all(100))), vec![90, 10]);
}

#[test]
fn h3_capability_caps_and_the_rest_flows_on() {
    let mut q = [queue("A", None, 3, 10, 100), queue("B", None, 1, 10, 100)];
    q[0].capability = Some(all(50));
    assert_eq!(gpu(&compute("proportion", &q, &all(100))), vec![50, 50]);
}

#[test]
fn h4_guarantees_are_never_overcommitted() {
    let q = [queue("A", None, 3, 10, 100), queue("B", None, 1, 10, 100)];
    let d = gpu(&compute("proportion", &q, &all(15)));
    assert_eq!(d.iter().sum::<u64>(), 15);
    assert_eq!(d, vec![8, 7], "scaled guarantees 7 + 7, the last unit to the heavier queue");
}

#[test]
fn h5_parent_capability_bounds_its_subtree() {
    let mut q = [queue("parent", None, 1, 0, 0), queue("x", Some(0), 1, 0, 64), queue("y", Some(0), 1, 0, 64)];
    q[0].capability = Some(all(32));
    q[1].capability = Some(all(32));
    q[2].capability = Some(all(32));
    let d = gpu(&compute("proportion", &q, &all(100)));
    assert_eq!(d, vec![32, 16, 16]);
}

#[test]
fn hierarchy_splits_each_level_by_weight() {
    let q = [
        queue("org-a", None, 1, 0, 0),
        queue("org-b", None, 1, 0, 0),
        queue("a1", Some(0), 1, 0, 100),
        queue("a2", Some(0), 3, 0, 100),
        queue("b1", Some(1), 1, 0, 100),
    ];
    assert_eq!(gpu(&compute("proportion", &q, &all(80))), vec![40, 40, 10, 30, 40]);
}

#[test]
fn extended_resources_are_dimensions_of_their_own() {
    // Per-flavor quotas: "a100/gpu" and "v100/gpu" are extended resources of the cluster.
    let ext = |a100: u64, v100: u64| -> wasmsched_sdk::Extended {
        vec![("a100/gpu".into(), a100), ("v100/gpu".into(), v100)].into()
    };
    let cluster = Resources { extended: ext(8000, 4000), ..all(100) };
    let mut q = [queue("A", None, 1, 0, 100), queue("B", None, 1, 0, 100), queue("C", None, 2, 0, 100)];
    for q in &mut q {
        q.request.extended = ext(8000, 4000);
    }
    // A may use at most 1,000 of the A100s (a name it does not list is unbounded: V100).
    q[0].capability = Some(Resources { extended: vec![("a100/gpu".into(), 1000)].into(), ..all(u64::MAX) });
    q[2].request.extended = vec![("v100/gpu".into(), 4000)].into();
    let d = compute("proportion", &q, &cluster);
    // A100: A capped at 1,000, the other 7,000 to B (C asks for none). V100 by weight 1:1:2.
    assert_eq!(d.deserved[0].extended, ext(1000, 1000));
    assert_eq!(d.deserved[1].extended, ext(7000, 1000));
    assert_eq!(d.deserved[2].extended, ext(0, 2000));
    // Serving order by the largest used fraction of the deserved share, in any dimension: B uses
    // half its V100 share, A half of its A100 share and C a quarter of its V100 share.
    q[0].allocated.extended = vec![("a100/gpu".into(), 500)].into();
    q[1].allocated.extended = vec![("v100/gpu".into(), 500)].into();
    q[2].allocated.extended = vec![("v100/gpu".into(), 500)].into();
    assert_eq!(compute("proportion", &q, &cluster).order, vec![2, 0, 1]);
    // Nothing pending in A's and C's dimensions once they hold what they ask for.
    q[0].allocated.extended = ext(8000, 4000);
    q[2].allocated.extended = vec![("v100/gpu".into(), 4000)].into();
    q[0].allocated = Resources { extended: q[0].allocated.extended.clone(), ..all(100) };
    q[2].allocated = Resources { extended: q[2].allocated.extended.clone(), ..all(100) };
    assert_eq!(compute("drf", &q, &cluster).order, vec![1]);
}

/// Serve one task at a time to the first queue in the plugin's order whose next task fits.
fn drf_loop(weights: [u32; 2]) -> [u32; 2] {
    let cluster = res(9, 18, 0);
    let task = [res(1, 4, 0), res(3, 1, 0)];
    let mut placed = [0u32; 2];
    let mut plugin = FairSharePolicy::new(r#"{"policy":"drf"}"#).unwrap();
    loop {
        let queues: Vec<QueueState> = (0..2)
            .map(|i| QueueState {
                name: ["A", "B"][i].into(),
                weight: weights[i],
                allocated: res(
                    task[i].cpu_milli * u64::from(placed[i]),
                    task[i].memory_bytes * u64::from(placed[i]),
                    0,
                ),
                request: res(100, 100, 0),
                ..Default::default()
            })
            .collect();
        let used = (0..2).fold(res(0, 0, 0), |acc, i| {
            res(acc.cpu_milli + queues[i].allocated.cpu_milli, acc.memory_bytes + queues[i].allocated.memory_bytes, 0)
        });
        let order = plugin.compute(&queues, &cluster).unwrap().order;
        let next = order.iter().map(|&q| q as usize).find(|&q| {
            used.cpu_milli + task[q].cpu_milli <= cluster.cpu_milli
                && used.memory_bytes + task[q].memory_bytes <= cluster.memory_bytes
        });
        match next {
            Some(q) => placed[q] += 1,
            None => return placed,
        }
    }
}

#[test]
fn d1_classic_drf() {
    assert_eq!(drf_loop([1, 1]), [3, 2]);
}

#[test]
fn d2_weighted_drf_tie_goes_to_the_lower_unweighted_share() {
    assert_eq!(drf_loop([2, 1]), [3, 2]);
}

#[test]
fn drf_orders_subtrees_before_descending() {
    let mut q = [
        queue("busy", None, 1, 0, 0),
        queue("idle", None, 1, 0, 0),
        queue("busy-1", Some(0), 1, 0, 100),
        queue("idle-1", Some(1), 1, 0, 100),
        queue("idle-2", Some(1), 1, 0, 100),
    ];
    q[2].allocated = all(50);
    q[4].allocated = all(10);
    let d = compute("drf", &q, &all(100));
    assert_eq!(d.order, vec![3, 4, 2], "idle subtree first, inside it the emptier leaf");
}

#[test]
fn decayed_usage_favours_queues_that_used_less_per_weight() {
    let mut q = [queue("A", None, 2, 0, 100), queue("B", None, 1, 0, 100), queue("C", None, 1, 0, 100)];
    q[0].decayed_usage = 100.0;
    q[1].decayed_usage = 60.0;
    q[2].decayed_usage = 40.0;
    // Shares 1/2, 1/4, 1/4: usage per share 200, 240, 160.
    assert_eq!(compute("decayed-usage", &q, &all(100)).order, vec![2, 0, 1]);
}

#[test]
fn queues_without_pending_work_are_not_served() {
    let mut q = [queue("A", None, 1, 0, 10), queue("B", None, 1, 0, 10)];
    q[0].allocated = all(10);
    assert_eq!(compute("proportion", &q, &all(100)).order, vec![1]);
}

#[test]
fn d4_and_bad_trees_are_errors() {
    let mut p = FairSharePolicy::default();
    let zero = [queue("zero", None, 0, 0, 0)];
    assert_eq!(p.compute(&zero, &all(1)).unwrap_err(), "queue zero: weight must be positive");
    let cycle = [queue("a", Some(1), 1, 0, 0), queue("b", Some(0), 1, 0, 0)];
    assert!(p.compute(&cycle, &all(1)).unwrap_err().contains("cycle"));
    let dangling = [queue("a", Some(9), 1, 0, 0)];
    assert!(p.compute(&dangling, &all(1)).unwrap_err().contains("parent index 9"));
    let own = [queue("a", Some(0), 1, 0, 0)];
    assert!(p.compute(&own, &all(1)).is_err());
    assert!(FairSharePolicy::new(r#"{"policy":"lottery"}"#).is_err());
}

#[test]
fn extreme_quantities_do_not_overflow() {
    let q = [queue("A", None, u32::MAX, u64::MAX, u64::MAX), queue("B", None, u32::MAX, u64::MAX, u64::MAX)];
    let d = compute("proportion", &q, &all(u64::MAX));
    assert_eq!(d.deserved[0].gpu_milli.checked_add(d.deserved[1].gpu_milli), Some(u64::MAX));
}
