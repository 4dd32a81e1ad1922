//! The reference policies give identical verdicts, scores and placements natively and as
//! components, on randomised clusters that change between calls (exercising the mirror deltas),
//! whether the components are called through `placement` (usage changes along, brief tasks) or
//! through the plain stage exports.

use std::sync::Arc;

use wasmsched_core::{CallContext, NativePlugin, NodeTable, PolicyPlugin, PolicySet, bind, place, place_sampled};
use wasmsched_plugin_allocation_score::AllocationScore;
use wasmsched_plugin_node_affinity::NodeAffinityScore;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_runtime::{Runtime, RuntimeConfig};
use wasmsched_sim::generate::{self, Rng};

struct Pair {
    native: Arc<dyn PolicyPlugin>,
    wasm: Arc<dyn PolicyPlugin>,
}

/// The same component loaded on a runtime that ignores `placement`.
fn plain_calls(rt: &Runtime) -> Vec<Arc<dyn PolicyPlugin>> {
    pairs(rt).into_iter().map(|p| p.wasm).collect()
}

fn pairs(rt: &Runtime) -> Vec<Pair> {
    [
        wasmsched_plugins::RESOURCE_FIT,
        wasmsched_plugins::LEAST_ALLOCATED,
        wasmsched_plugins::MOST_ALLOCATED,
        wasmsched_plugins::NODE_AFFINITY,
    ]
    .iter()
    .map(|b| {
        let wasm: Arc<dyn PolicyPlugin> =
            Arc::new(rt.load(b.wasm, crate::unhurried(b.name).with_config(b.config)).unwrap());
        let native: Arc<dyn PolicyPlugin> = match b.name {
            "resource-fit" => Arc::new(NativePlugin::<ResourceFit>::new(b.config, 2).unwrap()),
            "node-affinity" => Arc::new(NativePlugin::<NodeAffinityScore>::new(b.config, 2).unwrap()),
            _ => Arc::new(NativePlugin::<AllocationScore>::new(b.config, 2).unwrap().named(b.name)),
        };
        Pair { native, wasm }
    })
    .collect()
}

/// A numeric `rack` label on every other node, for `Gt`/`Lt`/`DoesNotExist` requirements.
fn add_racks(table: &mut NodeTable) {
    let slots: Vec<u32> = table.slots().collect();
    for s in slots.into_iter().step_by(2) {
        table.update(s, |n| {
            n.labels.push(("rack".into(), (s % 10).to_string()));
            n.labels.sort();
        });
    }
}

/// Four tasks in ten get random node affinity.
fn with_affinity(rng: &mut Rng, mut task: wasmsched_api::Task) -> wasmsched_api::Task {
    if rng.percent(40) {
        task.node_affinity = generate::node_affinity(rng);
    }
    task
}

/// Random edits: change allocations (usage-only changes, which go along with `placement` calls or
/// as `mirror-usage` calls), cordon, remove and add nodes.
fn churn(rng: &mut Rng, table: &mut NodeTable, round: usize) {
    let slots: Vec<u32> = table.slots().collect();
    for _ in 0..rng.below(20) {
        let s = *rng.pick(&slots);
        if table.get(s).is_none() {
            continue;
        }
        match rng.below(4) {
            0 => {
                table.update_usage(s, |n| n.allocated.cpu_milli = rng.below(n.allocatable.cpu_milli + 1));
            }
            1 => {
                table.update(s, |n| n.unschedulable = !n.unschedulable);
            }
            2 => {
                let name = table.get(s).unwrap().name.clone();
                table.remove(&name);
            }
            _ => {
                table.update_usage(s, |n| {
                    n.gpus.update(|gpus| {
                        if let Some(g) = gpus.first_mut() {
                            g.free_milli = 0;
                        }
                    });
                });
            }
        }
    }
    for i in 0..rng.below(5) {
        table.upsert(generate::node(rng, format!("added-{round}-{i}")));
    }
}

#[test]
fn native_and_wasm_agree_on_random_clusters() {
    let rt = Runtime::new(RuntimeConfig { workers: 2, ..Default::default() }).unwrap();
    let pairs = pairs(&rt);
    let plain_rt = Runtime::new(RuntimeConfig { workers: 2, placement_calls: false, ..Default::default() }).unwrap();
    let plain = plain_calls(&plain_rt);
    let mut compared = 0;
    for seed in 0..6u64 {
        let mut rng = Rng::new(seed);
        let mut table = generate::cluster(&mut rng, 400);
        add_racks(&mut table);
        for round in 0..25 {
            let task = generate::task(&mut rng, format!("t-{seed}-{round}"));
            let task = with_affinity(&mut rng, task);
            let worker = round % 2;
            let ctx = CallContext { worker, nodes: &table };
            let slots: Vec<u32> = table.slots().collect();
            for (pair, plain) in pairs.iter().zip(&plain) {
                if pair.native.stages().contains(&wasmsched_api::Stage::Filter) {
                    let a = pair.native.filter(ctx, &task, &slots).unwrap();
                    let b = pair.wasm.filter(ctx, &task, &slots).unwrap();
                    assert_eq!(a, b, "{} filter differs (seed {seed}, round {round})", pair.wasm.name());
                    let c = plain.filter(ctx, &task, &slots).unwrap();
                    assert_eq!(a, c, "{} filter differs in plain calls (seed {seed}, round {round})", plain.name());
                } else {
                    let a = pair.native.score(ctx, &task, &slots).unwrap();
                    let b = pair.wasm.score(ctx, &task, &slots).unwrap();
                    assert_eq!(a, b, "{} score differs (seed {seed}, round {round})", pair.wasm.name());
                    let c = plain.score(ctx, &task, &slots).unwrap();
                    assert_eq!(a, c, "{} score differs in plain calls (seed {seed}, round {round})", plain.name());
                }
                compared += slots.len();
            }
            churn(&mut rng, &mut table, round);
        }
    }
    assert!(compared > 20_000, "compared {compared} node verdicts");
}

#[test]
fn tasks_asking_only_for_extended_resources_get_the_same_verdicts_counted_brief_or_in_full() {
    // A task whose only list is its extended resources (DRA claims counted by device class)
    // goes to a component as `placement-counted`'s `counted` form, through the plain exports in
    // full: the guest must see every name and amount, including names no node has.
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let plain_rt = Runtime::new(RuntimeConfig { placement_calls: false, ..Default::default() }).unwrap();
    let (pair, plain) = (&pairs(&rt)[0], &plain_calls(&plain_rt)[0]);
    let class = |c: &str| format!("deviceclass.resource.kubernetes.io/{c}");
    let mut rng = Rng::new(7);
    let mut table = generate::cluster(&mut rng, 200);
    let slots: Vec<u32> = table.slots().collect();
    for &s in &slots {
        let gpus = rng.below(9);
        table.update(s, |n| {
            n.allocatable.extended.push((class("gpu.nvidia.com").as_str().into(), gpus));
            n.allocatable.extended.sort();
        });
    }
    let (mut fits, mut short) = (0, 0);
    for round in 0..40 {
        let mut task = generate::task(&mut rng, format!("t{round}"));
        task.gpu = Default::default();
        (task.node_selector, task.tolerations) = (Vec::new(), Vec::new());
        let mut extended = vec![(class("gpu.nvidia.com"), 1 + rng.below(8))];
        if round % 3 == 0 {
            extended.push(("rdma/hca".into(), rng.below(3)));
        }
        if round % 10 == 9 {
            extended.push((class("nowhere"), 1));
        }
        extended.sort();
        task.request.extended = extended.iter().map(|(n, v)| (n.as_str().into(), *v)).collect();
        let ctx = CallContext { worker: 0, nodes: &table };
        let a = pair.native.filter(ctx, &task, &slots).unwrap();
        assert_eq!(a, pair.wasm.filter(ctx, &task, &slots).unwrap(), "round {round}: counted");
        assert_eq!(a, plain.filter(ctx, &task, &slots).unwrap(), "round {round}: in full");
        fits += a.codes.iter().filter(|&&c| c == 0).count();
        short += a.codes.iter().filter(|&&c| c != 0).count();
        if round % 10 == 9 {
            assert!(a.codes.iter().all(|&c| c != 0), "round {round}: no node has the class");
        }
        // Take what the task asked of a node that fits, as a bind would.
        if let Some(k) = a.codes.iter().position(|&c| c == 0) {
            table.update_usage(slots[k], |n| n.allocated.saturating_add_assign(&task.request));
        }
    }
    assert!(fits > 100 && short > 100, "{fits} fits, {short} shortages");
}

#[test]
fn native_and_wasm_place_the_same_tasks_on_the_same_nodes() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let pairs = pairs(&rt);
    let set = |pick: fn(&Pair) -> Arc<dyn PolicyPlugin>| {
        PolicySet::builder()
            .filter(pick(&pairs[0]))
            .score(pick(&pairs[1]), 1)
            .score(pick(&pairs[2]), 2)
            .score(pick(&pairs[3]), 2)
            .build()
    };
    let (native, wasm) = (set(|p| p.native.clone()), set(|p| p.wasm.clone()));
    let mut rng = Rng::new(42);
    let mut table = generate::cluster(&mut rng, 300);
    add_racks(&mut table);
    let (mut placed, mut refused) = (0, 0);
    for i in 0..300 {
        let task = generate::task(&mut rng, format!("t{i}"));
        let task = with_affinity(&mut rng, task);
        let a = place(&native, &table, &task, 0);
        let b = place(&wasm, &table, &task, 0);
        assert_eq!(a, b, "task {i}");
        match a {
            Ok(p) => {
                assert!(task.node_affinity.allows(table.get(p.node).unwrap()), "task {i} placed against its affinity");
                table.update(p.node, |n| bind(n, &task, &p.devices)).unwrap().expect("placement must be bindable");
                placed += 1;
            }
            Err(e) => {
                assert!(e.diagnosis.candidates > 0 && !e.diagnosis.rejections.is_empty(), "{e}");
                refused += 1;
            }
        }
    }
    assert!(placed > 100 && refused > 0, "placed {placed}, refused {refused}");
}

#[test]
fn sampled_placements_agree_whether_the_filter_stops_at_enough_fits_or_answers_every_node() {
    // Sampling asks the last filter to stop at the feasible nodes it still needs: natively and
    // through `placement` it stops, through the plain exports it answers every node. Placements
    // and the nodes examined must not depend on it.
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let plain_rt = Runtime::new(RuntimeConfig { placement_calls: false, ..Default::default() }).unwrap();
    let pairs = pairs(&rt);
    let plain = plain_calls(&plain_rt);
    let set = |filter: &Arc<dyn PolicyPlugin>, score: &Arc<dyn PolicyPlugin>| {
        PolicySet::builder().filter(filter.clone()).score(score.clone(), 1).build()
    };
    let sets = [
        set(&pairs[0].native, &pairs[2].native),
        set(&pairs[0].wasm, &pairs[2].wasm),
        set(&plain[0], &plain[2]),
        // Two filters: only the last may stop.
        PolicySet::builder()
            .filter(pairs[0].wasm.clone())
            .filter(pairs[0].native.clone())
            .score(pairs[2].native.clone(), 1)
            .build(),
    ];
    let mut rng = Rng::new(7);
    let mut table = generate::cluster(&mut rng, 400);
    let total = table.len();
    let (mut start, mut placed) = (0, 0);
    for i in 0..250 {
        let task = generate::task(&mut rng, format!("s{i}"));
        let find = [1, 5, 40, 120][i % 4];
        let answers: Vec<_> = sets.iter().map(|s| place_sampled(s, &table, &task, 0, start, find)).collect();
        for (k, other) in answers.iter().enumerate().skip(1) {
            assert_eq!(other.result, answers[0].result, "task {i}, set {k}");
            assert_eq!(other.examined, answers[0].examined, "task {i}, set {k}");
        }
        start = (start + answers[0].examined) % total;
        if let Ok(p) = &answers[0].result {
            table.update_usage(p.node, |n| bind(n, &task, &p.devices)).unwrap().expect("bindable");
            placed += 1;
        }
    }
    assert!(placed > 100, "placed {placed}");
}

#[test]
fn reusing_filter_verdicts_changes_no_placement() {
    // Tasks drawn from a few specs (as replicas of a few Deployments are), so verdicts are reused,
    // on a cluster every placement changes; with and without reuse, as components.
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let pairs = pairs(&rt);
    let reusing = PolicySet::builder().filter(pairs[0].wasm.clone()).score(pairs[2].wasm.clone(), 1).build();
    let asking = reusing.without_verdict_reuse();
    let mut rng = Rng::new(7);
    let mut table = generate::cluster(&mut rng, 300);
    add_racks(&mut table);
    let specs: Vec<wasmsched_api::Task> = (0..6)
        .map(|i| {
            let task = generate::task(&mut rng, format!("spec{i}"));
            with_affinity(&mut rng, task)
        })
        .collect();
    let mut placed = 0;
    for i in 0..400 {
        let task = wasmsched_api::Task { id: format!("t{i}"), ..specs[rng.below(specs.len() as u64) as usize].clone() };
        let a = place(&reusing, &table, &task, 0);
        let b = place(&asking, &table, &task, 0);
        assert_eq!(a, b, "task {i}");
        if let Ok(p) = a {
            table.update(p.node, |n| bind(n, &task, &p.devices)).unwrap().expect("placement must be bindable");
            placed += 1;
        }
        if i % 50 == 49 {
            churn(&mut rng, &mut table, i);
        }
    }
    let (reused, asked) = reusing.verdict_counts();
    assert!(placed > 50, "placed {placed}");
    assert!(reused > asked, "most verdicts were reused: {reused} reused, {asked} asked");
}

/// `node` with its devices of kind `amd` (all, or the upper half: a node of two kinds), counted as
/// `amd.com/gpu` as a device plugin would.
fn make_amd(node: &mut wasmsched_api::Node, half: bool) {
    let n = node.gpus.len();
    let from = if half { n / 2 } else { 0 };
    let amd = (n - from) as u64;
    node.allocatable.gpu_milli = from as u64 * u64::from(wasmsched_api::GPU_MILLI);
    node.allocatable.extended.push(("amd.com/gpu".into(), amd));
    node.allocatable.extended.sort();
    node.gpus.update(|gpus| {
        for g in gpus.iter_mut().skip(from) {
            g.kind = "amd".into();
            g.model = "MI300X".into();
        }
    });
}

/// An AMD task: whole devices of kind `amd`, asked as `amd.com/gpu`.
fn as_amd(mut task: wasmsched_api::Task) -> wasmsched_api::Task {
    task.gpu.kind = "amd".into();
    task.gpu.milli_per_gpu = wasmsched_api::GPU_MILLI;
    task.gpu.models.clear();
    task.request.gpu_milli = 0;
    task.request.extended.push(("amd.com/gpu".into(), u64::from(task.gpu.count)));
    task.request.extended.sort();
    task
}

/// With a second accelerator kind (whole AMD nodes and nodes of both kinds), the components learn
/// each device's kind through the `accelerators` import and each task's from its resources: their
/// verdicts, scores and placements equal the native plugins', which read the kinds directly.
#[test]
fn native_and_wasm_agree_with_two_accelerator_kinds() {
    let rt = Runtime::new(RuntimeConfig { workers: 2, ..Default::default() }).unwrap();
    let pairs = pairs(&rt);
    let plain_rt = Runtime::new(RuntimeConfig { workers: 2, placement_calls: false, ..Default::default() }).unwrap();
    let plain = plain_calls(&plain_rt);
    let set = |pick: fn(&Pair) -> Arc<dyn PolicyPlugin>| {
        PolicySet::builder().filter(pick(&pairs[0])).score(pick(&pairs[1]), 1).score(pick(&pairs[2]), 2).build()
    };
    let (native, wasm) = (set(|p| p.native.clone()), set(|p| p.wasm.clone()));
    let (mut amd_placed, mut compared) = (0, 0);
    for seed in 0..4u64 {
        let mut rng = Rng::new(100 + seed);
        let mut table = generate::cluster(&mut rng, 300);
        table.set_accelerator_kinds(vec![wasmsched_api::accelerators::Kind {
            name: "amd".into(),
            resources: vec!["amd.com/gpu".into()],
        }]);
        let slots: Vec<u32> = table.slots().collect();
        for (i, &s) in slots.iter().enumerate() {
            if table.get(s).is_some_and(|n| n.gpus.len() >= 2) && i % 3 != 0 {
                table.update(s, |n| make_amd(n, i % 3 == 2));
            }
        }
        for round in 0..60 {
            let task = generate::task(&mut rng, format!("k-{seed}-{round}"));
            let task = if task.gpu.count > 0 && rng.percent(50) { as_amd(task) } else { task };
            let ctx = CallContext { worker: round % 2, nodes: &table };
            let slots: Vec<u32> = table.slots().collect();
            for (pair, plain) in pairs.iter().zip(&plain) {
                if pair.native.stages().contains(&wasmsched_api::Stage::Filter) {
                    let a = pair.native.filter(ctx, &task, &slots).unwrap();
                    assert_eq!(
                        a,
                        pair.wasm.filter(ctx, &task, &slots).unwrap(),
                        "{} (seed {seed}, round {round})",
                        pair.wasm.name()
                    );
                    assert_eq!(
                        a,
                        plain.filter(ctx, &task, &slots).unwrap(),
                        "{} plain (seed {seed}, round {round})",
                        plain.name()
                    );
                } else {
                    let a = pair.native.score(ctx, &task, &slots).unwrap();
                    assert_eq!(
                        a,
                        pair.wasm.score(ctx, &task, &slots).unwrap(),
                        "{} (seed {seed}, round {round})",
                        pair.wasm.name()
                    );
                    assert_eq!(
                        a,
                        plain.score(ctx, &task, &slots).unwrap(),
                        "{} plain (seed {seed}, round {round})",
                        plain.name()
                    );
                }
                compared += slots.len();
            }
            let (a, b) = (place(&native, &table, &task, 0), place(&wasm, &table, &task, 0));
            assert_eq!(a, b, "placement (seed {seed}, round {round})");
            if let Ok(p) = a {
                let node = table.get(p.node).unwrap();
                for d in &p.devices {
                    let device = node.gpus.iter().find(|g| g.index == d.gpu).unwrap();
                    assert_eq!(device.kind, task.gpu.kind, "a device of another kind (seed {seed}, round {round})");
                }
                amd_placed += usize::from(task.gpu.kind == "amd");
                table.update_usage(p.node, |n| bind(n, &task, &p.devices)).unwrap().expect("bindable");
            }
            churn(&mut rng, &mut table, round);
        }
    }
    assert!(amd_placed > 20 && compared > 10_000, "{amd_placed} AMD placements, {compared} verdicts compared");
}
