//! The cycle scenario by scenario (queues Q6/D3, gangs G1/G2/G8/G9, quotas, preemption P5,
//! reclaim, DRF D1), with the built-in policies linked natively. `tests/all/cycle.rs` runs the same
//! rules with the Wasm components.

use std::sync::Arc;

use wasmsched_api::{DeviceShare, GpuDevice, GpuRequest, Node, Resources, Task};
use wasmsched_plugin_allocation_score::AllocationScore;
use wasmsched_plugin_fair_share::FairSharePolicy;
use wasmsched_plugin_priority_preempt::PriorityPreempt;
use wasmsched_plugin_resource_fit::ResourceFit;

use super::*;
use crate::native::NativePlugin;
use crate::queue::QueueSpec;
use crate::testing::Counting;
use ahash::AHashSet;

fn gpu_node(name: &str, gpus: u32) -> Node {
    Node {
        name: name.into(),
        allocatable: Resources {
            cpu_milli: 64_000,
            memory_bytes: 512 << 30,
            gpu_milli: u64::from(gpus) * 1000,
            extended: Default::default(),
        },
        gpus: (0..gpus).map(|i| GpuDevice { index: i, free_milli: 1000, ..Default::default() }).collect(),
        ..Default::default()
    }
}

fn task(id: &str, gpus: u32) -> Task {
    Task {
        id: id.into(),
        request: Resources { cpu_milli: 1000, memory_bytes: 1 << 30, ..Default::default() },
        gpu: GpuRequest { count: gpus, milli_per_gpu: 1000, ..Default::default() },
        ..Default::default()
    }
}

fn job(name: &str, queue: &str, priority: i32, gpus: u32) -> Workload {
    let mut w = Workload::single(task(name, gpus));
    w.queue = queue.into();
    w.priority = priority;
    w
}

fn gang(name: &str, queue: &str, members: usize, min: usize, gpus: u32) -> Workload {
    let tasks = (0..members).map(|i| task(&format!("{name}-{i}"), gpus)).collect();
    Workload::gang(name, queue, 0, tasks, min)
}

fn unlimited() -> Resources {
    Resources {
        cpu_milli: u64::MAX / 4,
        memory_bytes: u64::MAX / 4,
        gpu_milli: u64::MAX / 4,
        extended: Default::default(),
    }
}

fn queue(name: &str, weight: u32) -> QueueSpec {
    QueueSpec { name: name.into(), parent: None, weight, reclaimable: true, ..Default::default() }
}

fn core(queues: Vec<QueueSpec>, nodes: &[(&str, u32)]) -> SchedulerCore {
    let mut c = SchedulerCore::new(QueueTree::new(queues).unwrap(), CoreConfig::default());
    for (name, gpus) in nodes {
        c.upsert_node(gpu_node(name, *gpus), 0);
    }
    c
}

fn builder() -> crate::policy_set::PolicySetBuilder {
    PolicySet::builder()
        .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
        .score(Arc::new(NativePlugin::<AllocationScore>::new(r#"{"strategy":"most"}"#, 1).unwrap()), 1)
}

/// Filter + bin-packing score, proportion fair share, priority preemption.
fn full() -> PolicySet {
    builder()
        .fair_share(Arc::new(NativePlugin::<FairSharePolicy>::new("", 1).unwrap()))
        .preempt(Arc::new(NativePlugin::<PriorityPreempt>::new("", 1).unwrap()))
        .build()
}

fn bound(decisions: &[Decision]) -> Vec<String> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Bound { task, .. } => Some(task.clone()),
            _ => None,
        })
        .collect()
}

fn evicted(decisions: &[Decision]) -> Vec<String> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Evicted { task, .. } => Some(task.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn priority_preemption_within_a_queue_needs_no_fair_share_stage() {
    // `policy builtin NAME --preempt` makes such a set: filter, score, preempt, no fair share. The
    // victims share the preemptor's queue, so no share is judged; found on a real API server,
    // where every such preemption was chosen and then refused.
    let set = builder().preempt(Arc::new(NativePlugin::<PriorityPreempt>::new("", 1).unwrap())).build();
    let mut c = core(vec![queue("q", 1)], &[("n0", 4), ("n1", 4)]);
    for i in 0..8 {
        c.submit(job(&format!("low-{i}"), "q", 1, 1), 0).unwrap();
    }
    assert_eq!(bound(&c.schedule(&set, 0)).len(), 8);
    c.submit(job("high", "q", 10, 1), 1).unwrap();
    let mut g = gang("gang", "q", 2, 2, 1);
    g.priority = 10;
    c.submit(g, 1).unwrap();
    let d = c.schedule(&set, 1);
    assert_eq!(evicted(&d).len(), 3, "one victim for the pod, two for the gang: {d:?}");
    let mut placed = bound(&d);
    placed.sort();
    assert_eq!(placed, ["gang-0", "gang-1", "high"]);
    // Another queue's work is not taken without shares to judge the reclaim by.
    let mut other = core(vec![queue("q", 1), queue("r", 1)], &[("n0", 1)]);
    other.submit(job("low", "r", 1, 1), 0).unwrap();
    assert_eq!(bound(&other.schedule(&set, 0)), ["low"]);
    other.submit(job("high", "q", 10, 1), 1).unwrap();
    assert!(evicted(&other.schedule(&set, 1)).is_empty());
}

#[test]
fn q6_priority_then_fifo_within_a_queue() {
    let mut c = core(vec![queue("q", 1)], &[("n", 8)]);
    for (name, p) in [("j1", 5), ("j2", 10), ("j3", 5)] {
        c.submit(job(name, "q", p, 8), 0).unwrap();
    }
    let mut order = Vec::new();
    for t in 0..3 {
        let d = c.schedule(&full(), t * 100);
        let b = bound(&d);
        assert_eq!(b.len(), 1, "one 8-GPU node runs one job at a time: {d:?}");
        c.finish(&b[0]).unwrap();
        order.extend(b);
    }
    assert_eq!(order, ["j2", "j1", "j3"]);
}

#[test]
fn d3_no_head_of_line_blocking_and_a_task_larger_than_any_node_is_not_retried_by_polling() {
    let mut c = core(vec![queue("a", 1), queue("b", 1)], &[("n0", 8), ("n1", 8)]);
    c.submit(job("huge", "a", 10, 100), 0).unwrap();
    c.submit(job("small-a", "a", 0, 1), 0).unwrap();
    c.submit(job("small-b", "b", 0, 1), 0).unwrap();
    let d = c.schedule(&full(), 0);
    let mut b = bound(&d);
    b.sort();
    assert_eq!(b, ["small-a", "small-b"]);
    let why = c.explain("huge").unwrap().to_string();
    assert!(why.contains("0/2 nodes available; 2 nodes: insufficient free GPUs (resource-fit)"), "{why}");
    assert_eq!(c.status("huge").unwrap().phase, Phase::Pending);
    // Parked: later cycles without a cluster change do not try it again.
    for t in 1..50 {
        let d = c.schedule(&full(), t);
        assert!(d.is_empty(), "no retry without a cluster change: {d:?}");
    }
    assert_eq!(c.explain("huge").unwrap().attempts, 1);
    // A node added wakes it up; it is tried (and fails) again.
    c.upsert_node(gpu_node("n2", 8), 60);
    let d = c.schedule(&full(), 60);
    assert!(matches!(&d[..], [Decision::Unschedulable { workload, .. }] if workload == "huge"), "{d:?}");
    assert_eq!(c.explain("huge").unwrap().attempts, 2);
}

#[test]
fn back_off_doubles_to_its_cap() {
    let mut c = core(vec![queue("q", 1)], &[("n", 1)]);
    c.submit(job("big", "q", 0, 2), 0).unwrap();
    let mut waits = Vec::new();
    let mut now = 0;
    for _ in 0..6 {
        c.schedule(&full(), now);
        let retry = c.explain("big").unwrap().retry_at.unwrap();
        waits.push(retry - now);
        c.upsert_node(gpu_node("n", 1), retry); // a cluster change un-parks it
        assert_eq!(c.next_wakeup(), Some(retry));
        now = retry;
    }
    assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
}

#[test]
fn capability_caps_a_queue_and_frees_with_completions() {
    let mut capped = queue("capped", 1);
    capped.capability = Some(Resources { gpu_milli: 8000, ..unlimited() });
    let mut c = core(vec![capped], &[("n0", 8), ("n1", 8)]);
    c.submit(job("first", "capped", 0, 8), 0).unwrap();
    c.submit(job("second", "capped", 0, 8), 0).unwrap();
    let d = c.schedule(&full(), 0);
    assert_eq!(bound(&d), ["first"]);
    let why = c.explain("second").unwrap().to_string();
    assert!(why.starts_with("queue capped at capability: 0 of the 1 required members fit its quota"), "{why}");
    assert!(why.contains("no lower-priority work in its own queue"), "{why}");
    c.finish("first").unwrap();
    assert_eq!(bound(&c.schedule(&full(), 5)), ["second"]);
    assert_eq!(c.queue_shares()[0].allocated.gpu_milli, 8000);
}

#[test]
fn a_placed_task_charged_more_holds_it_on_its_node_and_queue_within_the_limits_and_releases_it() {
    // DRA devices beyond what was counted ahead (an `All` request): charged after placement.
    let class: wasmsched_api::ResourceName = "deviceclass.resource.kubernetes.io/gpu".into();
    let extended = |n: u64| -> wasmsched_api::Extended { vec![(class, n)].into() };
    let mut capped = queue("capped", 1);
    capped.capability = Some(Resources { extended: extended(6), ..unlimited() });
    let mut c = core(vec![capped], &[]);
    let mut node = gpu_node("n0", 0);
    node.allocatable.extended = extended(8);
    c.upsert_node(node, 0);
    let mut w = job("claims", "capped", 0, 0);
    w.members[0].request.extended = extended(2);
    c.submit(w, 0).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 0)), ["claims"]);
    let held = |c: &SchedulerCore| {
        let node = c.nodes().get(c.nodes().slot_of("n0").unwrap()).unwrap().allocated.extended(&class);
        (node, c.queue_shares()[0].allocated.extended(&class))
    };
    assert_eq!(held(&c), (2, 2));
    c.charge_more("claims", &[(class, 3)]).unwrap();
    assert_eq!(held(&c), (5, 5));
    // Past the queue's capability: refused, nothing changed.
    let refused = c.charge_more("claims", &[(class, 2)]).unwrap_err();
    assert!(matches!(&refused, CoreError::OverLimit { queue, .. } if queue == "capped"), "{refused}");
    assert_eq!(held(&c), (5, 5));
    assert!(matches!(c.charge_more("nobody", &[(class, 1)]), Err(CoreError::UnknownTask(_))));
    // Released with the task.
    c.finish("claims").unwrap();
    assert_eq!(held(&c), (0, 0));
    // Only a placed task can be charged.
    let mut waiting = job("waiting", "capped", 0, 0);
    waiting.members[0].request.extended = extended(7);
    c.submit(waiting, 0).unwrap();
    assert!(matches!(c.charge_more("waiting", &[(class, 1)]), Err(CoreError::NotPlaced(_))));
}

#[test]
fn g1_g2_gang_all_or_nothing_then_timeout() {
    let mut c = core(vec![queue("q", 1)], &[("n0", 8), ("n1", 8), ("n2", 8)]);
    c.submit(gang("volcano", "q", 4, 4, 8), 0).unwrap();
    let d = c.schedule(&full(), 0);
    assert!(bound(&d).is_empty());
    assert_eq!(c.nodes().get(0).unwrap().allocated.gpu_milli, 0, "nothing stays bound");
    let why = c.explain("volcano").unwrap().to_string();
    assert!(why.starts_with("gang: 3 of 4 required members fit"), "{why}");
    // G2: one more node and all four go in one cycle.
    c.upsert_node(gpu_node("n3", 8), 5);
    let d = c.schedule(&full(), 5);
    assert_eq!(bound(&d).len(), 4);
    assert_eq!(c.status("volcano").unwrap().phase, Phase::Running);

    // G1: with only 3 nodes, the gang times out after the default 10 minutes.
    let mut c = core(vec![queue("q", 1)], &[("n0", 8), ("n1", 8), ("n2", 8)]);
    c.submit(gang("g", "q", 4, 4, 8), 0).unwrap();
    c.schedule(&full(), 0);
    assert_eq!(c.next_wakeup(), Some(600), "parked: only a cluster change or the timeout wakes it");
    assert!(c.schedule(&full(), 599).iter().all(|d| !matches!(d, Decision::TimedOut { .. })));
    let d = c.schedule(&full(), 600);
    assert!(d.contains(&Decision::TimedOut { workload: "g".into() }), "{d:?}");
    assert_eq!(c.status("g").unwrap().phase, Phase::TimedOut);
    assert!(c.schedule(&full(), 10_000).is_empty(), "a timed-out gang leaves the pending set");

    // G8: an explicit timeout is honoured.
    let mut short = gang("short", "q", 4, 4, 8);
    short.timeout_seconds = Some(30);
    c.submit(short, 700).unwrap();
    c.schedule(&full(), 700);
    assert!(c.schedule(&full(), 730).contains(&Decision::TimedOut { workload: "short".into() }));
}

#[test]
fn queue_positions_follow_the_order_a_queue_is_tried_in() {
    let leaf = |name: &str| QueueSpec { parent: Some("root".into()), ..queue(name, 1) };
    let mut c = core(vec![queue("root", 1), leaf("a"), leaf("b")], &[("n", 8)]);
    // Nothing asks for more than the node: `fits` runs, the rest wait for 16 GPUs each.
    c.submit(job("fits", "a", 0, 8), 0).unwrap();
    c.submit(job("early", "a", 0, 16), 1).unwrap();
    c.submit(job("urgent", "a", 5, 16), 2).unwrap();
    c.submit(job("late", "a", 0, 16), 3).unwrap();
    c.submit(job("other", "b", 0, 16), 4).unwrap();
    c.schedule(&full(), 10);
    let places = c.queue_positions();
    assert_eq!(places.get("fits"), None, "running: no place");
    assert_eq!(
        [places["urgent"], places["early"], places["late"], places["other"]],
        [1, 2, 3, 1],
        "priority first, then submission, per queue"
    );
    assert_eq!(c.status("late").unwrap().since, 3);
    // Fair share serves the leaves: b, holding nothing, before a, holding the node.
    let served: Vec<(String, Option<usize>)> = c.queue_shares().into_iter().map(|s| (s.name, s.served)).collect();
    assert_eq!(served, [("root".into(), None), ("a".into(), Some(2)), ("b".into(), Some(1))]);
    c.finish("urgent").unwrap();
    assert_eq!((c.queue_positions()["early"], c.queue_positions()["late"]), (1, 2));
}

#[test]
fn g8_duplicates_and_bad_workloads_are_refused_and_change_nothing() {
    let mut c =
        core(vec![queue("root", 1), QueueSpec { parent: Some("root".into()), ..queue("leaf", 1) }], &[("n", 8)]);
    c.submit(gang("g", "leaf", 2, 2, 1), 0).unwrap();
    assert_eq!(c.submit(gang("g", "leaf", 2, 2, 1), 0), Err(WorkloadError::Duplicate("g".into())));
    let err = c.submit(job("g-0", "leaf", 0, 1), 0).unwrap_err();
    assert_eq!(err.to_string(), "workload g-0: task g-0 already belongs to workload g");
    assert!(matches!(c.submit(job("x", "nope", 0, 1), 0), Err(WorkloadError::UnknownQueue { .. })));
    assert!(c.submit(job("x", "root", 0, 1), 0).unwrap_err().to_string().contains("leaf queues"));
    assert!(c.submit(gang("m", "leaf", 2, 3, 1), 0).unwrap_err().to_string().contains("min-member 3"));
    let mut odd = job("odd", "leaf", 0, 2);
    odd.members[0].gpu.milli_per_gpu = 500;
    assert!(c.submit(odd, 0).unwrap_err().to_string().contains("one shared GPU"));
    let mut overflow = gang("o", "leaf", 2, 2, 1);
    for m in &mut overflow.members {
        m.request.cpu_milli = u64::MAX / 2 + 1;
    }
    assert!(c.submit(overflow, 0).unwrap_err().to_string().contains("overflow"));
    assert_eq!(c.workloads_in(Phase::Pending), ["g"], "refused workloads leave no trace");
    assert_eq!(c.finish("nope"), Err(CoreError::UnknownWorkload("nope".into())));
    assert_eq!(c.checkpoint_done("g-0", 0), Err(CoreError::NotLeaving("g-0".into())));
}

#[test]
fn g9_elastic_admitted_at_min_grown_into_idle_capacity_and_shrunk_first() {
    let mut c = core(vec![queue("a", 1), queue("b", 1)], &[("n0", 2), ("n1", 1)]);
    // Only 1 GPU free at first: the elastic job (min 2) waits, then runs at 2 and grows to 3.
    c.submit(job("blocker", "b", 0, 2), 0).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 0)), ["blocker"]);
    c.submit(gang("elastic", "a", 4, 2, 1), 1).unwrap();
    let d = c.schedule(&full(), 1);
    assert!(bound(&d).is_empty(), "1 GPU free < min 2: {d:?}");
    c.finish("blocker").unwrap();
    let d = c.schedule(&full(), 2);
    assert_eq!(bound(&d).len(), 3, "min 2 admitted, grown to 3 (no 4th GPU): {d:?}");
    assert_eq!(c.status("elastic").unwrap().running, 3);
    // A rigid job at equal priority in another queue needing 1 GPU: the surplus member yields.
    c.submit(job("rigid", "b", 0, 1), 3).unwrap();
    let d = c.schedule(&full(), 3);
    assert_eq!(evicted(&d).len(), 1, "{d:?}");
    assert_eq!(bound(&d), ["rigid"]);
    assert_eq!(c.status("elastic").unwrap().running, 2, "shrunk to min, still running");
    assert_eq!(c.status("elastic").unwrap().phase, Phase::Running);
    // Capacity comes back: it grows again.
    c.finish("rigid").unwrap();
    assert_eq!(bound(&c.schedule(&full(), 4)).len(), 1);
    assert_eq!(c.status("elastic").unwrap().running, 3);
}

#[test]
fn within_a_queue_strictly_lower_priority_is_preempted_and_never_equal() {
    let mut c = core(vec![queue("q", 1)], &[("n", 8)]);
    c.submit(job("low", "q", 0, 8), 0).unwrap();
    c.schedule(&full(), 0);
    c.submit(job("peer", "q", 0, 8), 1).unwrap();
    let d = c.schedule(&full(), 1);
    assert!(evicted(&d).is_empty(), "equal priority never preempts: {d:?}");
    let mut polite = job("polite", "q", 5, 8);
    polite.preemption = PreemptionPolicy::Never;
    c.submit(polite, 2).unwrap();
    let d = c.schedule(&full(), 2);
    assert!(evicted(&d).is_empty());
    assert!(c.explain("polite").unwrap().to_string().contains("preemption policy Never"));
    c.submit(job("high", "q", 10, 8), 3).unwrap();
    let d = c.schedule(&full(), 3);
    assert_eq!(evicted(&d), ["low"]);
    assert_eq!(bound(&d), ["high"]);
    assert!(d.iter().any(|x| matches!(x, Decision::Evicted { reason: EvictReason::Preempted { preemptor, kind: PreemptKind::Priority, checkpointed: false }, .. } if preemptor == "high")));
    assert_eq!(c.status("low").unwrap().phase, Phase::Pending, "the victim goes back to its queue");
}

#[test]
fn a_workload_withdrawn_as_victim_is_not_preempted_until_it_is_offered_again() {
    let mut c = core(vec![queue("q", 1)], &[("n0", 8), ("n1", 8)]);
    c.submit(job("guarded", "q", 0, 8), 0).unwrap();
    c.submit(job("plain", "q", 1, 8), 0).unwrap();
    c.schedule(&full(), 0);
    c.set_preemptible("guarded", false).unwrap();
    c.set_preemptible("plain", false).unwrap();
    c.submit(job("high", "q", 10, 8), 1).unwrap();
    let d = c.schedule(&full(), 1);
    assert!(evicted(&d).is_empty(), "{d:?}");
    assert!(c.explain("high").unwrap().to_string().contains("no running task may be evicted"));
    // Offered again: the lower-priority one goes (high was parked; offering un-parks it).
    c.set_preemptible("guarded", true).unwrap();
    let d = c.schedule(&full(), 20);
    assert_eq!((evicted(&d), bound(&d)), (vec!["guarded".to_string()], vec!["high".to_string()]));
    assert!(matches!(c.set_preemptible("nobody", true), Err(CoreError::UnknownWorkload(_))));
}

/// Four 8-GPU nodes in two racks: n0, n1 in r0; n2, n3 in r1.
fn racked() -> SchedulerCore {
    let mut c = core(vec![queue("q", 1)], &[]);
    for (name, rack) in [("n0", "r0"), ("n1", "r0"), ("n2", "r1"), ("n3", "r1")] {
        let mut n = gpu_node(name, 8);
        n.labels = vec![("rack".into(), rack.into()), ("host".into(), name.into())];
        c.upsert_node(n, 0);
    }
    c
}

fn strict_gang(name: &str, priority: i32) -> Workload {
    let mut g = gang(name, "q", 2, 2, 8);
    g.priority = priority;
    g.topology = Some(crate::TopologyConstraint::single("rack", true));
    g
}

#[test]
fn an_elastic_gang_grows_inside_its_domain_and_a_required_one_never_leaves_it() {
    let racks_of = |c: &SchedulerCore| -> Vec<String> {
        let mut r: Vec<String> = (0..3)
            .filter_map(|i| c.placement_of(&format!("e-{i}")))
            .map(|node| c.nodes().get(c.nodes().slot_of(node).unwrap()).unwrap().label("rack").unwrap().to_string())
            .collect();
        r.sort();
        r
    };
    for strict in [true, false] {
        // n0 (rack r0) is busy; the elastic gang (3 × 8 GPUs, min 1) starts in the tightest rack
        // with room, r0 (n1), while r1 has two free nodes.
        let mut c = racked();
        let mut blocker = job("blocker", "q", 0, 8);
        blocker.members[0].node_selector = vec![("host".into(), "n0".into())];
        c.submit(blocker, 0).unwrap();
        c.schedule(&full(), 0);
        let mut e = gang("e", "q", 3, 1, 8);
        e.topology = Some(crate::TopologyConstraint::single("rack", strict));
        c.submit(e, 1).unwrap();
        c.schedule(&full(), 1);
        c.schedule(&full(), 2);
        if strict {
            assert_eq!(racks_of(&c), ["r0"], "required: it never grows out of its rack");
            // Room in its rack again: it grows there.
            c.finish("blocker").unwrap();
            c.schedule(&full(), 3);
            assert_eq!(racks_of(&c), ["r0", "r0"]);
        } else {
            assert_eq!(racks_of(&c), ["r0", "r1", "r1"], "preferred: its rack is full, so it grows elsewhere");
        }
    }
}

#[test]
fn a_preferred_gang_waits_its_wait_for_one_domain_then_falls_back_and_never_waits_for_a_domain_too_small() {
    let racks_of = |c: &SchedulerCore, name: &str| -> Vec<String> {
        let mut r: Vec<String> = (0..2)
            .filter_map(|i| c.placement_of(&format!("{name}-{i}")))
            .map(|node| c.nodes().get(c.nodes().slot_of(node).unwrap()).unwrap().label("rack").unwrap().to_string())
            .collect();
        r.sort();
        r
    };
    // n0 (r0) and n2 (r1) busy: one free node per rack, so no rack holds the 2 × 8-GPU gang.
    let setup = |wait: u64| {
        let mut c = racked();
        for host in ["n0", "n2"] {
            let mut b = job(&format!("busy-{host}"), "q", 0, 8);
            b.members[0].node_selector = vec![("host".into(), host.into())];
            c.submit(b, 0).unwrap();
        }
        c.schedule(&full(), 0);
        let mut g = gang("g", "q", 2, 2, 8);
        g.topology =
            Some(crate::TopologyConstraint { wait_seconds: wait, ..crate::TopologyConstraint::single("rack", false) });
        c.submit(g, 10).unwrap();
        c
    };
    let mut at_once = setup(0);
    at_once.schedule(&full(), 10);
    assert_eq!(racks_of(&at_once, "g"), ["r0", "r1"], "no wait: split across racks at once");

    let mut c = setup(300);
    c.schedule(&full(), 10);
    assert!(racks_of(&c, "g").is_empty(), "it waits for one rack");
    // A rack frees up within the wait: the gang gets it whole.
    c.finish("busy-n2").unwrap();
    c.schedule(&full(), 100);
    assert_eq!(racks_of(&c, "g"), ["r1", "r1"]);

    // Nothing frees up: it is tried again when the wait ends (parked, with no cluster change)
    // and falls back then.
    let mut c = setup(300);
    c.schedule(&full(), 10);
    assert!(c.next_wakeup().is_some_and(|t| t <= 310), "woken by the wait's end: {:?}", c.next_wakeup());
    c.schedule(&full(), 200);
    assert!(racks_of(&c, "g").is_empty());
    c.schedule(&full(), 310);
    assert_eq!(racks_of(&c, "g"), ["r0", "r1"], "after its wait it falls back");

    // No rack could ever hold a 3 × 8-GPU gang (racks of two 8-GPU nodes): it does not wait.
    let mut c = racked();
    let mut big = gang("big", "q", 3, 3, 8);
    big.topology =
        Some(crate::TopologyConstraint { wait_seconds: 300, ..crate::TopologyConstraint::single("rack", false) });
    c.submit(big, 0).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 3, "placed across racks at once");
}

#[test]
fn a_replaced_member_joins_its_gang_s_domain_where_a_packer_would_put_it_elsewhere() {
    let rack = |c: &SchedulerCore, task: &str| {
        let node = c.placement_of(task).unwrap();
        c.nodes().get(c.nodes().slot_of(node).unwrap()).unwrap().label("rack").unwrap().to_string()
    };
    for with_topology in [true, false] {
        let mut c = racked();
        // x fills half of n2 (r1), y a quarter of n0 (r0): r1 is the tighter rack.
        for (name, host, gpus) in [("x", "n2", 4), ("y", "n0", 2)] {
            let mut j = job(name, "q", 0, gpus);
            j.members[0].node_selector = vec![("host".into(), host.into())];
            c.submit(j, 0).unwrap();
        }
        c.schedule(&full(), 0);
        let mut g = gang("g", "q", 2, 2, 4);
        if with_topology {
            g.topology = Some(crate::TopologyConstraint::single("rack", false));
        }
        c.submit(g, 1).unwrap();
        c.schedule(&full(), 1);
        if with_topology {
            assert_eq!((rack(&c, "g-0"), rack(&c, "g-1")), ("r1".to_string(), "r1".to_string()));
        }
        // g-1's pod is replaced: the new member goes where g-0 is, not to n0 (the most allocated
        // node with room, a packer's choice).
        c.remove_task("g-1").unwrap();
        c.add_members("g", vec![task("g-2", 4)]).unwrap();
        c.schedule(&full(), 2);
        let expected = if with_topology { "r1" } else { "r0" };
        assert_eq!(rack(&c, "g-2"), expected, "with its gang's topology: {with_topology}");
    }
}

#[test]
fn an_elastic_gang_grows_a_slice_inside_the_domain_its_slice_started_in() {
    let racks_of = |c: &SchedulerCore| -> Vec<Option<String>> {
        (0..4)
            .map(|i| {
                let node = c.placement_of(&format!("e-{i}"))?;
                Some(c.nodes().get(c.nodes().slot_of(node).unwrap()).unwrap().label("rack").unwrap().to_string())
            })
            .collect()
    };
    for sliced in [true, false] {
        // One 8-GPU node per rack: a0 held by x, c0 half held by y.
        let mut c = core(vec![queue("q", 1)], &[]);
        for (name, rack) in [("a0", "r0"), ("b0", "r1"), ("c0", "r2")] {
            let mut n = gpu_node(name, 8);
            n.labels = vec![("rack".into(), rack.into()), ("host".into(), name.into())];
            c.upsert_node(n, 0);
        }
        for (name, host, gpus) in [("x", "a0", 8), ("y", "c0", 4)] {
            let mut j = job(name, "q", 0, gpus);
            j.members[0].node_selector = vec![("host".into(), host.into())];
            c.submit(j, 0).unwrap();
        }
        c.schedule(&full(), 0);
        // Four 4-GPU members in slices of two, at least two: the first slice fills b0.
        let mut e = gang("e", "q", 4, 2, 4);
        if sliced {
            e.topology = Some(crate::TopologyConstraint {
                slices: Some(crate::Slices { size: 2, level: "rack".into() }),
                ..Default::default()
            });
        }
        c.submit(e, 1).unwrap();
        c.schedule(&full(), 1);
        if sliced {
            assert_eq!(racks_of(&c)[..2], [Some("r1".to_string()), Some("r1".to_string())]);
        }
        // x ends: e grows. Its third member takes c0's free half (the packer's choice); the fourth
        // would fit only on a0, in another rack than its slice's first member.
        c.finish("x").unwrap();
        c.schedule(&full(), 2);
        let racks = racks_of(&c);
        if sliced {
            assert_eq!(racks[2..], [Some("r2".to_string()), None], "the slice waits whole in r2: {racks:?}");
        } else {
            assert_eq!(racks.iter().filter(|r| r.is_some()).count(), 4, "without slices it fills a0: {racks:?}");
        }
    }
}

#[test]
fn a_strict_topology_gang_preempts_inside_one_domain_or_not_at_all() {
    // Every node runs one low job; the gang evicts two of them in one rack.
    let mut c = racked();
    for i in 0..4 {
        c.submit(job(&format!("low{i}"), "q", 0, 8), 0).unwrap();
    }
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 4);
    c.submit(strict_gang("train", 10), 1).unwrap();
    let d = c.schedule(&full(), 1);
    assert_eq!(evicted(&d).len(), 2, "{d:?}");
    let racks: Vec<String> = ["train-0", "train-1"]
        .iter()
        .map(|t| {
            let node = c.placement_of(t).unwrap();
            c.nodes().get(c.nodes().slot_of(node).unwrap()).unwrap().label("rack").unwrap().to_string()
        })
        .collect();
    assert_eq!(racks[0], racks[1], "both members in one rack");

    // Only one evictable job per rack: no rack can be freed, so nothing is evicted (a gang without
    // the constraint would take one node in each rack).
    let mut c = racked();
    for (i, p) in [0, 20, 0, 20].into_iter().enumerate() {
        let mut j = job(&format!("j{i}"), "q", p, 8);
        j.members[0].node_selector = vec![("host".into(), format!("n{i}"))];
        c.submit(j, 0).unwrap();
    }
    c.schedule(&full(), 0);
    c.submit(strict_gang("train", 10), 1).unwrap();
    let d = c.schedule(&full(), 1);
    assert!(evicted(&d).is_empty(), "{d:?}");
    let mut loose = gang("loose", "q", 2, 2, 8);
    loose.priority = 10;
    c.submit(loose, 2).unwrap();
    let d = c.schedule(&full(), 2);
    assert_eq!(evicted(&d).len(), 2, "without the constraint one node per rack is freed: {d:?}");
}

#[test]
fn p5_checkpointing_victims_get_their_grace_period() {
    let mut c = core(vec![queue("q", 1)], &[("n0", 8), ("n1", 8)]);
    for name in ["saves", "silent"] {
        let mut w = job(name, "q", 0, 8);
        w.checkpointable = true;
        c.submit(w, 0).unwrap();
    }
    c.schedule(&full(), 0);
    let mut urgent = gang("urgent", "q", 2, 2, 8);
    urgent.priority = 10;
    c.submit(urgent, 100).unwrap();
    let d = c.schedule(&full(), 100);
    let asked: Vec<_> = d
        .iter()
        .filter_map(|x| match x {
            Decision::PreemptionRequested { task, deadline, .. } => Some((task.clone(), *deadline)),
            _ => None,
        })
        .collect();
    assert_eq!(asked.len(), 2, "both victims asked in parallel: {d:?}");
    assert!(asked.iter().all(|(_, dl)| *dl == 130), "default grace 30 s");
    assert_eq!(c.status("urgent").unwrap().phase, Phase::Preempting);
    assert!(bound(&d).is_empty(), "the preemptor waits for its victims");
    assert_eq!(c.next_wakeup(), Some(130));
    // One checkpoints at +5 s: evicted at once; the other is evicted at the deadline.
    let d = c.checkpoint_done("saves", 105).unwrap();
    assert!(matches!(&d[..], [Decision::Evicted { reason: EvictReason::Preempted { checkpointed: true, .. }, .. }]));
    assert!(bound(&c.schedule(&full(), 105)).is_empty(), "still waiting for the silent one");
    let d = c.schedule(&full(), 130);
    assert_eq!(evicted(&d), ["silent"]);
    assert_eq!(bound(&d).len(), 2, "nominated preemptor goes first once its victims left: {d:?}");
}

fn gpus(n: u64) -> Resources {
    Resources { gpu_milli: n * 1000, ..unlimited() }
}

#[test]
fn q3_q5_admission_limits_refuse_at_submission_and_count_running_work() {
    let mut q = queue("q", 1);
    q.admission = crate::Admission { max_jobs: Some(2), max_gpus_per_job: Some(16), priority_range: Some((100, 1000)) };
    let mut c = core(vec![q], &[("n", 8)]);
    let refused = |r: Result<(), WorkloadError>| match r {
        Err(WorkloadError::Refused { reason, .. }) => reason,
        other => panic!("not refused: {other:?}"),
    };
    // Q3: 8 GPUs per replica × 2 replicas = 16 is admitted; × 3 = 24 is not.
    let mut g = gang("fits", "q", 2, 1, 8);
    g.priority = 100;
    c.submit(g, 0).unwrap();
    let mut g = gang("big", "q", 3, 1, 8);
    g.priority = 100;
    assert_eq!(refused(c.submit(g, 0)), "job GPU request 24 exceeds limit 16");
    // Q4: the range is inclusive.
    assert_eq!(refused(c.submit(job("low", "q", 99, 1), 0)), "job priority 99 out of allowed range [100, 1000]");
    assert_eq!(refused(c.submit(job("high", "q", 1001, 1), 0)), "job priority 1001 out of allowed range [100, 1000]");
    c.submit(job("top", "q", 1000, 16), 0).unwrap(); // larger than the node: stays pending
    // Q5: one running and one pending fill the limit of 2.
    c.schedule(&full(), 0);
    assert_eq!(c.status("fits").unwrap().phase, Phase::Running);
    assert_eq!(c.status("top").unwrap().phase, Phase::Pending);
    let e = c.submit(job("third", "q", 100, 1), 1).unwrap_err();
    assert_eq!(e.to_string(), "workload third: refused by queue q: queue job limit reached: 2");
    assert!(c.status("third").is_none(), "a refused workload leaves no trace");
    c.finish("fits").unwrap();
    c.submit(job("third", "q", 100, 1), 2).unwrap();
    // A bad range is refused with the tree.
    let mut bad = queue("bad", 1);
    bad.admission.priority_range = Some((5, 1));
    assert!(matches!(QueueTree::new([bad]), Err(crate::QueueError::EmptyPriorityRange(_))));
}

#[test]
fn borrowing_limit_bounds_what_a_queue_takes_above_its_guarantee() {
    // a is guaranteed 8 GPUs and may borrow 8 more: 16 of the idle 32, not all of them.
    let mut a = queue("a", 1);
    a.guarantee = Resources { gpu_milli: 8000, ..Default::default() };
    a.borrowing_limit = Some(gpus(8));
    let nodes = [("n0", 8), ("n1", 8), ("n2", 8), ("n3", 8)];
    let mut c = core(vec![a.clone(), queue("b", 1)], &nodes);
    for i in 0..4 {
        c.submit(job(&format!("a{i}"), "a", 0, 8), 0).unwrap();
    }
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 2);
    let why = c.explain("a2").unwrap().to_string();
    assert!(why.starts_with("queue a at borrowing limit: 0 of the 1 required members fit its quota"), "{why}");
    // A capability tighter than guarantee + borrowing limit is the one that binds.
    a.capability = Some(gpus(8));
    let mut c = core(vec![a, queue("b", 1)], &nodes);
    for i in 0..4 {
        c.submit(job(&format!("a{i}"), "a", 0, 8), 0).unwrap();
    }
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 1);
    assert!(c.explain("a1").unwrap().to_string().starts_with("queue a at capability"));
}

#[test]
fn lending_limit_keeps_part_of_an_idle_guarantee_for_its_owner() {
    // The lender is guaranteed 16 of 32 GPUs and lends at most 8 of them: 8 stay free for it.
    let lender = |lending: Option<Resources>| {
        let mut q = queue("lender", 1);
        q.guarantee = Resources { gpu_milli: 16_000, ..Default::default() };
        q.lending_limit = lending;
        q
    };
    let nodes = [("n0", 8), ("n1", 8), ("n2", 8), ("n3", 8)];
    let run = |lending: Option<Resources>| {
        let mut c = core(vec![lender(lending), queue("borrower", 1)], &nodes);
        for i in 0..4 {
            c.submit(job(&format!("b{i}"), "borrower", 0, 8), 0).unwrap();
        }
        let n = bound(&c.schedule(&full(), 0)).len();
        (c, n)
    };
    assert_eq!(run(None).1, 4, "without a lending limit the whole idle guarantee is lent");
    let (mut c, n) = run(Some(gpus(8)));
    assert_eq!(n, 3);
    let why = c.explain("b3").unwrap().to_string();
    assert!(why.contains("lending limit"), "{why}");
    // The owner gets its reserve at once, without preempting anyone.
    c.submit(job("l0", "lender", 0, 8), 1).unwrap();
    let d = c.schedule(&full(), 1);
    assert_eq!((bound(&d), evicted(&d).len()), (vec!["l0".to_string()], 0), "{d:?}");
    // Once the owner uses its reserve, nothing is kept back any more: a finished borrower job
    // frees room the waiting one may take.
    c.finish("b0").unwrap();
    assert_eq!(bound(&c.schedule(&full(), 2)), ["b3"]);
}

#[test]
fn reserves_their_owner_does_not_ask_for_are_not_shared_out() {
    // lender keeps 8 of its 16 guaranteed GPUs and asks for nothing: a and b share the other 24.
    let mut lender = queue("lender", 1);
    lender.guarantee = Resources { gpu_milli: 16_000, ..Default::default() };
    lender.lending_limit = Some(gpus(8));
    let nodes = [("n0", 8), ("n1", 8), ("n2", 8), ("n3", 8)];
    let mut c = core(vec![lender, queue("a", 1), queue("b", 1)], &nodes);
    for i in 0..4 {
        c.submit(job(&format!("a{i}"), "a", 0, 8), 0).unwrap();
        c.submit(job(&format!("b{i}"), "b", 0, 8), 0).unwrap();
    }
    c.schedule(&full(), 0);
    let deserved = |c: &SchedulerCore, name: &str| {
        c.queue_shares().into_iter().find(|q| q.name == name).unwrap().deserved.unwrap().gpu_milli
    };
    assert_eq!((deserved(&c, "a"), deserved(&c, "b")), (12_000, 12_000));
    // Once lender asks for its reserve, it is its deserved share, and the others' shrink.
    c.submit(job("l0", "lender", 0, 8), 1).unwrap();
    c.schedule(&full(), 1);
    assert_eq!(deserved(&c, "lender"), 8_000);
    assert_eq!(deserved(&c, "a") + deserved(&c, "b"), 24_000);
}

#[test]
fn a_reserve_bounds_borrowing_never_another_queue_s_guarantee() {
    // lender keeps all 16 of its guarantee; owner is guaranteed 8; borrower has no guarantee.
    let mut lender = queue("lender", 1);
    lender.guarantee = Resources { gpu_milli: 16_000, ..Default::default() };
    lender.lending_limit = Some(Resources { gpu_milli: 0, ..unlimited() });
    let mut owner = queue("owner", 1);
    owner.guarantee = Resources { gpu_milli: 8000, ..Default::default() };
    let nodes = [("n0", 8), ("n1", 8), ("n2", 8), ("n3", 8)];
    let mut c = core(vec![lender, owner, queue("borrower", 1)], &nodes);
    for i in 0..3 {
        c.submit(job(&format!("b{i}"), "borrower", 0, 8), 0).unwrap();
    }
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 2, "32 GPUs minus the 16 kept back");
    // owner's job is within its own guarantee: it borrows nothing, the reserve does not apply.
    c.submit(job("o0", "owner", 0, 8), 1).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 1)), ["o0"]);
    // Beyond its guarantee owner borrows, and then the reserve does apply.
    c.submit(job("o1", "owner", 0, 8), 2).unwrap();
    assert!(bound(&c.schedule(&full(), 2)).is_empty());
    assert!(c.explain("o1").unwrap().to_string().contains("lending limit"));
}

#[test]
fn a_queue_at_its_limit_preempts_its_own_lower_priority_work_though_nodes_have_room() {
    // Half the cluster is idle, but capped holds its 8 GPUs: only its own work can make room.
    let mut capped = queue("capped", 1);
    capped.capability = Some(gpus(8));
    let mut c = core(vec![capped], &[("n0", 8), ("n1", 8)]);
    c.submit(job("low", "capped", 0, 4), 0).unwrap();
    c.submit(job("mid", "capped", 5, 4), 0).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 2);
    c.submit(job("high", "capped", 10, 4), 10).unwrap();
    let d = c.schedule(&full(), 10);
    assert_eq!((evicted(&d), bound(&d)), (vec!["low".to_string()], vec!["high".to_string()]), "{d:?}");
    assert_eq!(c.queue_shares()[0].allocated.gpu_milli, 8000);
    // Equal priority never preempts, at the limit or not (mid runs at 5, high at 10).
    c.submit(job("peer", "capped", 5, 4), 11).unwrap();
    let d = c.schedule(&full(), 11);
    assert!(evicted(&d).is_empty(), "{d:?}");
    assert!(c.explain("peer").unwrap().to_string().contains("at capability"));
}

#[test]
fn a_reserve_covers_its_subtree() {
    // org keeps 8 GPUs of its guarantee; its child team may use them, the outside queue may not.
    let mut org = queue("org", 1);
    org.guarantee = Resources { gpu_milli: 8000, ..Default::default() };
    org.lending_limit = Some(Resources { gpu_milli: 0, ..unlimited() });
    let team = QueueSpec { parent: Some("org".into()), ..queue("team", 1) };
    let mut c = core(vec![org, team, queue("outside", 1)], &[("n0", 8), ("n1", 8)]);
    c.submit(job("o0", "outside", 0, 8), 0).unwrap();
    c.submit(job("o1", "outside", 0, 8), 0).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 0)), ["o0"]);
    c.submit(job("t0", "team", 0, 8), 1).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 1)), ["t0"]);
}

#[test]
fn reclaim_returns_borrowed_capacity_and_never_ping_pongs() {
    let mut c = core(vec![queue("a", 1), queue("b", 1)], &[("n0", 8), ("n1", 8)]);
    c.submit(job("a1", "a", 0, 8), 0).unwrap();
    c.submit(job("a2", "a", 0, 8), 0).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 2, "a borrows the idle half");
    c.submit(job("b1", "b", 0, 8), 100).unwrap();
    let d = c.schedule(&full(), 100);
    assert_eq!(evicted(&d).len(), 1, "{d:?}");
    assert_eq!(bound(&d), ["b1"]);
    let victim = evicted(&d)[0].clone();
    // The victim is back in queue a, which now holds exactly its deserved share: it cannot
    // reclaim back from b however often the cycle runs.
    for t in 101..300 {
        let d = c.schedule(&full(), t);
        assert!(evicted(&d).is_empty(), "ping-pong at t={t}: {d:?}");
        if t % 20 == 0 {
            c.upsert_node(gpu_node("n0", 8), t); // cluster changes un-park the victim
        }
    }
    assert_eq!(c.status(&victim).unwrap().phase, Phase::Pending);
    let shares = c.queue_shares();
    assert_eq!((shares[0].allocated.gpu_milli, shares[1].allocated.gpu_milli), (8000, 8000));
    assert_eq!(shares[1].deserved.as_ref().unwrap().gpu_milli, 8000);
}

#[test]
fn reclaim_waits_until_the_run_it_takes_back_has_run_its_minimum() {
    let mut c = core(vec![queue("a", 1), queue("b", 1)], &[("n0", 8), ("n1", 8)]);
    c.config.reclaim_min_runtime_seconds = 60;
    c.submit(job("a1", "a", 0, 8), 0).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 0)), ["a1"]);
    // a borrows the idle half at 30; b arrives at 40 and wants it back.
    c.submit(job("a2", "a", 0, 8), 30).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 30)), ["a2"]);
    c.submit(job("b1", "b", 0, 8), 40).unwrap();
    // At 40 a1 has run 40 s and a2 10 s; at 59, 59 s and 29 s: neither may be reclaimed yet.
    for t in [40, 59] {
        c.upsert_node(gpu_node("n0", 8), t); // a change, so b1 is tried again
        let d = c.schedule(&full(), t);
        assert!(evicted(&d).is_empty(), "reclaimed a run younger than 60 s at t={t}: {d:?}");
    }
    // At 62 (b1's back-off over) a1 has run its minute (a2 only 32 s): a1 is the one taken
    // back, and b1 runs.
    c.upsert_node(gpu_node("n0", 8), 62);
    let d = c.schedule(&full(), 62);
    assert_eq!(evicted(&d), ["a1"], "{d:?}");
    assert_eq!(bound(&d), ["b1"]);
}

/// The reclaim numbers of each eviction in `d`, by task.
fn reclaims(d: &[Decision]) -> Vec<(String, ShareMove)> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Evicted {
                task, reason: EvictReason::Preempted { kind: PreemptKind::Reclaim(m), .. }, ..
            } => Some((task.clone(), *m)),
            _ => None,
        })
        .collect()
}

#[test]
fn reclaim_leaves_a_queue_over_a_fractional_share_by_less_than_a_job_alone() {
    // Three queues of equal weight share 16 GPUs: 5.33 each, which 4-GPU jobs cannot meet exactly.
    let three = || core(vec![queue("a", 1), queue("b", 1), queue("c", 1)], &[("n0", 8), ("n1", 8)]);
    let mut c = three();
    for (name, q) in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b")] {
        c.submit(job(name, q, 0, 4), 0).unwrap();
    }
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 4);
    c.submit(job("a3", "a", 0, 4), 1).unwrap();
    c.submit(job("b3", "b", 0, 4), 1).unwrap();
    c.submit(job("c1", "c", 0, 4), 100).unwrap();
    c.submit(job("c2", "c", 0, 4), 100).unwrap();
    // a and b hold 8 each, 2.67 over their share: taking a 4-GPU job would push either to 4, below
    // it, and then it would be owed the job back. c waits for capacity to free up instead.
    for t in 100..160 {
        c.upsert_node(gpu_node("n0", 8), t); // a change, so c1 is tried again
        let d = c.schedule(&full(), t);
        assert!(evicted(&d).is_empty(), "reclaimed below a fractional share at t={t}: {d:?}");
    }
    assert!(
        c.explain("c1").unwrap().to_string().contains("no running task may be evicted"),
        "{}",
        c.explain("c1").unwrap()
    );
    // Capacity frees up the ordinary way: c, furthest below its share, gets it.
    c.finish("a1").unwrap();
    let placed: Vec<String> = (160..175).flat_map(|t| bound(&c.schedule(&full(), t))).collect();
    assert_eq!(placed, ["c1"]);

    // A queue over its share by a whole job does lose one — exactly one, with the numbers recorded.
    let mut c = three();
    for name in ["a1", "a2", "a3"] {
        c.submit(job(name, "a", 0, 4), 0).unwrap();
    }
    c.submit(job("b1", "b", 0, 4), 0).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 4);
    c.submit(job("a4", "a", 0, 4), 1).unwrap();
    c.submit(job("b2", "b", 0, 4), 1).unwrap();
    c.submit(job("c1", "c", 0, 4), 100).unwrap();
    c.submit(job("c2", "c", 0, 4), 100).unwrap();
    let d = c.schedule(&full(), 100);
    let r = reclaims(&d);
    assert_eq!(r.len(), 1, "{d:?}");
    assert_eq!(bound(&d), ["c1"]);
    let (victim, m) = &r[0];
    assert!(victim.starts_with('a'), "{victim}");
    let share = 16_000 / 3;
    assert_eq!((m.victim_queue.before_gpu_milli, m.victim_queue.after_gpu_milli), (12_000, 8_000));
    assert_eq!((m.preemptor_queue.before_gpu_milli, m.preemptor_queue.after_gpu_milli), (0, 4_000));
    assert!(m.victim_queue.deserved_gpu_milli.abs_diff(share) <= 1, "{m:?}");
    assert!(m.victim_queue.after_gpu_milli >= m.victim_queue.deserved_gpu_milli);
    assert!(m.preemptor_queue.after_gpu_milli <= m.preemptor_queue.deserved_gpu_milli);
    assert_eq!(m.lost_gpu_seconds, 4 * 100, "4 GPUs for 100 s");
    for t in 101..200 {
        c.upsert_node(gpu_node("n0", 8), t);
        let d = c.schedule(&full(), t);
        assert!(evicted(&d).is_empty(), "a second reclaim at t={t}: {d:?}");
    }
}

#[test]
fn a_small_job_never_evicts_a_long_running_gang_unless_the_shares_call_for_it() {
    let nodes = [("n0", 8), ("n1", 8), ("n2", 8), ("n3", 8)];
    // a runs two 4-GPU jobs since 0 and a 2 × 8-GPU gang since 1000; the last 8 GPUs run b's
    // job, or two more of a's.
    let setup = |b_pending: u32, b_runs: bool| {
        let mut c = core(vec![queue("a", 1), queue("b", 1)], &nodes);
        c.submit(job("s1", "a", 0, 4), 0).unwrap();
        c.submit(job("s2", "a", 0, 4), 0).unwrap();
        if b_runs {
            c.submit(job("b0", "b", 0, 8), 0).unwrap();
        } else {
            c.submit(job("s3", "a", 0, 4), 0).unwrap();
            c.submit(job("s4", "a", 0, 4), 0).unwrap();
        }
        c.schedule(&full(), 0);
        c.submit(gang("g", "a", 2, 2, 8), 1000).unwrap();
        assert_eq!(bound(&c.schedule(&full(), 1000)).len(), 2);
        for i in 0..b_pending {
            c.submit(job(&format!("b{}", i + 1), "b", 0, 4), 1100).unwrap();
        }
        c
    };
    // b asks for 4 more: its share is 12 (its request), a's 20. a is 4 over — one small job's worth.
    // The gang has lost less work (16 GPUs × 100 s against 4 × 1,100 s), so the plugin alone would
    // take it, leaving a at 8 GPUs, far below its 20: the host does not allow it.
    let mut c = setup(1, true);
    let d = c.schedule(&full(), 1100);
    let gone = evicted(&d);
    assert_eq!(gone.len(), 1, "{d:?}");
    assert!(gone[0] == "s1" || gone[0] == "s2", "{gone:?}");
    assert_eq!(bound(&d), ["b1"]);

    // a holds all 32 and b asks for 16: shares 16 each, a is 16 over — a whole gang's worth. Now
    // the shares call for it and the cheapest work to lose is the young gang's.
    let mut c = setup(4, false);
    let d = c.schedule(&full(), 1100);
    let mut gone = evicted(&d);
    gone.sort();
    assert_eq!(gone, ["g-0", "g-1"], "{d:?}");
    for (_, m) in reclaims(&d) {
        assert_eq!((m.victim_queue.before_gpu_milli, m.victim_queue.after_gpu_milli), (32_000, 16_000), "{m:?}");
    }
}

#[test]
fn room_reclaimed_for_a_queue_is_held_for_it_against_the_victims_queue_and_lower_claimants() {
    // a holds all 24 GPUs; b (weight 2: a share of 16) wants a 2 × 8 gang back. Evictions are
    // graceful deletions: the victims terminate one by one.
    let config = CoreConfig { await_termination: true, ..CoreConfig::default() };
    let mut c = SchedulerCore::new(QueueTree::new(vec![queue("a", 1), queue("b", 2)]).unwrap(), config);
    for n in ["n0", "n1", "n2"] {
        c.upsert_node(gpu_node(n, 8), 0);
    }
    for name in ["a1", "a2", "a3"] {
        c.submit(job(name, "a", 0, 8), 0).unwrap();
    }
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 3);
    c.submit(gang("pair", "b", 2, 2, 8), 100).unwrap();
    let d = c.schedule(&full(), 100);
    let mut victims = evicted(&d);
    victims.sort();
    assert_eq!(victims.len(), 2, "{d:?}");
    assert_eq!(c.status("pair").unwrap().phase, Phase::Preempting);
    // Meanwhile: a higher-priority job of the victims' queue, and a lower-priority one of b's own.
    c.submit(job("a-urgent", "a", 100, 8), 101).unwrap();
    c.submit(job("b-low", "b", -5, 8), 101).unwrap();
    // The first victim is gone: its room is held for the pair, which still waits for the second.
    assert!(c.terminated(&victims[0]));
    for t in 102..110 {
        let d = c.schedule(&full(), t);
        assert!(bound(&d).is_empty(), "someone took the reclaimed room at t={t}: {d:?}");
        check_accounting(&c);
    }
    assert!(c.terminated(&victims[1]));
    let d = c.schedule(&full(), 110);
    let mut placed = bound(&d);
    placed.sort();
    assert_eq!(placed, ["pair-0", "pair-1"], "{d:?}");
    for v in &victims {
        assert_eq!(c.status(v).unwrap().phase, Phase::Pending, "{v} came back");
    }
}

#[test]
fn a_queue_may_protect_its_runs_from_reclaim_longer_than_the_default() {
    let mut patient = queue("patient", 1);
    patient.reclaim_min_runtime_seconds = Some(3600);
    let nodes = [("n0", 8), ("n1", 8), ("n2", 8), ("n3", 8)];
    let mut c = core(vec![patient, queue("quick", 1), queue("b", 2)], &nodes);
    c.config.reclaim_min_runtime_seconds = 60;
    for i in 0..4 {
        c.submit(job(&format!("p{i}"), "patient", 0, 4), 0).unwrap();
        c.submit(job(&format!("q{i}"), "quick", 0, 4), 0).unwrap();
    }
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 8);
    // b (shares 8, 8, 16 of 32) wants 16 at 120: both other queues hold 16, 8 over their share;
    // quick's runs have had their minute, patient's not their hour. Only quick gives, and only
    // down to its share.
    for i in 0..4 {
        c.submit(job(&format!("b{i}"), "b", 0, 4), 120).unwrap();
    }
    let d = c.schedule(&full(), 120);
    let gone = evicted(&d);
    assert_eq!(gone.len(), 2, "{d:?}");
    assert!(gone.iter().all(|t| t.starts_with('q')), "{gone:?}");
    assert_eq!(c.queue_shares()[1].allocated.gpu_milli, 8000);
}

#[test]
fn a_reclaim_throws_away_at_most_the_shortfall_its_queue_waited_through() {
    // a holds 16 GPUs: big and old from 0, young from 900; b (shares 8 and 8) wants 8 from 1000.
    let scene = |factor: u32| {
        let mut c = core(vec![queue("a", 1), queue("b", 1)], &[("n0", 8), ("n1", 8)]);
        c.config.reclaim_within_deficit = factor;
        c.config.reclaim_min_runtime_seconds = 0;
        c.submit(job("big", "a", 0, 8), 0).unwrap();
        c.submit(job("old", "a", 0, 4), 0).unwrap();
        assert_eq!(bound(&c.schedule(&full(), 0)).len(), 2);
        c.submit(job("young", "a", 0, 4), 900).unwrap();
        assert_eq!(bound(&c.schedule(&full(), 900)), ["young"]);
        c.submit(job("b1", "b", 0, 4), 1000).unwrap();
        c.submit(job("b2", "b", 0, 4), 1000).unwrap();
        c
    };
    // b's shortfall grows 8 GPU-s a second; young would lose 4 GPU-s a second of its age, 400 at
    // 1000: b may take it once its 8 × wait reaches 4 × (wait + 100), at 1100 — not before, and
    // never old (4 × 1,100 s and growing as fast as b's shortfall once b holds 4).
    let mut c = scene(1);
    let mut reclaimed = Vec::new();
    for t in 1000..4000 {
        c.upsert_node(gpu_node("n0", 8), t); // a change, so b's jobs are tried again
        let d = c.schedule(&full(), t);
        for (task, m) in reclaims(&d) {
            reclaimed.push((t, task, m.lost_gpu_seconds));
        }
    }
    assert_eq!(reclaimed.len(), 1, "{reclaimed:?}");
    let (t, task, lost) = &reclaimed[0];
    assert!((1100..=1110).contains(t), "{reclaimed:?}");
    assert_eq!((task.as_str(), *lost), ("young", 4 * (t - 900)));
    // With K = 2 the shortfall counts twice: 16 × wait ≥ 4 × (wait + 100) from 1034.
    let mut c = scene(2);
    let first = (1000..4000).find(|&t| {
        c.upsert_node(gpu_node("n0", 8), t);
        !reclaims(&c.schedule(&full(), t)).is_empty()
    });
    assert!(matches!(first, Some(1034..=1040)), "{first:?}");
    // Without the limit b takes young back at once.
    assert_eq!(evicted(&scene(0).schedule(&full(), 1000)).len(), 2);
}

#[test]
fn a_run_older_than_the_max_runtime_is_never_reclaimed() {
    // a holds both nodes: "old" from 0 and a second run from `second` (shares 8 and 8); b wants 8
    // at 6000. `a_max`: a's own limit; `b_guarantee`: GPUs promised to b.
    let scene = |max: u64, second: u64, a_max: Option<u64>, b_guarantee: u64| {
        let mut a = queue("a", 1);
        a.reclaim_max_runtime_seconds = a_max;
        let mut b = queue("b", 1);
        b.guarantee = Resources { gpu_milli: b_guarantee * 1000, ..Default::default() };
        let mut c = core(vec![a, b], &[("n0", 8), ("n1", 8)]);
        c.config.reclaim_max_runtime_seconds = max;
        c.submit(job("old", "a", 0, 8), 0).unwrap();
        c.schedule(&full(), 0);
        c.submit(job("second", "a", 0, 8), second).unwrap();
        assert_eq!(bound(&c.schedule(&full(), second)), ["second"]);
        c.submit(job("b1", "b", 0, 8), 6000).unwrap();
        let gone = evicted(&c.schedule(&full(), 6000));
        if gone.is_empty() {
            let why = c.explain("b1").unwrap().to_string();
            assert!(why.contains("older than the maximum run time for reclaim"), "{why}");
        }
        gone
    };
    // The cheapest victim goes: the second run, 1,000 s old, limit or not.
    assert_eq!(scene(0, 5000, None, 0), ["second"]);
    assert_eq!(scene(3600, 5000, None, 0), ["second"]);
    // Both 6,000 s old: one is taken without a limit, both are waited out with an hour's.
    assert_eq!(scene(0, 0, None, 0).len(), 1);
    assert!(scene(3600, 0, None, 0).is_empty());
    // Ten minutes: the 1,000-second run is too old as well.
    assert!(scene(600, 5000, None, 0).is_empty());
    // The victim's queue sets its own: none (0) or two hours against the scheduler's hour, ten
    // minutes against no limit.
    assert_eq!(scene(3600, 0, Some(0), 0).len(), 1);
    assert_eq!(scene(3600, 0, Some(7200), 0).len(), 1);
    assert!(scene(0, 5000, Some(600), 0).is_empty());
    // b is promised 8 GPUs: it takes them back from runs of any age; promised 4, its 8 go beyond
    // the promise and the limit holds.
    assert_eq!(scene(3600, 0, None, 8).len(), 1);
    assert_eq!(scene(600, 0, Some(600), 8).len(), 1);
    assert!(scene(3600, 0, None, 4).is_empty());
}

#[test]
fn a_guarantee_lifts_the_max_runtime_only_against_queues_outside_it() {
    // org is guaranteed 16 GPUs; under it team (weight 3) and sib (weight 1); outside holds n1 and
    // is not reclaimable. sib's two 4-GPU runs on n0 are 6,000 s old when team asks for 12: of
    // org's 16 (its guarantee), team deserves 12 and sib 4, so sib holds 4 over its share.
    let gpus = |n: u64| Resources { gpu_milli: n * 1000, ..Default::default() };
    let scene = |team_guarantee: u64| {
        let mut org = queue("org", 1);
        org.guarantee = gpus(16);
        let team = QueueSpec { parent: Some("org".into()), guarantee: gpus(team_guarantee), ..queue("team", 3) };
        let sib = QueueSpec { parent: Some("org".into()), ..queue("sib", 1) };
        let outside = QueueSpec { reclaimable: false, ..queue("outside", 1) };
        let mut c = core(vec![org, team, sib, outside], &[("n0", 8), ("n1", 8)]);
        c.config.reclaim_max_runtime_seconds = 3600;
        for (name, q, n) in [("s1", "sib", 4), ("s2", "sib", 4), ("o", "outside", 8)] {
            c.submit(job(name, q, 0, n), 0).unwrap();
        }
        assert_eq!(bound(&c.schedule(&full(), 0)).len(), 3);
        for t in ["t1", "t2", "t3"] {
            c.submit(job(t, "team", 0, 4), 6000).unwrap();
        }
        evicted(&c.schedule(&full(), 6000))
    };
    // org stays within its guarantee, but sib is inside org: between its teams the share is a
    // balance, not a promise, and sib's old runs are waited out.
    assert!(scene(0).is_empty());
    // team's own guarantee of 4 is a promise sib is outside of: taken back from a run of any age,
    // and no more than it (team's second job goes beyond it).
    assert_eq!(scene(4).len(), 1);
}

#[test]
fn reclaim_respects_guarantees_and_non_reclaimable_queues() {
    let mut guarded = queue("guarded", 1);
    guarded.guarantee = Resources { gpu_milli: 16_000, ..Default::default() };
    let mut c = core(vec![guarded, queue("b", 1)], &[("n0", 8), ("n1", 8)]);
    c.submit(job("g1", "guarded", 0, 8), 0).unwrap();
    c.submit(job("g2", "guarded", 0, 8), 0).unwrap();
    c.schedule(&full(), 0);
    c.submit(job("b1", "b", 0, 8), 1).unwrap();
    let d = c.schedule(&full(), 1);
    assert!(evicted(&d).is_empty(), "guarded holds its guarantee: {d:?}");

    let mut fixed = queue("fixed", 1);
    fixed.reclaimable = false;
    let mut c = core(vec![fixed, queue("b", 1)], &[("n0", 8), ("n1", 8)]);
    c.submit(job("f1", "fixed", 0, 8), 0).unwrap();
    c.submit(job("f2", "fixed", 0, 8), 0).unwrap();
    c.schedule(&full(), 0);
    c.submit(job("b1", "b", 0, 8), 1).unwrap();
    assert!(evicted(&c.schedule(&full(), 1)).is_empty(), "not reclaimable");
}

#[test]
fn a_victim_gang_goes_whole_and_is_requeued() {
    let mut c = core(vec![queue("q", 1)], &[("n0", 8), ("n1", 8)]);
    c.submit(gang("pair", "q", 2, 2, 8), 0).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 0)).len(), 2);
    c.submit(job("high", "q", 10, 8), 1).unwrap();
    let d = c.schedule(&full(), 1);
    let mut gone = evicted(&d);
    gone.sort();
    assert_eq!(gone, ["pair-0", "pair-1"], "below min-member the whole gang leaves: {d:?}");
    assert_eq!(bound(&d), ["high"]);
    assert_eq!(c.status("pair").unwrap().phase, Phase::Pending);
    assert_eq!(c.nodes().get(0).unwrap().allocated.gpu_milli + c.nodes().get(1).unwrap().allocated.gpu_milli, 8000);
}

#[test]
fn d1_drf_through_the_cycle() {
    let cpu_mem = |id: &str, cpu: u64, gib: u64| Task {
        id: id.into(),
        request: Resources { cpu_milli: cpu * 1000, memory_bytes: gib << 30, ..Default::default() },
        ..Default::default()
    };
    let node = Node {
        name: "n".into(),
        allocatable: Resources { cpu_milli: 9000, memory_bytes: 18 << 30, ..Default::default() },
        ..Default::default()
    };
    let set =
        builder().fair_share(Arc::new(NativePlugin::<FairSharePolicy>::new(r#"{"policy":"drf"}"#, 1).unwrap())).build();
    let mut c = SchedulerCore::new(QueueTree::new([queue("a", 1), queue("b", 1)]).unwrap(), CoreConfig::default());
    c.upsert_node(node, 0);
    for i in 0..10 {
        let mut a = Workload::single(cpu_mem(&format!("a{i}"), 1, 4));
        a.queue = "a".into();
        c.submit(a, 0).unwrap();
        let mut b = Workload::single(cpu_mem(&format!("b{i}"), 3, 1));
        b.queue = "b".into();
        c.submit(b, 0).unwrap();
    }
    let d = c.schedule(&set, 0);
    let placed = bound(&d);
    let a = placed.iter().filter(|t| t.starts_with('a')).count();
    let b = placed.iter().filter(|t| t.starts_with('b')).count();
    assert_eq!((a, b), (3, 2), "{placed:?}");
}

#[test]
fn a_failing_fair_share_plugin_degrades_to_tree_order() {
    struct Broken;
    impl wasmsched_api::Plugin for Broken {
        const NAME: &'static str = "broken";
        fn new(_: &str) -> Result<Self, String> {
            Ok(Broken)
        }
    }
    impl wasmsched_api::FairShare for Broken {
        fn compute(&mut self, _: &[wasmsched_api::QueueState], _: &Resources) -> Result<ShareDecision, String> {
            Err("boom".into())
        }
    }
    impl wasmsched_api::Stages for Broken {
        fn as_fair_share(&mut self) -> Option<&mut dyn wasmsched_api::FairShare> {
            Some(self)
        }
    }
    let set = builder().fair_share(Arc::new(NativePlugin::<Broken>::new("", 1).unwrap())).build();
    let mut c = core(vec![queue("a", 1), queue("b", 1)], &[("n", 8)]);
    c.submit(job("x", "b", 0, 1), 0).unwrap();
    c.submit(job("y", "a", 0, 1), 0).unwrap();
    let d = c.schedule(&set, 0);
    assert!(d.iter().any(|x| matches!(x, Decision::Fault(f) if f.message.contains("boom"))), "{d:?}");
    assert_eq!(bound(&d), ["y", "x"], "tree order: a before b");
}

/// Deterministic xorshift for the churn test (the core has no RNG dependency).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Every node's allocation is exactly what placed members and holds take, and every queue's
/// allocation is what its members take, within its capability.
fn check_accounting(c: &SchedulerCore) {
    let mut per_node: AHashMap<String, u64> = AHashMap::new();
    let mut per_queue = vec![0u64; c.queues.len()];
    // Per queue and flavor: GPUs held on that flavor's nodes.
    let mut per_flavor: AHashMap<(usize, String), u64> = AHashMap::new();
    for e in c.entries.values() {
        for (i, m) in e.members.iter().enumerate() {
            if let Some(m) = m {
                let g = e.spec.members[i].gpu.total_milli();
                *per_node.entry(m.node.clone()).or_default() += g;
                let node = c.nodes.get(m.slot).unwrap();
                let flavor = c.queues.flavor_of(node).map(|f| c.queues.flavors()[f].name.clone());
                assert_eq!(m.flavor, flavor, "{} runs with the flavor of its node", e.spec.members[i].id);
                for q in c.queues.chain(e.leaf) {
                    per_queue[q] += g;
                    if let Some(f) = &flavor {
                        *per_flavor.entry((q, f.clone())).or_default() += g;
                    }
                }
            }
        }
        for h in &e.holds {
            *per_node.entry(h.node.clone()).or_default() += h.task.gpu.total_milli();
        }
    }
    for t in &c.terminating {
        *per_node.entry(t.hold.node.clone()).or_default() += t.hold.task.gpu.total_milli();
    }
    // The node index matches the members.
    let mut index: AHashMap<String, AHashMap<String, u32>> = AHashMap::new();
    for (name, e) in &c.entries {
        for m in e.members.iter().flatten() {
            *index.entry(m.node.clone()).or_default().entry(name.clone()).or_default() += 1;
        }
    }
    assert_eq!(index, c.on_node, "node index");
    for slot in c.nodes.slots() {
        let n = c.nodes.get(slot).unwrap();
        assert_eq!(n.allocated.gpu_milli, per_node.get(&n.name).copied().unwrap_or(0), "node {}", n.name);
        let free: u64 = n.gpus.iter().map(|g| u64::from(g.free_milli)).sum();
        assert_eq!(free + n.allocated.gpu_milli, n.allocatable.gpu_milli, "devices of {}", n.name);
    }
    for (q, held) in per_queue.iter().enumerate() {
        assert_eq!(c.queue_use.allocated[q].gpu_milli, *held, "queue {q}");
        if let Some(cap) = &c.queues.get(q).unwrap().capability {
            assert!(*held <= cap.gpu_milli, "queue {q} over capability");
        }
        for f in c.queues.flavors() {
            let name = crate::flavored_resource(&f.name, "gpu");
            let held = per_flavor.get(&(q, f.name.clone())).copied().unwrap_or(0);
            // Only the qualified resources some quota names are counted at all.
            let counted = if c.queues.unbounded_flavored(&name) { 0 } else { held };
            assert_eq!(c.queue_use.allocated[q].extended(&name), counted, "queue {q}, flavor {}", f.name);
            if let Some(limit) = c.queues.limit(q) {
                let bound = limit.extended.iter().find(|(n, _)| **n == *name).map_or(u64::MAX, |(_, v)| *v);
                assert!(held <= bound, "queue {q} over its limit on flavor {}", f.name);
            }
        }
    }
}

#[test]
fn churn_keeps_accounting_exact_loses_nothing_and_never_preempts_back_and_forth() {
    for seed in 1..=6u64 {
        churn_run(seed, false, false);
    }
}

#[test]
fn churn_with_flavors_keeps_every_flavor_s_accounting_exact() {
    for seed in 1..=6u64 {
        churn_run(seed, true, false);
    }
}

#[test]
fn churn_with_graceful_termination_never_hands_out_a_terminating_victim_s_gpus() {
    for seed in 1..=6u64 {
        churn_run(seed, false, true);
        churn_run(seed, true, true);
    }
}

/// A gang of 1–3 members of 1, 2 or 4 GPUs in one of the churn's queues, with a random min-member,
/// priority, checkpointing and grace period.
fn random_gang(rng: &mut Rng, name: &str) -> Workload {
    let q = ["capped", "guaranteed", "free"][rng.below(3) as usize];
    let members = 1 + rng.below(3) as usize;
    let mut w = gang(name, q, members, 1 + rng.below(members as u64) as usize, [1, 2, 4][rng.below(3) as usize]);
    w.priority = rng.below(4) as i32;
    w.checkpointable = rng.below(2) == 0;
    w.grace_seconds = Some(1 + rng.below(5));
    w
}

/// The first member asked to checkpoint reports it done.
fn checkpoint_one(c: &mut SchedulerCore, now: u64) {
    let leaving = c.entries.values().find_map(|e| {
        let i = e.members.iter().position(|m| m.as_ref().is_some_and(|m| m.leaving.is_some()))?;
        Some(e.spec.members[i].id.clone())
    });
    if let Some(task) = leaving {
        c.checkpoint_done(&task, now).unwrap();
    }
}

/// Random submissions, completions and checkpoints; with `flavored`, the 8-GPU nodes are flavor
/// `big` and the 4-GPU ones `small`, with quotas per flavor; with `graceful`, evicted members
/// terminate at random later steps (every device is checked exact at each step).
fn churn_run(seed: u64, flavored: bool, graceful: bool) {
    {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut capped = queue("capped", 1);
        capped.capability = Some(Resources { gpu_milli: 12_000, ..unlimited() });
        let mut guaranteed = queue("guaranteed", 2);
        guaranteed.guarantee = Resources { gpu_milli: 8000, ..Default::default() };
        if flavored {
            // capped holds at most 8 GPUs of big nodes; guaranteed is promised 4 of small ones.
            capped.capability = Some(flavor_gpus(capped.capability.take().unwrap(), "big", 8, true));
            guaranteed.guarantee = flavor_gpus(guaranteed.guarantee, "small", 4, false);
            guaranteed.flavors = vec!["small".into(), "big".into()];
        }
        let nodes: Vec<(String, u32)> = (0..6).map(|i| (format!("n{i}"), [4, 8][i % 2])).collect();
        let refs: Vec<(&str, u32)> = nodes.iter().map(|(n, g)| (n.as_str(), *g)).collect();
        let mut c = if flavored {
            let flavors = vec![flavor("big", "8x"), flavor("small", "4x")];
            let tree = QueueTree::with_flavors(flavors, vec![capped, guaranteed, queue("free", 1)]).unwrap();
            let mut c = SchedulerCore::new(tree, CoreConfig::default());
            for (name, gpus) in &refs {
                c.upsert_node(model_node(name, *gpus, if *gpus == 8 { "8x" } else { "4x" }), 0);
            }
            c
        } else {
            core(vec![capped, guaranteed, queue("free", 1)], &refs)
        };
        c.config.await_termination = graceful;
        let mut terminations = 0usize;
        let set = full();
        let mut submitted = 0usize;
        let mut finished = 0usize;
        let mut pairs: AHashSet<(String, String)> = AHashSet::new();
        for t in 0..400u64 {
            if rng.below(3) == 0 {
                c.submit(random_gang(&mut rng, &format!("w{submitted}")), t).unwrap();
                submitted += 1;
            }
            if rng.below(4) == 0 {
                let running = c.workloads_in(Phase::Running);
                if !running.is_empty() {
                    let victim = running[rng.below(running.len() as u64) as usize].to_string();
                    c.finish(&victim).unwrap();
                    finished += 1;
                }
            }
            for d in c.schedule(&set, t) {
                if let Decision::Evicted { workload, reason: EvictReason::Preempted { preemptor, .. }, .. } = d {
                    if std::env::var("CHURN_DEBUG").is_ok() {
                        let (p, v) = (&c.entries[&preemptor], &c.entries[&workload]);
                        eprintln!(
                            "t={t} {preemptor}(q{} p{} min{} n{} run{}) evicts {workload}(q{} p{} min{} n{} run{}) alloc={:?} deserved={:?}",
                            p.leaf,
                            p.spec.priority,
                            p.spec.min_member,
                            p.spec.members.len(),
                            p.running(),
                            v.leaf,
                            v.spec.priority,
                            v.spec.min_member,
                            v.spec.members.len(),
                            v.running(),
                            c.queue_use.allocated.iter().map(|a| a.gpu_milli).collect::<Vec<_>>(),
                            c.queue_use.deserved.as_ref().map(|d| d.iter().map(|a| a.gpu_milli).collect::<Vec<_>>())
                        );
                    }
                    assert!(
                        !pairs.contains(&(workload.clone(), preemptor.clone())),
                        "seed {seed}: {preemptor} evicted {workload}, which had evicted it before"
                    );
                    pairs.insert((preemptor, workload));
                }
            }
            if rng.below(5) == 0 {
                checkpoint_one(&mut c, t);
            }
            if graceful && rng.below(2) == 0 {
                let gone = c.terminating().next().map(|(task, _)| task.to_string());
                if let Some(task) = gone {
                    assert!(c.terminated(&task));
                    terminations += 1;
                }
            }
            check_accounting(&c);
            assert_eq!(c.entries.len() + finished, submitted, "seed {seed}: nothing is lost");
        }
        assert!(!pairs.is_empty(), "seed {seed}: the churn exercised preemption");
        assert_eq!(graceful, terminations > 0, "seed {seed}: terminations exercised only when graceful");
    }
}

#[test]
fn churn_with_nodes_changing_under_running_work_keeps_every_device_exact() {
    let n: u64 = std::env::var("CHURN_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    for seed in 1..=n {
        node_churn_run(seed, false);
        node_churn_run(seed, true);
    }
}

#[test]
fn a_node_update_that_breaks_a_gang_evicts_each_member_once_and_frees_exactly_what_they_held() {
    let mut c = core(vec![queue("q", 1)], &[("n0", 8)]);
    c.submit(gang("g", "q", 2, 2, 4), 0).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 0)), ["g-0", "g-1"]);
    // GPU 0 fails: g-0 (devices 0–3) no longer fits, g-1 (4–7) still would, but the gang is broken.
    let mut node = gpu_node("n0", 8);
    node.gpus.update(|g| g[0].health = wasmsched_api::GpuHealth::Unhealthy);
    let evicted: Vec<(String, String)> = c
        .upsert_node(node, 1)
        .into_iter()
        .filter_map(|d| match d {
            Decision::Evicted { task, reason, .. } => Some((task, format!("{reason:?}"))),
            _ => None,
        })
        .collect();
    assert_eq!(evicted, [("g-0".to_string(), "NodeLost".to_string()), ("g-1".to_string(), "GangBroken".to_string())]);
    let n = c.nodes.get(c.nodes.slot_of("n0").unwrap()).unwrap();
    assert_eq!((n.allocated.gpu_milli, n.gpus.iter().map(|g| u64::from(g.free_milli)).sum::<u64>()), (0, 8000));
    check_accounting(&c);
    check_devices(&c);
}

/// Every device's free share is its size less what the members and holds placed on it take, and
/// no member sits on a node the core does not know.
fn check_devices(c: &SchedulerCore) {
    let mut taken: AHashMap<(String, u32), u64> = AHashMap::new();
    for e in c.entries.values() {
        for m in e.members.iter().flatten() {
            assert!(c.nodes.slot_of(&m.node).is_some(), "a member on unknown node {}", m.node);
            for d in &m.devices {
                *taken.entry((m.node.clone(), d.gpu)).or_default() += u64::from(d.milli);
            }
        }
        for h in &e.holds {
            for d in &h.devices {
                *taken.entry((h.node.clone(), d.gpu)).or_default() += u64::from(d.milli);
            }
        }
    }
    for slot in c.nodes.slots() {
        let n = c.nodes.get(slot).unwrap();
        for g in &n.gpus {
            let t = taken.remove(&(n.name.clone(), g.index)).unwrap_or(0);
            assert_eq!(u64::from(g.free_milli) + t, 1000, "device {} of {}", g.index, n.name);
        }
    }
    assert!(taken.is_empty(), "shares on devices that do not exist: {taken:?}");
}

/// Random work (whole and shared GPUs, gangs, priorities, checkpoints) while nodes are removed,
/// re-added, cordoned, shrunk and lose a GPU's health, tasks leave their workloads and the queue
/// tree's weights and guarantees change; with `flavored`, 8-GPU nodes are flavor `big` and 4-GPU
/// ones `small`, with quotas per flavor.
fn node_churn_run(seed: u64, flavored: bool) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let queues = |weight: u32, guarantee: u64| {
        let mut capped = queue("capped", 1);
        capped.capability = Some(Resources { gpu_milli: 12_000, ..unlimited() });
        let mut guaranteed = queue("guaranteed", weight);
        guaranteed.guarantee = Resources { gpu_milli: guarantee * 1000, ..Default::default() };
        if flavored {
            capped.capability = Some(flavor_gpus(capped.capability.take().unwrap(), "big", 8, true));
            guaranteed.guarantee = flavor_gpus(guaranteed.guarantee, "small", guarantee / 2, false);
            guaranteed.flavors = vec!["small".into(), "big".into()];
        }
        let list = vec![capped, guaranteed, queue("free", 1)];
        if flavored {
            QueueTree::with_flavors(vec![flavor("big", "8x"), flavor("small", "4x")], list).unwrap()
        } else {
            QueueTree::new(list).unwrap()
        }
    };
    let names: Vec<String> = (0..6).map(|i| format!("n{i}")).collect();
    let make_node = |i: usize, gpus: u32| {
        if flavored {
            model_node(&names[i], gpus, if i % 2 == 1 { "8x" } else { "4x" })
        } else {
            gpu_node(&names[i], gpus)
        }
    };
    let mut c = SchedulerCore::new(queues(2, 8), CoreConfig::default());
    for i in 0..names.len() {
        c.upsert_node(make_node(i, [4, 8][i % 2]), 0);
    }
    let set = full();
    let (mut submitted, mut gone) = (0usize, 0usize);
    for t in 0..300u64 {
        if rng.below(2) == 0 {
            let mut w = random_gang(&mut rng, &format!("w{submitted}"));
            if rng.below(3) == 0 {
                // Shared GPUs: one device, part of it.
                for m in &mut w.members {
                    m.gpu =
                        GpuRequest { count: 1, milli_per_gpu: [250, 500][rng.below(2) as usize], ..Default::default() };
                }
            }
            w.timeout_seconds = Some(5 + rng.below(20));
            c.submit(w, t).unwrap();
            submitted += 1;
        }
        match rng.below(10) {
            0 => {
                let running = c.workloads_in(Phase::Running);
                if !running.is_empty() {
                    let w = running[rng.below(running.len() as u64) as usize].to_string();
                    c.finish(&w).unwrap();
                    gone += 1;
                }
            }
            1 => {
                // A task leaves its workload (a pod deleted).
                let tasks: Vec<(String, String)> = c
                    .entries
                    .iter()
                    .flat_map(|(w, e)| e.spec.members.iter().map(move |m| (w.clone(), m.id.clone())))
                    .collect();
                if !tasks.is_empty() {
                    let (w, task) = &tasks[rng.below(tasks.len() as u64) as usize];
                    c.remove_task(task).unwrap();
                    if !c.entries.contains_key(w) {
                        gone += 1;
                    }
                }
            }
            2 => {
                let name = &names[rng.below(names.len() as u64) as usize];
                c.remove_node(name, t);
            }
            3 => {
                // A node (re)appears, possibly cordoned, smaller, or with an unhealthy GPU.
                let i = rng.below(names.len() as u64) as usize;
                let gpus = [4, 8][i % 2] - if rng.below(4) == 0 { 2 } else { 0 };
                let mut node = make_node(i, gpus);
                node.unschedulable = rng.below(4) == 0;
                if rng.below(4) == 0 {
                    node.gpus.update(|g| g[0].health = wasmsched_api::GpuHealth::Unhealthy);
                }
                c.upsert_node(node, t);
            }
            4 => {
                // A member created late (a gang's pods appear one by one).
                let names: Vec<String> = c.entries.keys().cloned().collect();
                if !names.is_empty() {
                    let w = &names[rng.below(names.len() as u64) as usize];
                    c.add_members(w, vec![task(&format!("{w}-late{t}"), 1)]).unwrap();
                }
            }
            6 => {
                // The operator reweights the tree and changes a guarantee.
                c.set_queues(queues(1 + rng.below(4) as u32, [0, 4, 8][rng.below(3) as usize])).unwrap();
            }
            5 => {
                // A disruption budget runs out or frees up.
                let running = c.workloads_in(Phase::Running);
                if !running.is_empty() {
                    let w = running[rng.below(running.len() as u64) as usize].to_string();
                    c.set_preemptible(&w, rng.below(2) == 0).unwrap();
                }
            }
            _ => {}
        }
        let before: AHashSet<String> = c.entries.keys().cloned().collect();
        for d in c.schedule(&set, t) {
            if let Decision::Bound { node, .. } = &d {
                let slot = c.nodes.slot_of(node).expect("bound to a known node");
                assert!(!c.nodes.get(slot).unwrap().unschedulable, "seed {seed}: bound to cordoned {node}");
            }
        }
        // Work the cycle gave up on (a gang timed out) leaves the core.
        gone += before.iter().filter(|w| !c.entries.contains_key(*w)).count();
        if rng.below(4) == 0 {
            checkpoint_one(&mut c, t);
        }
        check_accounting(&c);
        check_devices(&c);
        assert_eq!(c.entries.len() + gone, submitted, "seed {seed} t={t}: nothing is lost");
    }
}

fn model_node(name: &str, gpus: u32, model: &str) -> Node {
    let mut node = Node { labels: vec![("gpu-model".into(), model.into())], ..gpu_node(name, gpus) };
    node.gpus.update(|gpus| {
        for g in gpus.iter_mut() {
            g.model = model.into();
        }
    });
    node
}

fn flavor(name: &str, model: &str) -> crate::Flavor {
    crate::Flavor { name: name.into(), node_labels: vec![("gpu-model".into(), model.into())], tolerations: Vec::new() }
}

/// `r` plus quota for `gpus` GPUs of `flavor`: as a limit (`bound`), unbounded in the rest; as a
/// guarantee, 0 of the rest.
fn flavor_gpus(mut r: Resources, flavor: &str, gpus: u64, bound: bool) -> Resources {
    let rest = if bound { unlimited() } else { Resources::default() };
    crate::add_flavored(&mut r, flavor, &Resources { gpu_milli: gpus * 1000, ..rest });
    r
}

/// Digest-001 K1/K2: a cluster queue (`cq`, two namespace queues under it) with per-flavor quotas
/// — A100 64 GPUs with a borrowing limit of 16, V100 32 — in a cohort (`ai-platform`) whose
/// other member (`lender`) is guaranteed 32 A100 GPUs. The cluster has 96 A100 and 32 V100 GPUs.
fn k1_cohort(lender_lends: bool) -> SchedulerCore {
    let cohort = queue("ai-platform", 1);
    let mut cq = QueueSpec {
        parent: Some("ai-platform".into()),
        flavors: vec!["gpu-a100".into(), "gpu-v100".into()],
        ..queue("cq", 1)
    };
    cq.guarantee = flavor_gpus(flavor_gpus(Resources::default(), "gpu-a100", 64, false), "gpu-v100", 32, false);
    cq.borrowing_limit = Some(flavor_gpus(unlimited(), "gpu-a100", 16, true));
    let ns_a = QueueSpec { parent: Some("cq".into()), ..queue("ns-a", 1) };
    let ns_b = QueueSpec { parent: Some("cq".into()), ..queue("ns-b", 1) };
    let mut lender =
        QueueSpec { parent: Some("ai-platform".into()), flavors: vec!["gpu-a100".into()], ..queue("lender", 1) };
    lender.guarantee = flavor_gpus(Resources::default(), "gpu-a100", 32, false);
    if !lender_lends {
        lender.lending_limit = Some(flavor_gpus(unlimited(), "gpu-a100", 0, true));
    }
    let flavors = vec![flavor("gpu-a100", "A100"), flavor("gpu-v100", "V100")];
    let tree = QueueTree::with_flavors(flavors, [cohort, cq, ns_a, ns_b, lender]).unwrap();
    let mut c = SchedulerCore::new(tree, CoreConfig::default());
    for i in 0..12 {
        c.upsert_node(model_node(&format!("a100-{i}"), 8, "A100"), 0);
    }
    for i in 0..4 {
        c.upsert_node(model_node(&format!("v100-{i}"), 8, "V100"), 0);
    }
    c
}

/// The nodes each bound task went to, by GPU model.
fn placed_on(decisions: &[Decision], model: &str) -> usize {
    let model = model.to_ascii_lowercase();
    decisions.iter().filter(|d| matches!(d, Decision::Bound { node, .. } if node.starts_with(&model))).count()
}

#[test]
fn k1_k2_flavor_quotas_borrow_up_to_their_limit_then_the_next_flavor_is_tried() {
    // The lender lends its idle A100 quota: cq holds 64 + 16 = 80 A100 GPUs, then its jobs go
    // to V100 (its second flavor) until those 32 are taken; the 15th and 16th wait.
    let mut c = k1_cohort(true);
    for i in 0..16 {
        c.submit(job(&format!("j{i:02}"), ["ns-a", "ns-b"][i % 2], 0, 8), 0).unwrap();
    }
    let d = c.schedule(&full(), 0);
    assert_eq!((placed_on(&d, "A100"), placed_on(&d, "V100")), (10, 4), "{d:?}");
    let cq = c.queues().index_of("cq").unwrap();
    let held = &c.queue_shares()[cq].allocated;
    assert_eq!(
        (held.extended("gpu-a100/gpu"), held.extended("gpu-v100/gpu"), held.gpu_milli),
        (80_000, 32_000, 112_000)
    );
    let why = c.explain("j14").unwrap().to_string();
    assert!(why.contains("flavor gpu-a100: queue cq at borrowing limit: 0 of the 1 required members fit"), "{why}");
    check_accounting(&c);
    // The lender's own job takes the A100 GPUs still free, without preempting anyone.
    c.submit(job("l0", "lender", 0, 8), 1).unwrap();
    let d = c.schedule(&full(), 1);
    assert_eq!((bound(&d), evicted(&d).len()), (vec!["l0".to_string()], 0), "{d:?}");

    // Without a lender (the other member keeps its whole A100 guarantee), cq's cap is 64. Fair
    // share splits what cq can get (64 + 32), not the whole cluster, so ns-a and ns-b deserve 48
    // each: the queue served a V100 node ahead of its turn gives one back by reclaim.
    let mut c = k1_cohort(false);
    // Reclaim within the same second: this is about what each flavor's shares allow, not run times.
    c.config.reclaim_min_runtime_seconds = 0;
    for i in 0..16 {
        c.submit(job(&format!("j{i:02}"), ["ns-a", "ns-b"][i % 2], 0, 8), 0).unwrap();
    }
    let d = c.schedule(&full(), 0);
    assert_eq!((placed_on(&d, "A100"), placed_on(&d, "V100"), evicted(&d).len()), (8, 5, 1), "{d:?}");
    let shares = c.queue_shares();
    let held = |q: &str| shares[c.queues().index_of(q).unwrap()].allocated.gpu_milli;
    assert_eq!((held("ns-a"), held("ns-b")), (48_000, 48_000));
    let why = c.explain("j14").unwrap().to_string();
    assert!(why.contains("flavor gpu-a100: the rest is reserved by queues that lend only part"), "{why}");
    check_accounting(&c);
}

#[test]
fn a_queue_without_a_flavor_never_uses_its_nodes_and_reclaim_stays_within_the_flavor() {
    let mut c = k1_cohort(true);
    c.config.reclaim_min_runtime_seconds = 0; // about flavors, not run times
    // The lender may use only A100 nodes: of 13 jobs, 12 take them all and one waits.
    for i in 0..13 {
        c.submit(job(&format!("l{i:02}"), "lender", 0, 8), 0).unwrap();
    }
    let d = c.schedule(&full(), 0);
    assert_eq!((placed_on(&d, "A100"), placed_on(&d, "V100")), (12, 0), "{d:?}");
    // A job of cq that any GPU serves goes to the idle V100 nodes: the next flavor is tried
    // before anyone is preempted.
    c.submit(job("any", "ns-b", 0, 8), 10).unwrap();
    let d = c.schedule(&full(), 10);
    assert_eq!((placed_on(&d, "V100"), evicted(&d).len()), (1, 0), "{d:?}");
    // Jobs that need A100s reclaim cq's A100 guarantee from the lender, which borrowed beyond
    // its own 32, on A100 nodes only.
    for i in 0..4 {
        let mut w = job(&format!("j{i}"), "ns-a", 0, 8);
        w.members[0].gpu.models = vec!["A100".into()];
        c.submit(w, 10).unwrap();
    }
    let mut evicted_total = Vec::new();
    let mut bound_total = Vec::new();
    for t in 10..20 {
        let d = c.schedule(&full(), t);
        evicted_total.extend(evicted(&d));
        bound_total.extend(d.into_iter().filter(|d| matches!(d, Decision::Bound { .. })));
    }
    assert_eq!(evicted_total.len(), 4, "{evicted_total:?} {}", c.explain("j0").unwrap());
    assert!(evicted_total.iter().all(|t| t.starts_with('l')), "{evicted_total:?}");
    assert_eq!(placed_on(&bound_total, "A100"), 4, "{bound_total:?}");
    let lender = c.queues().index_of("lender").unwrap();
    assert_eq!(c.queue_shares()[lender].allocated.extended("gpu-a100/gpu"), 64_000);
    check_accounting(&c);
}

/// An overloaded cluster (more work arrives than leaves) with few request shapes; every decision
/// as text, and the filter and fair-share calls made.
fn overload(reuse_failures: bool, seed: u64, priorities: u64) -> (Vec<String>, (usize, usize)) {
    let filter = Counting::new(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()));
    let fair = Counting::new(Arc::new(NativePlugin::<FairSharePolicy>::new("", 1).unwrap()));
    // Uncached, so the calls counted are the ones the failure memo saves, not verdict reuse.
    let set = PolicySet::builder()
        .filter_uncached(filter.clone())
        .score(Arc::new(NativePlugin::<AllocationScore>::new(r#"{"strategy":"most"}"#, 1).unwrap()), 1)
        .fair_share(fair.clone())
        .preempt(Arc::new(NativePlugin::<PriorityPreempt>::new("", 1).unwrap()))
        .build();
    let config = CoreConfig { reuse_failures, ..CoreConfig::default() };
    let mut c = SchedulerCore::new(QueueTree::new(vec![queue("a", 1), queue("b", 2)]).unwrap(), config);
    for i in 0..4 {
        c.upsert_node(gpu_node(&format!("n{i}"), 8), 0);
    }
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut log = Vec::new();
    for t in 0..150u64 {
        for k in 0..3 {
            let q = ["a", "b"][rng.below(2) as usize];
            let mut w = job(&format!("j{t}-{k}"), q, rng.below(priorities) as i32, [1, 2, 4][rng.below(3) as usize]);
            w.checkpointable = rng.below(4) == 0;
            w.grace_seconds = Some(2);
            c.submit(w, t).unwrap();
        }
        let running = c.workloads_in(Phase::Running);
        if !running.is_empty() {
            let done = running[rng.below(running.len() as u64) as usize].to_string();
            c.finish(&done).unwrap();
            log.push(format!("t={t} finished {done}"));
        }
        log.extend(c.schedule(&set, t).iter().map(|d| format!("t={t} {d:?}")));
    }
    (log, (filter.counts().0, fair.counts().1))
}

#[test]
fn reusing_identical_failures_and_the_fair_share_order_changes_no_decision() {
    // Three priorities: preemption clears the memo often; one: nothing frees room but completions.
    for (seed, priorities, saving) in [(1, 3, 0.8), (2, 3, 0.8), (3, 1, 0.45)] {
        let (memo, (memo_filters, memo_shares)) = overload(true, seed, priorities);
        let (full, (full_filters, full_shares)) = overload(false, seed, priorities);
        if let Some(i) = (0..memo.len().min(full.len())).find(|&i| memo[i] != full[i]) {
            panic!("seed {seed}: decision {i} differs\nreused: {}\ntried:  {}", memo[i], full[i]);
        }
        assert_eq!(memo.len(), full.len(), "seed {seed}");
        if priorities > 1 {
            assert!(memo.iter().any(|l| l.contains("Evicted")), "seed {seed}: the overload exercises preemption");
        }
        let unschedulable = memo.iter().filter(|l| l.contains("Unschedulable")).count();
        assert!(unschedulable > 1000, "seed {seed}: overloaded ({unschedulable} failures)");
        // Twins of a failure are not filtered again; the order is not recomputed after a failure.
        assert!(
            (memo_filters as f64) < full_filters as f64 * saving,
            "seed {seed}: filter calls {memo_filters} vs {full_filters}"
        );
        assert!(memo_shares <= full_shares, "seed {seed}");
        assert!(memo_shares * 2 < unschedulable, "seed {seed}: fair share asked {memo_shares} times");
    }
}

#[test]
fn a_live_cluster_other_schedulers_usage_restarts_and_members_that_come_and_go() {
    let mut c = core(vec![queue("q", 1)], &[]);
    // Another scheduler's pod holds 6 of n0's 8 GPUs: observed, it stays counted.
    let mut n0 = gpu_node("n0", 8);
    n0.gpus.update(|gpus| gpus[..6].iter_mut().for_each(|g| g.free_milli = 0));
    n0.allocated.gpu_milli = 6000;
    c.observe_node(n0.clone(), 0);
    c.observe_node(gpu_node("n1", 8), 0);
    // A restart: an 8-GPU gang of two ran on n1 before; it is adopted, not placed again.
    let running: Vec<(String, String, Vec<DeviceShare>)> =
        vec![("old-0".into(), "n1".into(), (0..4).map(|gpu| DeviceShare { gpu, milli: 1000 }).collect())];
    assert!(c.adopt(gang("old", "q", 2, 2, 4), &[("ghost".into(), "n1".into(), vec![])], 0).is_err());
    assert!(c.adopt(gang("old", "q", 2, 2, 4), &[("old-0".into(), "n9".into(), vec![])], 0).is_err());
    c.adopt(gang("old", "q", 2, 2, 4), &running, 0).unwrap();
    assert_eq!(c.status("old").unwrap().phase, Phase::Running);
    assert_eq!(c.placement_of("old-0"), Some("n1"));
    // Its other member is placed where there is room (n1's other half), as capacity allows.
    let d = c.schedule(&full(), 1);
    assert_eq!(bound(&d), ["old-1"]);
    assert_eq!(c.placement_of("old-1"), Some("n1"));
    // A 4-GPU job does not fit: n0 has 2 free, n1 none. Re-observing n1 (a label change) keeps the
    // members even though nothing is free; re-observing n0 with the other pod gone frees its room.
    c.submit(job("j", "q", 0, 4), 1).unwrap();
    assert!(bound(&c.schedule(&full(), 2)).is_empty());
    assert!(c.observe_node(gpu_node("n1", 8), 3).is_empty(), "running members are never evicted");
    assert_eq!(c.status("old").unwrap().running, 2);
    c.observe_node(gpu_node("n0", 8), 3);
    assert_eq!(bound(&c.schedule(&full(), 4)), ["j"]);
    check_accounting(&c);
    // A gang whose members appear one by one: two submitted of min 2, a third joins later.
    c.submit(gang("g", "q", 2, 2, 1), 5).unwrap();
    c.add_members("g", vec![task("g-2", 1)]).unwrap();
    assert!(matches!(c.add_members("g", vec![task("j", 1)]), Err(WorkloadError::TaskTaken { .. })));
    assert!(c.add_members("nope", vec![task("x", 1)]).is_err());
    let mut b = bound(&c.schedule(&full(), 6));
    b.sort();
    assert_eq!(b, ["g-0", "g-1", "g-2"]);
    // Members finish one by one: the gang keeps running (completion is not eviction), releases as
    // it goes, and is forgotten with its last member.
    c.remove_task("g-0").unwrap();
    assert_eq!(c.status("g").unwrap().running, 2);
    c.remove_task("g-1").unwrap();
    c.remove_task("g-2").unwrap();
    assert!(c.status("g").is_none());
    assert!(matches!(c.remove_task("g-2"), Err(CoreError::UnknownTask(_))));
    check_accounting(&c);
    // A pending gang losing a member below min-member is withdrawn, freeing its other task ids.
    c.submit(gang("p", "q", 2, 2, 8), 7).unwrap();
    c.remove_task("p-0").unwrap();
    assert!(c.status("p").is_none());
    assert_eq!(c.owner_of("p-1"), None);
}

#[test]
fn queues_change_under_running_work_and_refuse_to_orphan_it() {
    let mut c = core(vec![queue("a", 1), queue("b", 1)], &[("n", 8)]);
    c.submit(job("x", "a", 0, 2), 0).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 0)), ["x"]);
    // Dropping "a" while x runs in it is refused; adding a queue keeps x's allocation counted.
    assert!(matches!(
        c.set_queues(QueueTree::new(vec![queue("b", 1)]).unwrap()),
        Err(CoreError::QueueInUse { ref queue, .. }) if queue == "a"
    ));
    c.set_queues(QueueTree::new(vec![queue("c", 2), queue("a", 1), queue("b", 1)]).unwrap()).unwrap();
    let a = c.queue_shares().into_iter().find(|s| s.name == "a").unwrap();
    assert_eq!(a.allocated.gpu_milli, 2000);
    check_accounting(&c);
    c.submit(job("y", "c", 0, 6), 1).unwrap();
    assert_eq!(bound(&c.schedule(&full(), 1)), ["y"]);
    c.remove_task("x").unwrap();
    c.set_queues(QueueTree::new(vec![queue("c", 2)]).unwrap()).unwrap();
    check_accounting(&c);
}

#[test]
fn a_bounded_cycle_works_through_a_backlog_in_order_and_says_when_more_is_ready() {
    let mut c = core(vec![queue("q", 1)], &[("n", 8)]);
    c.config.max_attempts_per_cycle = Some(2);
    for i in 0..5 {
        c.submit(job(&format!("j{i}"), "q", 0, 1), 0).unwrap();
    }
    let mut order = Vec::new();
    let mut cycles = 0;
    loop {
        let d = c.schedule(&full(), 0);
        cycles += 1;
        assert!(bound(&d).len() <= 2, "at most two attempts a cycle: {d:?}");
        order.extend(bound(&d));
        if !c.more_ready() {
            break;
        }
    }
    assert_eq!(order, ["j0", "j1", "j2", "j3", "j4"]);
    assert_eq!(cycles, 3);
}

#[test]
fn queue_task_counts_roll_up_the_tree() {
    let parent = queue("org", 1);
    let mut a = queue("a", 1);
    a.parent = Some("org".into());
    let mut c = core(vec![parent, a, queue("b", 1)], &[("n", 8)]);
    c.submit(job("x", "a", 0, 8), 0).unwrap();
    c.submit(job("y", "a", 0, 8), 0).unwrap();
    c.submit(gang("g", "b", 2, 2, 8), 0).unwrap();
    c.schedule(&full(), 0);
    let names: Vec<String> = c.queue_shares().into_iter().map(|s| s.name).collect();
    let counts: std::collections::BTreeMap<String, (usize, usize)> = names.into_iter().zip(c.queue_tasks()).collect();
    // One of x and y runs, the other waits; the gang g (16 GPUs) never fits the 8-GPU node.
    assert_eq!(counts["a"], (1, 1));
    assert_eq!(counts["org"], (1, 1), "a parent counts its subtree");
    assert_eq!(counts["b"], (2, 0));
}

#[test]
fn a_flavor_s_tolerations_come_with_it_and_nodes_of_no_flavor_come_last() {
    use wasmsched_api::{Taint, Toleration, TolerationOperator};
    // The A100 node is tainted for GPU work; the flavor carries the toleration, the jobs do not.
    let mut a100 = flavor("gpu-a100", "A100");
    a100.tolerations =
        vec![Toleration { key: "nvidia.com/gpu".into(), operator: TolerationOperator::Exists, ..Default::default() }];
    let mut q = QueueSpec { flavors: vec!["gpu-a100".into()], ..queue("q", 1) };
    q.capability = Some(flavor_gpus(unlimited(), "gpu-a100", 8, true));
    let mut c = SchedulerCore::new(QueueTree::with_flavors(vec![a100], [q]).unwrap(), CoreConfig::default());
    let mut tainted = model_node("a100-0", 8, "A100");
    tainted.taints = vec![Taint { key: "nvidia.com/gpu".into(), value: "present".into(), ..Default::default() }];
    c.upsert_node(tainted, 0);
    c.upsert_node(gpu_node("plain-0", 8), 0);
    for i in 0..3 {
        c.submit(job(&format!("j{i}"), "q", 0, 8), 0).unwrap();
    }
    let d = c.schedule(&full(), 0);
    let nodes: Vec<&str> = d
        .iter()
        .filter_map(|d| match d {
            Decision::Bound { node, .. } => Some(node.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(nodes, ["a100-0", "plain-0"], "the flavor first, then the nodes of none: {d:?}");
    let why = c.explain("j2").unwrap().to_string();
    assert!(why.contains("flavor gpu-a100: queue q at capability: 0 of the 1 required members fit"), "{why}");
    check_accounting(&c);
    // Without flavors the taint keeps the jobs off the A100 node.
    let mut c = core(vec![queue("q", 1)], &[]);
    let mut tainted = model_node("a100-0", 8, "A100");
    tainted.taints = vec![Taint { key: "nvidia.com/gpu".into(), value: "present".into(), ..Default::default() }];
    c.upsert_node(tainted, 0);
    c.submit(job("j0", "q", 0, 8), 0).unwrap();
    assert!(bound(&c.schedule(&full(), 0)).is_empty());
}

fn labelled_node(name: &str, zone: &str) -> Node {
    let labels = vec![("kubernetes.io/hostname".into(), name.into()), ("zone".into(), zone.into())];
    Node { labels, ..gpu_node(name, 8) }
}

fn app_term(app: &str, key: &str) -> wasmsched_api::PodAffinityTerm {
    use wasmsched_api::{SelectorOperator, SelectorRequirement};
    wasmsched_api::PodAffinityTerm {
        selector: Some(vec![SelectorRequirement {
            key: "app".into(),
            operator: SelectorOperator::In,
            values: vec![app.into()],
        }]),
        namespaces: None,
        topology_key: key.into(),
    }
}

/// A one-GPU pod labelled `app`, with the given required pod (anti-)affinity.
fn app_job(name: &str, app: &str, affinity: wasmsched_api::PodAffinity) -> Workload {
    let mut w = job(name, "q", 0, 1);
    w.members[0].labels = vec![("app".into(), app.into())];
    w.members[0].pod_affinity = (!affinity.is_empty()).then(|| Box::new(affinity));
    w
}

fn node_of(c: &SchedulerCore, workload: &str) -> Option<String> {
    c.entries[workload].members[0].as_ref().map(|m| m.node.clone())
}

#[test]
fn required_pod_anti_affinity_spreads_replicas_and_is_symmetric() {
    let mut c = core(vec![queue("q", 1)], &[]);
    for (n, zone) in [("n0", "a"), ("n1", "a"), ("n2", "b")] {
        c.upsert_node(labelled_node(n, zone), 0);
    }
    // Bin-packing would put all four on one node; one web replica per node is required.
    let spread = wasmsched_api::PodAffinity {
        anti_affinity: vec![app_term("web", "kubernetes.io/hostname")],
        ..Default::default()
    };
    for i in 0..4 {
        c.submit(app_job(&format!("web-{i}"), "web", spread.clone()), 0).unwrap();
    }
    c.schedule(&full(), 0);
    let mut nodes: Vec<String> = (0..3).filter_map(|i| node_of(&c, &format!("web-{i}"))).collect();
    nodes.sort();
    assert_eq!(nodes, ["n0", "n1", "n2"]);
    let why = c.explain("web-3").unwrap().to_string();
    assert!(why.contains("required pod (anti-)affinity: kubernetes.io/hostname not in [n0, n1, n2]"), "{why}");
    // Once one leaves, the waiting replica takes its node.
    c.finish("web-1").unwrap();
    c.schedule(&full(), 1);
    assert!(node_of(&c, "web-3").is_some());

    // Symmetry: another scheduler's pod on n2 keeps `batch` pods out of its zone (b); a batch
    // pod without any affinity of its own is kept out all the same.
    let mut c = core(vec![queue("q", 1)], &[]);
    for (n, zone) in [("n0", "a"), ("n2", "b")] {
        c.upsert_node(labelled_node(n, zone), 0);
    }
    c.observe_pods(
        "n2",
        vec![RunningPod {
            namespace: String::new(),
            labels: vec![("app".into(), "db".into())],
            anti_affinity: vec![app_term("batch", "zone")],
        }],
    );
    c.submit(app_job("batch-0", "batch", Default::default()), 0).unwrap();
    c.submit(app_job("web-0", "web", Default::default()), 0).unwrap();
    c.schedule(&full(), 0);
    assert_eq!(node_of(&c, "batch-0").as_deref(), Some("n0"));
    // Affinity to the db pod's zone: only n2 is in it.
    let near_db = wasmsched_api::PodAffinity { affinity: vec![app_term("db", "zone")], ..Default::default() };
    c.submit(app_job("cache-0", "cache", near_db), 1).unwrap();
    c.schedule(&full(), 1);
    assert_eq!(node_of(&c, "cache-0").as_deref(), Some("n2"));
    check_accounting(&c);
}

#[test]
fn required_pod_affinity_to_nothing_running_places_the_first_of_a_group_only() {
    let mut c = core(vec![queue("q", 1)], &[]);
    c.upsert_node(labelled_node("n0", "a"), 0);
    let with = |app: &str| wasmsched_api::PodAffinity { affinity: vec![app_term(app, "zone")], ..Default::default() };
    // The first `web` pod selects itself: it may go anywhere; a pod selecting nothing running
    // (and not itself) can go nowhere, and says so.
    c.submit(app_job("web-0", "web", with("web")), 0).unwrap();
    c.submit(app_job("lonely", "web", with("db")), 0).unwrap();
    c.schedule(&full(), 0);
    assert_eq!(node_of(&c, "web-0").as_deref(), Some("n0"));
    assert!(node_of(&c, "lonely").is_none());
    let why = c.explain("lonely").unwrap().to_string();
    assert!(why.contains("required pod affinity: no running pod it selects is on a node labelled zone"), "{why}");
    // A malformed term is refused at submission.
    let mut bad = with("db");
    bad.affinity[0].topology_key.clear();
    let e = c.submit(app_job("bad", "web", bad), 0).unwrap_err().to_string();
    assert!(e.contains("required pod affinity: a term has an empty topologyKey"), "{e}");
}

#[test]
fn a_running_member_relabelled_is_what_pod_affinity_sees_and_parked_work_is_retried() {
    let mut c = core(vec![queue("q", 1)], &[]);
    for (n, zone) in [("n0", "a"), ("n2", "b")] {
        c.upsert_node(labelled_node(n, zone), 0);
    }
    // A db pod runs in zone a (bin-packing picks the first node).
    c.submit(app_job("db-0", "db", Default::default()), 0).unwrap();
    c.schedule(&full(), 0);
    let db_zone_node = node_of(&c, "db-0").expect("db placed");
    // Anti-affine to db: kept out of db's zone, so it lands on the other node.
    let away = wasmsched_api::PodAffinity { anti_affinity: vec![app_term("db", "zone")], ..Default::default() };
    c.submit(app_job("batch-0", "batch", away.clone()), 1).unwrap();
    c.schedule(&full(), 1);
    let other = node_of(&c, "batch-0").expect("batch placed away from db");
    assert_ne!(other, db_zone_node);
    // Affine to a cache that does not run yet: parked.
    let near = wasmsched_api::PodAffinity { affinity: vec![app_term("cache", "zone")], ..Default::default() };
    c.submit(app_job("web-0", "web", near), 2).unwrap();
    c.schedule(&full(), 2);
    assert!(node_of(&c, "web-0").is_none());

    // The db pod is relabelled app=cache: web may now join it, and a second batch pod is no
    // longer kept out of its zone.
    assert!(c.relabel_task("db-0", vec![("app".into(), "cache".into())]).unwrap());
    assert!(!c.relabel_task("db-0", vec![("app".into(), "cache".into())]).unwrap(), "no change");
    let later = 2 + c.config.backoff_max_seconds;
    c.schedule(&full(), later);
    assert_eq!(node_of(&c, "web-0"), Some(db_zone_node.clone()), "parked work retried against the new labels");
    // Bin-packing prefers the fuller node, db's: only the old label kept batch pods away from it.
    c.finish("batch-0").unwrap();
    c.submit(app_job("batch-1", "batch", away), later).unwrap();
    c.schedule(&full(), later);
    assert_eq!(node_of(&c, "batch-1"), Some(db_zone_node), "no db pod to keep away from any more");
    assert!(matches!(c.relabel_task("nobody", Vec::new()), Err(CoreError::UnknownTask(_))));
    check_accounting(&c);
}

#[test]
fn a_gang_s_members_see_each_other_s_pod_anti_affinity() {
    let mut c = core(vec![queue("q", 1)], &[]);
    for (n, zone) in [("n0", "a"), ("n1", "a"), ("n2", "b")] {
        c.upsert_node(labelled_node(n, zone), 0);
    }
    let spread = |name: &str, members: usize| {
        let mut w = gang(name, "q", members, members, 1);
        for m in &mut w.members {
            m.labels = vec![("app".into(), name.into())];
            m.pod_affinity = Some(Box::new(wasmsched_api::PodAffinity {
                anti_affinity: vec![app_term(name, "kubernetes.io/hostname")],
                ..Default::default()
            }));
        }
        w
    };
    c.submit(spread("three", 3), 0).unwrap();
    c.submit(spread("four", 4), 0).unwrap();
    let d = c.schedule(&full(), 0);
    let mut nodes: Vec<&str> = d
        .iter()
        .filter_map(|d| match d {
            Decision::Bound { workload, node, .. } if workload == "three" => Some(node.as_str()),
            _ => None,
        })
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["n0", "n1", "n2"], "one member per node, though bin-packing would stack them");
    assert!(c.entries["four"].members.iter().all(Option::is_none), "four members cannot spread over three nodes");
    check_accounting(&c);
}

#[test]
fn preferred_pod_affinity_steers_the_node_affinity_score() {
    use wasmsched_plugin_node_affinity::NodeAffinityScore;
    let mut c = core(vec![queue("q", 1)], &[]);
    for (n, zone) in [("n0", "a"), ("n1", "b"), ("n2", "b")] {
        c.upsert_node(labelled_node(n, zone), 0);
    }
    // Bin-packing alone stacks; a heavier node-affinity score follows the preferred terms.
    let set = builder()
        .score(Arc::new(NativePlugin::<NodeAffinityScore>::new("", 1).unwrap()), 10)
        .fair_share(Arc::new(NativePlugin::<FairSharePolicy>::new("", 1).unwrap()))
        .build();
    // The db fills n1 (zone b); the cache prefers the db's zone, so n2 over n0.
    let mut db = app_job("db-0", "db", Default::default());
    db.members[0].gpu.count = 8;
    db.members[0].node_selector = vec![("kubernetes.io/hostname".into(), "n1".into())];
    c.submit(db, 0).unwrap();
    c.schedule(&set, 0);
    assert_eq!(node_of(&c, "db-0").as_deref(), Some("n1"));
    // Near the db (its zone), and web replicas preferring other nodes than each other.
    let near = wasmsched_api::PodAffinity { preferred: vec![(50, app_term("db", "zone"))], ..Default::default() };
    c.submit(app_job("cache-0", "cache", near), 1).unwrap();
    let apart = || wasmsched_api::PodAffinity {
        anti_preferred: vec![(100, app_term("web", "kubernetes.io/hostname"))],
        ..Default::default()
    };
    c.submit(app_job("web-0", "web", apart()), 1).unwrap();
    c.schedule(&set, 1);
    c.submit(app_job("web-1", "web", apart()), 2).unwrap();
    c.schedule(&set, 2);
    assert_eq!(node_of(&c, "cache-0").as_deref(), Some("n2"));
    assert_ne!(node_of(&c, "web-0"), node_of(&c, "web-1"), "the second web replica avoids the first");
    // Preferences never keep a task pending: a third and fourth replica still run.
    for i in 2..4 {
        c.submit(app_job(&format!("web-{i}"), "web", apart()), 3).unwrap();
    }
    c.schedule(&set, 3);
    assert!(node_of(&c, "web-3").is_some());
}

/// A filter that admits only nodes labelled `pool=<config>`: two configurations are two policies.
struct Pool(String);

impl wasmsched_api::Plugin for Pool {
    const NAME: &'static str = "pool";
    fn new(config: &str) -> Result<Self, String> {
        Ok(Pool(config.into()))
    }
}

impl wasmsched_api::Filter for Pool {
    fn filter(&mut self, _task: &Task, node: &Node) -> wasmsched_api::Verdict {
        match node.label("pool") == Some(self.0.as_str()) {
            true => wasmsched_api::Verdict::Fit,
            false => wasmsched_api::Verdict::unresolvable("another pool"),
        }
    }
}
wasmsched_api::declare_stages!(Pool: filter);

#[test]
fn a_new_policy_version_retries_parked_work_and_the_same_version_does_not() {
    let pool = |name: &str, version: u64| {
        PolicySet::builder().filter(Arc::new(NativePlugin::<Pool>::new(name, 1).unwrap())).version(version).build()
    };
    let mut c = SchedulerCore::new(QueueTree::new(vec![queue("q", 1)]).unwrap(), CoreConfig::default());
    let mut node = gpu_node("n", 8);
    node.labels.push(("pool".into(), "training".into()));
    c.upsert_node(node, 0);
    c.submit(job("j", "q", 0, 1), 0).unwrap();
    assert!(matches!(&c.schedule(&pool("serving", 1), 0)[..], [Decision::Unschedulable { .. }]));
    // The same version (even rebuilt) leaves it parked: nothing changed that could place it.
    for t in 1..30 {
        assert!(c.schedule(&pool("serving", 1), t).is_empty(), "no retry under the same version");
    }
    assert_eq!(c.explain("j").unwrap().attempts, 1);
    // A new version that admits the node places it in its first cycle.
    let d = c.schedule(&pool("training", 2), 30);
    assert_eq!(bound(&d), ["j"], "{d:?}");
}

/// Every node refuses the task for a reason eviction cannot change (another pool, like a taint or
/// a selector): preemption is not tried and its hint is not appended to the reasons; where
/// eviction would help, the hint stays.
#[test]
fn no_preemption_hint_where_no_eviction_could_help() {
    let mut c = core(vec![queue("q", 1)], &[]);
    let mut node = gpu_node("n", 8);
    node.labels.push(("pool".into(), "training".into()));
    c.upsert_node(node, 0);
    // The pool filter first, as a taint or selector check is: its reason is the one shown.
    let with_pool = |pool: &str, version: u64| {
        PolicySet::builder()
            .filter(Arc::new(NativePlugin::<Pool>::new(pool, 1).unwrap()))
            .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
            .score(Arc::new(NativePlugin::<AllocationScore>::new(r#"{"strategy":"most"}"#, 1).unwrap()), 1)
            .fair_share(Arc::new(NativePlugin::<FairSharePolicy>::new("", 1).unwrap()))
            .preempt(Arc::new(NativePlugin::<PriorityPreempt>::new("", 1).unwrap()))
            .version(version)
            .build()
    };
    c.submit(job("low", "q", 0, 8), 0).unwrap();
    assert_eq!(bound(&c.schedule(&with_pool("training", 1), 0)), ["low"]);
    c.submit(job("high", "q", 10, 8), 1).unwrap();
    let d = c.schedule(&with_pool("serving", 1), 1);
    assert!(evicted(&d).is_empty(), "{d:?}");
    let why = c.explain("high").unwrap();
    assert!(why.to_string().contains("another pool"), "{why}");
    assert_eq!(why.preemption, None, "no hint where eviction cannot help: {why}");
    // Same task, a pool it may use, full of lower-priority work: preemption is tried (and works).
    let d = c.schedule(&with_pool("training", 2), 2);
    assert_eq!(evicted(&d), ["low"], "{d:?}");
}

/// A core whose evictions are graceful deletions, as on Kubernetes.
fn graceful(nodes: &[(&str, u32)]) -> SchedulerCore {
    let config = CoreConfig { await_termination: true, ..CoreConfig::default() };
    let mut c = SchedulerCore::new(QueueTree::new(vec![queue("q", 1)]).unwrap(), config);
    for (name, gpus) in nodes {
        c.upsert_node(gpu_node(name, *gpus), 0);
    }
    c
}

#[test]
fn a_preemptor_waits_nominated_until_its_victims_are_gone_and_nobody_lower_takes_the_room() {
    let mut c = graceful(&[("n", 8)]);
    c.submit(job("low", "q", 0, 8), 0).unwrap();
    c.schedule(&full(), 0);
    c.submit(job("high", "q", 10, 8), 1).unwrap();
    let d = c.schedule(&full(), 1);
    assert_eq!(evicted(&d), ["low"]);
    assert!(bound(&d).is_empty(), "bound while its victim still holds the GPUs: {d:?}");
    assert_eq!(c.status("high").unwrap().phase, Phase::Preempting);
    assert!(c.explain("high").unwrap().to_string().contains("1 to terminate on n"), "{}", c.explain("high").unwrap());
    assert_eq!(c.terminating().collect::<Vec<_>>(), [("low", "n")]);
    check_accounting(&c);
    // The victim's room is in use while it terminates: the node has nothing free.
    assert_eq!(c.nodes().get(c.nodes().slot_of("n").unwrap()).unwrap().allocated.gpu_milli, 8000);
    // Someone of lower priority arriving meanwhile gets nothing, neither now nor once it is gone.
    c.submit(job("mid", "q", 5, 8), 2).unwrap();
    for t in 2..5 {
        assert!(bound(&c.schedule(&full(), t)).is_empty(), "t={t}");
    }
    assert!(c.terminated("low"));
    assert!(!c.terminated("low"), "reported once");
    check_accounting(&c);
    let d = c.schedule(&full(), 5);
    assert_eq!(bound(&d), ["high"], "{d:?}");
    assert_eq!(c.status("mid").unwrap().phase, Phase::Pending);
    check_accounting(&c);
}

#[test]
fn a_higher_priority_arrival_may_take_the_room_kept_for_a_nominated_workload() {
    let mut c = graceful(&[("n0", 8), ("n1", 8)]);
    c.submit(job("low0", "q", 0, 8), 0).unwrap();
    c.submit(job("low1", "q", 0, 8), 0).unwrap();
    c.schedule(&full(), 0);
    let mut pair = gang("pair", "q", 2, 2, 8);
    pair.priority = 10;
    c.submit(pair, 1).unwrap();
    let d = c.schedule(&full(), 1);
    assert_eq!(evicted(&d).len(), 2, "{d:?}");
    assert!(bound(&d).is_empty());
    // One victim is gone: its room is kept for the gang, not for equal or lower priority.
    c.terminated("low0");
    c.submit(job("peer", "q", 10, 8), 2).unwrap();
    assert!(bound(&c.schedule(&full(), 2)).is_empty());
    check_accounting(&c);
    // Work that outranks the gang takes it.
    c.submit(job("top", "q", 20, 8), 3).unwrap();
    let d = c.schedule(&full(), 3);
    assert_eq!(bound(&d), ["top"], "{d:?}");
    check_accounting(&c);
    // The gang's other victim goes: one node is not enough, it does not run half placed.
    c.terminated("low1");
    let d = c.schedule(&full(), 4);
    assert!(!bound(&d).iter().any(|t| t.starts_with("pair")), "{d:?}");
    check_accounting(&c);
}

/// Two full nodes: `low` on n0, `guard` (not preemptible) on n1; `high` has evicted `low` and
/// waits nominated while it terminates.
fn high_waits_for_low_on_n0() -> SchedulerCore {
    let mut c = graceful(&[("n0", 8), ("n1", 8)]);
    c.submit(job("low", "q", 0, 8), 0).unwrap();
    c.submit(job("guard", "q", 0, 8), 0).unwrap();
    c.schedule(&full(), 0);
    c.set_preemptible("guard", false).unwrap();
    c.submit(job("high", "q", 10, 8), 1).unwrap();
    assert_eq!(evicted(&c.schedule(&full(), 1)), ["low"]);
    c
}

#[test]
fn a_victim_that_never_goes_does_not_stop_its_preemptor_running_elsewhere() {
    let mut c = high_waits_for_low_on_n0();
    // A finalizer keeps the victim; meanwhile the other node frees up.
    c.finish("guard").unwrap();
    let at = c.next_wakeup().expect("the nominated workload is retried after its back-off");
    let d = c.schedule(&full(), at);
    assert_eq!(bound(&d), ["high"], "placed where there is room, evicting nothing more: {d:?}");
    assert!(evicted(&d).is_empty());
    // When the victim finally goes, its room is everyone's: here the evicted job's, back in its
    // queue (the core re-queues evicted work).
    c.terminated("low");
    assert_eq!(bound(&c.schedule(&full(), at + 1)), ["low"]);
    check_accounting(&c);
}

#[test]
fn a_nominated_node_that_disappears_sends_the_preemptor_elsewhere() {
    let mut c = high_waits_for_low_on_n0();
    c.remove_node("n0", 2);
    assert_eq!(c.terminating().count(), 0, "its pods went with it");
    c.upsert_node(gpu_node("n2", 8), 2);
    let d = c.schedule(&full(), 2);
    assert_eq!(bound(&d), ["high"], "{d:?}");
    check_accounting(&c);
}

#[test]
fn a_broken_gang_s_members_terminate_too_and_a_lost_node_s_do_not() {
    let mut c = graceful(&[("n0", 8), ("n1", 8)]);
    c.submit(gang("g", "q", 2, 2, 8), 0).unwrap();
    c.schedule(&full(), 0);
    let d = c.remove_node("n0", 1);
    assert_eq!(evicted(&d).len(), 2, "the node's member is lost, the other breaks: {d:?}");
    assert_eq!(c.terminating().collect::<Vec<_>>(), [("g-1", "n1")], "only the broken member is stopped");
    check_accounting(&c);
    c.submit(job("next", "q", 0, 8), 2).unwrap();
    assert!(bound(&c.schedule(&full(), 2)).is_empty());
    c.terminated("g-1");
    assert_eq!(bound(&c.schedule(&full(), 3)), ["next"]);
}
