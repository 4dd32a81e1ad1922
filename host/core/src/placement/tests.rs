use std::sync::Arc;

use wasmsched_api::{GpuDevice, GpuRequest, Node, Resources};

use super::*;
use crate::native::NativePlugin;

#[test]
fn feasible_nodes_to_find_follows_kube_scheduler() {
    assert_eq!(feasible_nodes_to_find(50, None), 50);
    assert_eq!(feasible_nodes_to_find(1000, None), 420);
    assert_eq!(feasible_nodes_to_find(5000, None), 500);
    assert_eq!(feasible_nodes_to_find(20_000, None), 1000, "floor of 5 %");
    assert_eq!(feasible_nodes_to_find(1000, Some(1)), 100, "never fewer than 100");
    assert_eq!(feasible_nodes_to_find(1000, Some(100)), 1000);
    assert_eq!(feasible_nodes_to_find(1000, Some(0)), 420, "0 means adaptive");
}

fn table(n: usize, gpus_every: usize) -> NodeTable {
    let mut t = NodeTable::new();
    for i in 0..n {
        let gpus = u32::from(i % gpus_every == 0);
        t.upsert(Node {
            name: format!("n{i:04}"),
            allocatable: Resources {
                cpu_milli: 8000,
                memory_bytes: 1 << 36,
                gpu_milli: u64::from(gpus) * 1000,
                extended: Default::default(),
            },
            gpus: (0..gpus).map(|g| GpuDevice { index: g, free_milli: 1000, ..Default::default() }).collect(),
            ..Default::default()
        });
    }
    t
}

fn set() -> PolicySet {
    PolicySet::builder()
        .filter(Arc::new(NativePlugin::<wasmsched_plugin_resource_fit::ResourceFit>::new("", 1).unwrap()))
        .build()
}

#[test]
fn sampling_stops_early_and_rotates() {
    let t = table(1000, 1);
    let task = Task::default();
    let a = place_sampled(&set(), &t, &task, 0, 0, 100);
    assert_eq!(a.examined, 100);
    assert_eq!(a.result.as_ref().unwrap().node, 0);
    let b = place_sampled(&set(), &t, &task, 0, 950, 100);
    assert_eq!(b.examined, 100);
    assert_eq!(b.result.unwrap().node, 0, "the window wraps: slots 950..999 and 0..49, lowest slot wins ties");
    let c = place_sampled(&set(), &t, &task, 0, 300, 100);
    assert_eq!(c.result.unwrap().node, 300);
}

#[test]
fn sampling_keeps_looking_when_few_nodes_fit_and_matches_place_when_exhaustive() {
    let t = table(1000, 10);
    let gpu = Task { gpu: GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
    let s = place_sampled(&set(), &t, &gpu, 0, 0, 50);
    // Slots 0, 10, ..., 490 fit: the 50th feasible node is the 491st examined.
    assert_eq!(s.examined, 491, "only every 10th node fits");
    assert_eq!(s.result.unwrap().feasible, 50);
    let big = Task { gpu: GpuRequest { count: 2, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
    let s = place_sampled(&set(), &t, &big, 0, 123, 100);
    assert_eq!(s.examined, 1000);
    let e = s.result.unwrap_err();
    assert_eq!(e, place(&set(), &t, &big, 0).unwrap_err());
    assert_eq!(e.diagnosis.candidates, 1000);
}

/// Filter calls a scan of `n` nodes makes when every `every`-th fits (0: none), looking for `want`.
fn calls(n: usize, every: usize, want: usize) -> usize {
    let fits_before = |k: usize| if every == 0 { 0 } else { k.div_ceil(every) };
    let (mut examined, mut calls) = (0, 0);
    while examined < n && fits_before(examined) < want {
        examined += next_window(want - fits_before(examined), examined, fits_before(examined)).min(n - examined);
        calls += 1;
    }
    calls
}

#[test]
fn a_sparse_cluster_costs_a_few_filter_calls_not_one_per_32_nodes() {
    assert_eq!(calls(5000, 1, 500), 1, "everything fits: one call");
    // Windows of the missing count (at least 32) took 1 + 441 / 32 = 15 calls here.
    assert!(calls(5000, 10, 50) <= 3, "{}", calls(5000, 10, 50));
    assert!(calls(5000, 3, 500) <= 3, "{}", calls(5000, 3, 500));
    // Nothing fits: the window doubles, ~log2(5000 / 32) calls instead of 157.
    assert!(calls(5000, 0, 500) <= 9, "{}", calls(5000, 0, 500));
}

/// The sampled scan must pick exactly what placing among the first `find` feasible nodes in scan
/// order picks, whatever sizes the filter calls had: checked against a node-by-node scan.
#[test]
fn sampling_places_among_the_first_feasible_nodes_in_scan_order() {
    let mut t = NodeTable::new();
    for i in 0..700u64 {
        let gpu = i % 3 == 0 || i % 7 == 0;
        t.upsert(Node {
            name: format!("n{i:04}"),
            allocatable: Resources {
                cpu_milli: 8000,
                memory_bytes: 1 << 36,
                gpu_milli: if gpu { 1000 } else { 0 },
                extended: Default::default(),
            },
            allocated: Resources { cpu_milli: (i * 37 % 8) * 1000, ..Default::default() },
            gpus: if gpu {
                vec![GpuDevice { index: 0, free_milli: [1000, 0, 500][(i % 5 % 3) as usize], ..Default::default() }]
                    .into()
            } else {
                Vec::new().into()
            },
            ..Default::default()
        });
    }
    let occupied = t.occupied().to_vec();
    let cpu = Task { request: Resources { cpu_milli: 3000, ..Default::default() }, ..Default::default() };
    let gpu = Task { gpu: GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
    let scored = {
        let score = NativePlugin::<wasmsched_plugin_allocation_score::AllocationScore>::new("", 1).unwrap();
        let fit = NativePlugin::<wasmsched_plugin_resource_fit::ResourceFit>::new("", 1).unwrap();
        PolicySet::builder().filter(Arc::new(fit)).score(Arc::new(score), 1).build()
    };
    for task in [&cpu, &gpu] {
        for (start, find) in [(0, 100), (123, 100), (650, 40), (5, 1), (0, 700), (399, 250)] {
            let sampled = place_sampled(&scored, &t, task, 0, start, find);
            let order: Vec<Slot> = (0..occupied.len()).map(|i| occupied[(start + i) % occupied.len()]).collect();
            let verdicts = filter_each(&scored, &t, task, 0, &order).unwrap();
            let fits: Vec<usize> = (0..order.len()).filter(|&i| verdicts[i].is_none()).take(find).collect();
            let examined = if fits.len() == find { fits[find - 1] + 1 } else { order.len() };
            assert_eq!(sampled.examined, examined, "start {start}, find {find}");
            // Ties go to the lowest slot, wherever the scan started.
            let mut chosen: Vec<Slot> = fits.iter().map(|&i| order[i]).collect();
            chosen.sort_unstable();
            assert_eq!(sampled.result, place_among(&scored, &t, task, 0, &chosen), "start {start}, find {find}");
        }
    }
}

#[test]
fn per_node_verdicts_scores_and_devices_answer_an_extender() {
    // n0000 has a GPU, n0001 none, n0002 a GPU but cordoned; slot 9 does not exist.
    let mut t = table(3, 2);
    t.upsert(Node { name: "n0002".into(), unschedulable: true, ..t.get(0).unwrap().clone() });
    let gpu = Task { gpu: GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
    let v = filter_each(&set(), &t, &gpu, 0, &[0, 1, 2, 9]).unwrap();
    assert_eq!(v[0], None);
    assert_eq!(v[1], Some(("node has no GPU (resource-fit)".into(), true)));
    assert_eq!(v[2], Some(("node is cordoned (resource-fit)".into(), true)));
    assert_eq!(v[3], Some(("node not found".into(), true)));
    let score = Arc::new(
        NativePlugin::<wasmsched_plugin_allocation_score::AllocationScore>::new(r#"{"strategy":"least"}"#, 1).unwrap(),
    );
    let scored = PolicySet::builder().score(score, 2).build();
    let totals = score_each(&scored, &t, &gpu, 0, &[0, 1]).unwrap();
    assert_eq!(totals.len(), 2);
    assert!(totals.iter().all(|s| s % 2 == 0), "weighted: {totals:?}");
    assert_eq!(select_devices_on(&set(), &t, &gpu, 0, 0).unwrap().len(), 1);
    assert!(select_devices_on(&set(), &t, &gpu, 0, 1).is_err(), "no GPU there");
}

/// On a two-vendor cluster the sampled scan cuts its windows from nodes of the task's kind: the
/// result is still the first `find` feasible nodes in scan order (the host's check counted as a
/// filter), and a pod of either kind costs the filters one call where a one-kind cluster would.
#[test]
fn a_kind_restricted_scan_fills_each_filter_call_with_nodes_of_its_kind() {
    let mut t = NodeTable::new();
    t.set_accelerator_kinds(vec![wasmsched_api::accelerators::Kind {
        name: "amd".into(),
        resources: vec!["amd.com/gpu".into()],
    }]);
    for i in 0..1000u32 {
        // Every other node AMD's; every fifth of each kind fully used.
        let amd = i % 2 == 1;
        let kind: wasmsched_api::accelerators::KindName = if amd { "amd".into() } else { Default::default() };
        let free_milli = if i % 10 < 2 { 0 } else { 1000 };
        t.upsert(Node {
            name: format!("n{i:04}"),
            allocatable: Resources {
                cpu_milli: 8000,
                memory_bytes: 1 << 36,
                gpu_milli: if amd { 0 } else { 1000 },
                extended: if amd { vec![("amd.com/gpu".into(), 1)].into() } else { Default::default() },
            },
            gpus: vec![GpuDevice { index: 0, free_milli, kind, ..Default::default() }].into(),
            ..Default::default()
        });
    }
    // Counts its calls: the cost a Wasm filter pays per call (the task lowered again).
    let fit = crate::testing::Counting::new(Arc::new(
        NativePlugin::<wasmsched_plugin_resource_fit::ResourceFit>::new("", 1).unwrap(),
    ));
    let set = PolicySet::builder().filter(fit.clone()).build();
    let nvidia = Task { gpu: GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
    let mut amd = nvidia.clone();
    amd.gpu.kind = "amd".into();
    amd.request.extended = vec![("amd.com/gpu".into(), 1)].into();
    let occupied = t.occupied().to_vec();
    for task in [&nvidia, &amd] {
        for (start, find) in [(0, 100), (777, 100), (3, 1), (0, 1000), (450, 300)] {
            let before = fit.counts().0;
            let sampled = place_sampled(&set, &t, task, 0, start, find);
            let calls = fit.counts().0 - before;
            let order: Vec<Slot> = (0..occupied.len()).map(|i| occupied[(start + i) % occupied.len()]).collect();
            let verdicts = filter_each(&set, &t, task, 0, &order).unwrap();
            let fits: Vec<usize> = (0..order.len()).filter(|&i| verdicts[i].is_none()).take(find).collect();
            let examined = if fits.len() == find { fits[find - 1] + 1 } else { order.len() };
            assert_eq!(sampled.examined, examined, "start {start}, find {find}");
            let mut chosen: Vec<Slot> = fits.iter().map(|&i| order[i]).collect();
            chosen.sort_unstable();
            assert_eq!(sampled.result, place_among(&set, &t, task, 0, &chosen), "start {start}, find {find}");
            if find == 100 {
                // 125 nodes of the kind in the first window, 100 of them free: one call, as on a
                // cluster of one kind (windows cut from every node needed two).
                assert_eq!(calls, 1, "start {start}: {calls} filter calls");
            }
        }
    }
    let none =
        place_sampled(&set, &t, &Task { gpu: GpuRequest { count: 2, ..amd.gpu.clone() }, ..amd.clone() }, 0, 0, 100);
    let d = none.result.unwrap_err().diagnosis;
    assert_eq!(d.candidates, 1000);
    assert_eq!(d.rejections.get(&(filter::HOST_CHECK.to_string(), "too few amd devices".into())), Some(&(1000, true)));
}

/// Walking the task's kind's slot list ([`scan::KindNodes`]) gives what walking every node with
/// the kind check gives ([`scan::EveryNode`]): the same placement, nodes examined and diagnosis
/// (rejections counted per reason, candidates), for random clusters of two kinds with nodes of
/// both, unhealthy devices, nodes coming and going, any start and any count to find.
#[test]
fn the_kind_s_slot_list_scans_exactly_like_every_node() {
    use wasmsched_api::GpuHealth;
    let mut rng = 11u64;
    let mut next = |below: u64| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) % below.max(1)
    };
    let mut t = NodeTable::new();
    t.set_accelerator_kinds(vec![wasmsched_api::accelerators::Kind {
        name: "amd".into(),
        resources: vec!["amd.com/gpu".into()],
    }]);
    let set = {
        let fit = NativePlugin::<wasmsched_plugin_resource_fit::ResourceFit>::new("", 1).unwrap();
        let score = NativePlugin::<wasmsched_plugin_allocation_score::AllocationScore>::new("", 1).unwrap();
        PolicySet::builder().filter(Arc::new(fit)).score(Arc::new(score), 1).build()
    };
    let (mut compared, mut refused) = (0, 0);
    for round in 0..60u32 {
        for _ in 0..20 {
            let i = next(400);
            if next(10) == 0 {
                t.remove(&format!("n{i}"));
                continue;
            }
            let (gpus, amd_from) = (next(9) as u32, next(12) as u32);
            let mut extended: Vec<(wasmsched_api::ResourceName, u64)> = Vec::new();
            if gpus > amd_from {
                extended.push(("amd.com/gpu".into(), u64::from(gpus - amd_from)));
            }
            t.upsert(Node {
                name: format!("n{i}"),
                allocatable: Resources {
                    cpu_milli: 64_000,
                    memory_bytes: 1 << 38,
                    gpu_milli: u64::from(gpus.min(amd_from)) * 1000,
                    extended: extended.into(),
                },
                gpus: (0..gpus)
                    .map(|g| GpuDevice {
                        index: g,
                        free_milli: if next(3) == 0 { 0 } else { 1000 },
                        kind: if g >= amd_from { "amd".into() } else { Default::default() },
                        health: if next(15) == 0 { GpuHealth::Unhealthy } else { GpuHealth::Healthy },
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            });
        }
        let amd = next(2) == 0;
        let count = if round % 5 == 4 { 9 } else { 1 + next(6) as u32 };
        let mut task =
            Task { gpu: GpuRequest { count, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
        if amd {
            task.gpu.kind = "amd".into();
            task.request.extended = vec![("amd.com/gpu".into(), u64::from(count))].into();
        }
        let n = t.len();
        let (start, find) = (next(n as u64 + 3) as usize, [1usize, 7, 50, 400][round as usize % 4]);
        let by_kind = place_sampled(&set, &t, &task, 0, start, find);
        let every_node = scan::EveryNode::new(t.occupied(), start, filter::KindCheck::new(&t, &task));
        let every = sample(&set, &t, &task, 0, every_node, find);
        // The cycle's path: its own copy of the occupied slots, found to be all of them.
        let copied = t.occupied().to_vec();
        assert_eq!(place_sampled_among(&set, &t, &task, 0, &copied, start, find), by_kind, "round {round}");
        assert_eq!(by_kind.examined, every.examined, "round {round}");
        assert_eq!(by_kind.result, every.result, "round {round}");
        compared += 1;
        refused += usize::from(every.result.is_err());
    }
    assert!(compared == 60 && refused > 3 && refused < 50, "{refused} of {compared} refused");
}
