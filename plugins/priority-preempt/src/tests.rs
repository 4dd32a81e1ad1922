//! The digest-001 preemption scenarios (P1–P4) on the plugin alone.

use super::*;

fn gpus(count: u32) -> GpuRequest {
    GpuRequest { count, milli_per_gpu: 1000, ..Default::default() }
}

fn task(id: &str, queue: &str, priority: i32, count: u32) -> Task {
    Task { id: id.into(), queue: queue.into(), priority, gpu: gpus(count), ..Default::default() }
}

fn victim(id: &str, priority: i32, count: u32, running: u64) -> Victim {
    Victim {
        task: task(id, "q", priority, count),
        running_seconds: running,
        group_running: 1,
        group_min_member: 1,
        checkpointable: false,
    }
}

/// A node with `total` GPUs of which `free` are idle.
fn node(total: u32, free: u32) -> Node {
    Node {
        name: "n".into(),
        allocatable: Resources {
            cpu_milli: 64_000,
            memory_bytes: 1 << 40,
            gpu_milli: u64::from(total) * 1000,
            ..Default::default()
        },
        allocated: Resources { gpu_milli: u64::from(total - free) * 1000, ..Default::default() },
        gpus: (0..total)
            .map(|i| GpuDevice { index: i, free_milli: if i < free { 1000 } else { 0 }, ..Default::default() })
            .collect(),
        ..Default::default()
    }
}

fn plugin(config: &str) -> PriorityPreempt {
    PriorityPreempt::new(config).unwrap()
}

fn choose(
    p: &mut PriorityPreempt,
    preemptor: &Task,
    candidates: &[PreemptCandidate],
    nodes: &[Node],
) -> Option<Preemption> {
    let refs: Vec<&Node> = nodes.iter().collect();
    p.select_victims(preemptor, candidates, &refs)
}

const PARAMS: &str = r#"{"min_priority_diff": 100, "min_runtime_seconds": 600, "max_victims": 2}"#;

#[test]
fn p2_lowest_priority_victims_until_the_need_is_met_all_or_nothing() {
    let mut p = plugin(PARAMS);
    let preemptor = task("big", "q", 1000, 16);
    let victims = vec![victim("j3", 300, 8, 3600), victim("j1", 100, 8, 3600), victim("j2", 200, 8, 3600)];
    let c = PreemptCandidate { node: 0, victims };
    let plan = choose(&mut p, &preemptor, std::slice::from_ref(&c), &[node(24, 0)]).unwrap();
    let mut ids: Vec<&str> = plan.victims.iter().map(|&i| c.victims[i as usize].task.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["j1", "j2"]);

    let mut one = plugin(r#"{"min_priority_diff": 100, "min_runtime_seconds": 600, "max_victims": 1}"#);
    assert_eq!(choose(&mut one, &preemptor, std::slice::from_ref(&c), &[node(24, 0)]), None, "no partial eviction");
    let huge = task("huge", "q", 1000, 32);
    assert_eq!(choose(&mut p, &huge, &[c], &[node(24, 0)]), None, "all victims are not enough");
}

#[test]
fn p1_p3_runtime_protection_and_priority_difference() {
    let mut p = plugin(PARAMS);
    let preemptor = task("p", "q", 1000, 8);
    let young = PreemptCandidate { node: 0, victims: vec![victim("young", 0, 8, 599)] };
    assert_eq!(choose(&mut p, &preemptor, &[young], &[node(8, 0)]), None, "under minimum runtime");
    let close = PreemptCandidate { node: 0, victims: vec![victim("v950", 950, 8, 3600)] };
    assert_eq!(choose(&mut p, &preemptor, &[close], &[node(8, 0)]), None, "difference 50 < 100");
    let enough = PreemptCandidate { node: 0, victims: vec![victim("v900", 900, 8, 3600)] };
    assert_eq!(choose(&mut p, &preemptor, &[enough], &[node(8, 0)]).unwrap().victims, [0], "difference = 100");
}

#[test]
fn p4_free_capacity_counts_first_and_unneeded_victims_are_dropped() {
    let mut p = plugin("");
    let preemptor = task("p", "q", 10, 4);
    // 2 GPUs idle; victims: 1 GPU (prio 0), 2 GPUs (prio 1), 1 GPU (prio 2). Cheapest-first takes
    // the 1-GPU prio-0 one, then the 2-GPU one (now 5 ≥ 4), and the first turns out unneeded.
    let c = PreemptCandidate {
        node: 0,
        victims: vec![victim("a", 0, 1, 10), victim("b", 1, 2, 10), victim("c", 2, 1, 10)],
    };
    let plan = choose(&mut p, &preemptor, &[c], &[node(6, 2)]).unwrap();
    assert_eq!(plan.victims, [1], "only the 2-GPU victim is needed");
}

#[test]
fn lowest_priority_then_least_work_lost_then_fewest_victims_across_nodes() {
    let mut p = plugin("");
    let preemptor = task("p", "q", 10, 2);
    let two_low = PreemptCandidate { node: 0, victims: vec![victim("a", 0, 1, 10), victim("b", 0, 1, 10)] };
    let one_higher = PreemptCandidate { node: 1, victims: vec![victim("c", 5, 2, 10)] };
    assert_eq!(
        choose(&mut p, &preemptor, &[one_higher, two_low], &[node(2, 0), node(2, 0)]).unwrap().candidate,
        1,
        "the lowest highest priority first, however many victims"
    );
    // Same priority: two young 1-GPU runs (20 GPU-s) before one 2-GPU run of an hour (7,200).
    let two_young = PreemptCandidate { node: 0, victims: vec![victim("a", 1, 1, 10), victim("b", 1, 1, 10)] };
    let one_old = PreemptCandidate { node: 1, victims: vec![victim("d", 1, 2, 3600)] };
    assert_eq!(
        choose(&mut p, &preemptor, &[one_old, two_young], &[node(2, 0), node(2, 0)]).unwrap().candidate,
        1,
        "same priority: the least GPU-time lost"
    );
    let two_same = PreemptCandidate { node: 0, victims: vec![victim("a", 1, 1, 10), victim("b", 1, 1, 10)] };
    let one_same = PreemptCandidate { node: 1, victims: vec![victim("e", 1, 2, 10)] };
    assert_eq!(
        choose(&mut p, &preemptor, &[two_same, one_same], &[node(2, 0), node(2, 0)]).unwrap().candidate,
        1,
        "same work lost: the fewest victims"
    );
    let mut long = victim("f", 5, 2, 100_000);
    let saved = PreemptCandidate { node: 3, victims: vec![long.clone()] };
    long.checkpointable = true;
    let checkpointed = PreemptCandidate { node: 4, victims: vec![long] };
    assert_eq!(
        choose(&mut p, &preemptor, &[saved, checkpointed], &[node(2, 0), node(2, 0)]).unwrap().candidate,
        1,
        "a checkpointable victim loses no GPU-time"
    );
}

#[test]
fn a_small_job_takes_young_single_runs_before_a_long_running_gang() {
    // The replay case: a 4-GPU job, one node holding a member of a 2 × 8-GPU gang that has run
    // 14 h, another holding four 1-GPU runs of ten minutes. Counting victims first picks the gang
    // (two members beat four runs): it loses 224 GPU-hours instead of 40 GPU-minutes.
    let mut p = plugin("");
    let preemptor = task("p", "q", 0, 4);
    let mut member = victim("g-0", 0, 8, 14 * 3600);
    member.task.group = Some("g".into());
    member.group_running = 2;
    member.group_min_member = 2;
    member.task.queue = "lender".into();
    let gang = PreemptCandidate { node: 0, victims: vec![member] };
    let lent = |i: usize| {
        let mut v = victim(&format!("y{i}"), 0, 1, 600);
        v.task.queue = "lender".into();
        v
    };
    let young = PreemptCandidate { node: 1, victims: (0..4).map(lent).collect() };
    let mut four = node(4, 0);
    four.gpus.update(|g| g.truncate(4));
    let plan = choose(&mut p, &preemptor, &[gang, young], &[node(8, 0), four]).unwrap();
    assert_eq!((plan.candidate, plan.victims.len()), (1, 4));
}

#[test]
fn elastic_surplus_goes_before_anything_else_even_at_equal_priority() {
    let mut p = plugin("");
    let preemptor = task("p", "q", 5, 1);
    let mut spare = victim("elastic-3", 5, 1, 10);
    spare.group_running = 4;
    spare.group_min_member = 2;
    spare.task.group = Some("elastic".into());
    let rigid = PreemptCandidate { node: 0, victims: vec![victim("low", 0, 1, 10)] };
    let elastic = PreemptCandidate { node: 1, victims: vec![spare] };
    assert_eq!(choose(&mut p, &preemptor, &[rigid, elastic], &[node(1, 0), node(1, 0)]).unwrap().candidate, 1);
}

#[test]
fn breaking_a_gang_counts_the_whole_gang() {
    let mut p = plugin("");
    let preemptor = task("p", "q", 10, 1);
    let mut member = victim("g-0", 0, 1, 10);
    member.task.group = Some("g".into());
    member.group_running = 4;
    member.group_min_member = 4;
    let gang = PreemptCandidate { node: 0, victims: vec![member] };
    let two = PreemptCandidate { node: 1, victims: vec![victim("a", 0, 1, 10), victim("b", 0, 1, 10)] };
    let mut n1 = node(2, 0);
    n1.gpus.update(|g| g.truncate(2));
    // Node 1 needs only one of its two victims (10 GPU-s); node 0 would take a 4-member gang
    // down (40 GPU-s).
    assert_eq!(choose(&mut p, &preemptor, &[gang, two], &[node(1, 0), n1]).unwrap().candidate, 1);
}

#[test]
fn other_queues_victims_are_the_hosts_call_and_bad_config_is_refused() {
    let mut p = plugin(r#"{"min_priority_diff": 100}"#);
    let preemptor = task("p", "reclaimer", 0, 1);
    let mut borrowed = victim("b", 50, 1, 10);
    borrowed.task.queue = "lender".into();
    let plan = choose(&mut p, &preemptor, &[PreemptCandidate { node: 0, victims: vec![borrowed] }], &[node(1, 0)]);
    assert_eq!(plan.unwrap().victims, [0], "reclaim ignores priority");
    assert!(PriorityPreempt::new(r#"{"min_priority_diff": 0}"#).unwrap_err().contains("at least 1"));
    assert!(PriorityPreempt::new(r#"{"max_victim": 1}"#).unwrap_err().contains("unknown field"));
}
