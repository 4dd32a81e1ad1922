//! The fair-share built-ins answer identically as components and natively, on random queue trees,
//! and reject malformed trees through the fault channel.

use wasmsched_api::{QueueState, Resources};
use wasmsched_core::{FaultKind, NativePlugin, PolicyPlugin};
use wasmsched_plugin_fair_share::FairSharePolicy;
use wasmsched_runtime::{Runtime, RuntimeConfig};
use wasmsched_sim::generate::Rng;

fn resources(rng: &mut Rng, scale: u64) -> Resources {
    Resources {
        cpu_milli: rng.below(scale * 1000),
        memory_bytes: rng.below(scale << 30),
        gpu_milli: rng.below(scale * 100),
        extended: vec![("rdma/hca".into(), rng.below(scale))].into(),
    }
}

/// A random forest: each queue's parent, if any, comes earlier in the list.
fn tree(rng: &mut Rng, n: usize) -> Vec<QueueState> {
    (0..n)
        .map(|i| QueueState {
            name: format!("q{i:03}"),
            parent: (i > 0 && rng.percent(60)).then(|| rng.below(i as u64) as u32),
            weight: 1 + rng.below(8) as u32,
            guarantee: resources(rng, 2),
            capability: rng.percent(30).then(|| resources(rng, 50)),
            allocated: resources(rng, 10),
            request: resources(rng, 30),
            decayed_usage: rng.below(1_000_000) as f64,
            reclaimable: rng.percent(50),
        })
        .collect()
}

#[test]
fn components_and_native_agree_on_random_queue_trees() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    for builtin in [wasmsched_plugins::PROPORTION, wasmsched_plugins::DRF, wasmsched_plugins::DECAYED_USAGE] {
        let wasm = rt.load(builtin.wasm, crate::unhurried(builtin.name).with_config(builtin.config)).unwrap();
        let native = NativePlugin::<FairSharePolicy>::new(builtin.config, 1).unwrap();
        let mut rng = Rng::new(11);
        for round in 0..40 {
            let n = 1 + rng.below(60) as usize;
            let queues = tree(&mut rng, n);
            let cluster = resources(&mut rng, 400);
            let a = native.fair_share(0, &queues, &cluster).unwrap();
            let b = wasm.fair_share(0, &queues, &cluster).unwrap();
            assert_eq!(a, b, "{} differs in round {round}", builtin.name);
            // Roots together never deserve more than the cluster has, in any dimension.
            let roots: Vec<&Resources> =
                queues.iter().zip(&a.deserved).filter(|(q, _)| q.parent.is_none()).map(|(_, d)| d).collect();
            assert!(roots.iter().map(|d| d.gpu_milli).sum::<u64>() <= cluster.gpu_milli);
            assert!(roots.iter().map(|d| d.cpu_milli).sum::<u64>() <= cluster.cpu_milli);
            assert!(roots.iter().map(|d| d.extended("rdma/hca")).sum::<u64>() <= cluster.extended("rdma/hca"));
        }
    }
}

#[test]
fn answers_by_changes_match_native_while_a_tree_changes_a_little_grows_and_shrinks() {
    // Between calls of a cycle a few queues change; now and then one comes or goes, or a call
    // fails. The component (sent only what changed, answering only changed shares) must answer
    // exactly what the native plugin answers from the whole tree every time.
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    for builtin in [wasmsched_plugins::PROPORTION, wasmsched_plugins::DRF, wasmsched_plugins::DECAYED_USAGE] {
        let wasm = rt.load(builtin.wasm, crate::unhurried(builtin.name).with_config(builtin.config)).unwrap();
        let native = NativePlugin::<FairSharePolicy>::new(builtin.config, 1).unwrap();
        let mut rng = Rng::new(12);
        let mut queues = tree(&mut rng, 40);
        let cluster = resources(&mut rng, 400);
        for call in 0..200 {
            match rng.below(20) {
                0 if queues.len() > 1 => {
                    queues.pop();
                }
                1 => {
                    let mut grown = tree(&mut rng, queues.len() + 1);
                    queues.push(grown.pop().unwrap());
                }
                2 => {
                    // A cycle in the tree: a guest error (the instance is replaced, so the next
                    // call starts it over), then the tree is repaired.
                    let mut cyclic = queues.clone();
                    cyclic[0].parent = Some(0);
                    assert!(wasm.fair_share(0, &cyclic, &cluster).is_err());
                }
                _ => {}
            }
            for _ in 0..rng.below(4) {
                let i = rng.below(queues.len() as u64) as usize;
                queues[i].allocated = resources(&mut rng, 10);
                queues[i].request = resources(&mut rng, 30);
            }
            let a = native.fair_share(0, &queues, &cluster).unwrap();
            let b = wasm.fair_share(0, &queues, &cluster).unwrap();
            assert_eq!(a, b, "{} differs at call {call}", builtin.name);
        }
    }
}

#[test]
fn a_cyclic_tree_is_a_guest_error_naming_the_queue() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let drf = wasmsched_plugins::DRF;
    let p = rt.load(drf.wasm, crate::unhurried("drf").with_config(drf.config)).unwrap();
    let cyclic = vec![
        QueueState { name: "a".into(), parent: Some(1), weight: 1, ..Default::default() },
        QueueState { name: "b".into(), parent: Some(0), weight: 1, ..Default::default() },
    ];
    let fault = p.fair_share(0, &cyclic, &Resources::default()).unwrap_err();
    assert_eq!(fault.kind, FaultKind::GuestError);
    assert!(fault.message.contains("queue a: its ancestry has a cycle"), "{}", fault.message);
}

/// `examples/plugins/fair-share-py` and `-js`, the built-in fair share written in Python and in
/// JavaScript, answer exactly as the native build — every deserved share and the serving order —
/// for the three policies on random trees (large amounts, zero shares, infinite keys and ties
/// included), whole and by changes, and refuse a cyclic tree naming the queue.
#[test]
fn the_python_and_javascript_fair_share_answer_exactly_as_the_built_in() {
    let rt = crate::python::rt();
    let root = wasmsched_tests::root();
    let python =
        std::fs::read(wasmsched_tests::python::component(&root.join("examples/plugins/fair-share-py"))).unwrap();
    let js =
        std::fs::read(wasmsched_tests::javascript::component(&root.join("examples/plugins/fair-share-js"))).unwrap();
    for (language, wasm) in [("python", &python), ("javascript", &js)] {
        for builtin in [wasmsched_plugins::PROPORTION, wasmsched_plugins::DRF, wasmsched_plugins::DECAYED_USAGE] {
            let config = crate::unhurried(builtin.name).with_config(builtin.config).with_memory_limit(256 << 20);
            let guest = rt.load(wasm, config).unwrap_or_else(|e| panic!("{language}: {e}"));
            assert_eq!(guest.stages(), [wasmsched_api::Stage::FairShare]);
            let native = NativePlugin::<FairSharePolicy>::new(builtin.config, 1).unwrap();
            let mut rng = Rng::new(21);
            for round in 0..25 {
                let n = 1 + rng.below(60) as usize;
                let mut queues = tree(&mut rng, n);
                if round % 5 == 0 {
                    // Amounts past 2^53 (a double's exact integers) and equal keys decided by name.
                    for q in &mut queues {
                        q.request.memory_bytes = q.request.memory_bytes.saturating_mul(1 << 24);
                        q.allocated = Resources::default();
                    }
                }
                let cluster = Resources { memory_bytes: u64::MAX / 2, ..resources(&mut rng, 400) };
                let a = native.fair_share(0, &queues, &cluster).unwrap();
                let b = guest.fair_share(0, &queues, &cluster).unwrap();
                assert_eq!(a, b, "{language} {} differs in round {round}", builtin.name);
                // And again after a few queues changed (the host sends only those).
                for _ in 0..3 {
                    let i = rng.below(n as u64) as usize;
                    queues[i].allocated = resources(&mut rng, 10);
                }
                let a = native.fair_share(0, &queues, &cluster).unwrap();
                let b = guest.fair_share(0, &queues, &cluster).unwrap();
                assert_eq!(a, b, "{language} {} differs after changes in round {round}", builtin.name);
            }
            let cyclic = vec![
                QueueState { name: "a".into(), parent: Some(1), weight: 1, ..Default::default() },
                QueueState { name: "b".into(), parent: Some(0), weight: 1, ..Default::default() },
            ];
            let fault = guest.fair_share(0, &cyclic, &Resources::default()).unwrap_err();
            assert_eq!(fault.kind, FaultKind::GuestError);
            assert!(fault.message.contains("queue a: its ancestry has a cycle"), "{language}: {}", fault.message);
        }
    }
}
