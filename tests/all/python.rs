//! Policies in Python (`sdk/python`, built with componentize-py): the Python `gpu-model-affinity`
//! places the openb trace exactly as the Rust example does, and what a Python author gets wrong —
//! an exception, a bad configuration, an endless loop — is a fault in the author's words, attributed
//! to the plugin and the stage.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use wasmsched_api::{Node, Stage, Task};
use wasmsched_core::{CallContext, FaultKind, NodeTable, PolicyPlugin, PolicySet};
use wasmsched_runtime::{LoadError, PluginConfig, Runtime, RuntimeConfig, WasmPlugin};
use wasmsched_sim::{replay, trace, workload};
use wasmsched_tests::{fixtures, python};

/// One runtime for the module, with a disk cache: a Python component (an interpreter inside) is
/// compiled once, not once per test.
pub(crate) fn rt() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let cache = std::env::temp_dir().join("wasmsched-python").join("compiled");
        Runtime::new(RuntimeConfig { cache_dir: Some(cache), ..RuntimeConfig::default() }).unwrap()
    })
}

fn example() -> PathBuf {
    python::component(&python::root().join("examples/plugins/gpu-model-affinity-py"))
}

fn raises() -> PathBuf {
    python::component(&python::root().join("tests/plugins/python/raises"))
}

fn load(path: &Path, config: PluginConfig) -> Result<WasmPlugin, LoadError> {
    rt().load(&fixtures::read(path.to_str().unwrap()), config)
}

pub(crate) fn replay_openb(score: Arc<dyn PolicyPlugin>) -> (Vec<(String, String, String)>, replay::Run) {
    replay_openb_with(None, score)
}

/// The openb replay behind `resource-fit`, then `filter` if given, scored by `score`: every
/// decision as (task, node or `-`, devices or the diagnosis), and the run.
pub(crate) fn replay_openb_with(
    filter: Option<Arc<dyn PolicyPlugin>>,
    score: Arc<dyn PolicyPlugin>,
) -> (Vec<(String, String, String)>, replay::Run) {
    let root = python::root().join("examples/traces/openb");
    let read = |f: &str| std::fs::read_to_string(root.join(f)).unwrap();
    let nodes = trace::parse_nodes("nodes", &read("openb_node_list_gpu_node.csv")).unwrap();
    let pods = trace::parse_pods("pods", &read("openb_pod_list_default.csv")).unwrap();
    let work = workload::build(&pods, &nodes, 42, 0.3);
    let typical = workload::target_workload(&pods);
    let fit: Arc<dyn PolicyPlugin> =
        Arc::new(rt().load(wasmsched_plugins::RESOURCE_FIT.wasm, crate::unhurried("resource-fit")).unwrap());
    let mut set = PolicySet::builder().filter(fit);
    if let Some(filter) = filter {
        set = set.filter(filter);
    }
    let set = set.score(score, 1).build();
    let mut placements = Vec::new();
    let run = replay::run_observed(&set, &work.nodes, &work.pods, &typical, |d| {
        let (node, devices) = match d.outcome {
            Ok((p, node)) => (node.name.clone(), format!("{:?}", p.devices)),
            Err(u) => ("-".into(), u.diagnosis.to_string()),
        };
        placements.push((d.task.id.clone(), node, devices));
    });
    (placements, run)
}

/// The preference list both language tests configure `gpu-model-affinity` with.
pub(crate) const GMA_CONFIG: &str = "G3,V100M32,T4";

/// `candidate` (a `gpu-model-affinity` in another language) places the openb replay exactly as the
/// Rust example does: every placement, its devices, and the allocation series.
pub(crate) fn assert_places_as_the_rust_example(candidate: WasmPlugin) {
    let rust = rt()
        .load(&fixtures::read(fixtures::GPU_MODEL_AFFINITY), crate::unhurried("gma-rust").with_config(GMA_CONFIG))
        .unwrap();
    assert_eq!(candidate.stages(), [Stage::Score], "the stages are the methods the class defines");
    let (rust_placements, rust_run) = replay_openb(Arc::new(rust));
    let (placements, run) = replay_openb(Arc::new(candidate));
    assert!(rust_run.placed > 1_000, "a real replay: {} placed", rust_run.placed);
    assert_eq!(run.faulted, 0);
    assert_eq!(placements.len(), rust_placements.len());
    for (p, r) in placements.iter().zip(&rust_placements) {
        assert_eq!(p, r, "the first placement that differs");
    }
    assert_eq!(run.series, rust_run.series);
    assert!(placements[0].1.starts_with("openb-node-"), "{:?}", placements[0]);
}

/// The models both language tests configure `gpu-model-filter` with: tasks that ask for GPUs wait
/// for these, and nodes of other models are refused as unresolvable.
pub(crate) const GMF_CONFIG: &str = "G3,V100M32,T4,P100";

/// `candidate` (a `gpu-model-filter` in another language, loaded under that name) filters the openb
/// replay exactly as the Rust example does: every placement, and for every task left waiting the same diagnosis (the
/// reasons, how many nodes gave each, and which were unresolvable).
pub(crate) fn assert_filters_as_the_rust_example(candidate: WasmPlugin) {
    let rust = rt()
        .load(&fixtures::read(fixtures::GPU_MODEL_FILTER), crate::unhurried("gpu-model-filter").with_config(GMF_CONFIG))
        .unwrap();
    assert_eq!(candidate.stages(), [Stage::Filter]);
    let score = || -> Arc<dyn PolicyPlugin> {
        let packing = wasmsched_plugins::GPU_PACKING;
        Arc::new(rt().load(packing.wasm, crate::unhurried(packing.name).with_config(packing.config)).unwrap())
    };
    let (rust_decisions, rust_run) = replay_openb_with(Some(Arc::new(rust)), score());
    let (decisions, run) = replay_openb_with(Some(Arc::new(candidate)), score());
    assert!(rust_run.placed > 1_000, "a real replay: {} placed", rust_run.placed);
    let refused = rust_decisions.iter().filter(|d| d.2.contains("no GPU of G3, V100M32, T4, P100")).count();
    assert!(refused > 0, "the filter refuses nodes in the replay");
    assert_eq!(run.faulted, 0);
    assert_eq!(decisions.len(), rust_decisions.len());
    for (d, r) in decisions.iter().zip(&rust_decisions) {
        assert_eq!(d, r, "the first decision that differs");
    }
    assert_eq!(run.series, rust_run.series);
}

#[test]
fn the_python_gpu_model_filter_decides_the_openb_trace_as_the_rust_example() {
    let path = python::component(&python::root().join("examples/plugins/gpu-model-filter-py"));
    let python = load(&path, crate::unhurried("gpu-model-filter").with_config(GMF_CONFIG)).unwrap();
    assert_filters_as_the_rust_example(python);
}

#[test]
fn the_python_gpu_model_affinity_places_the_openb_trace_as_the_rust_example() {
    let python = load(&example(), crate::unhurried("gma-python").with_config(GMA_CONFIG)).unwrap();
    assert_eq!(python.sdk_version(), "wasmsched-python/0.1.0");
    assert_places_as_the_rust_example(python);
}

/// `n` empty nodes named `n0`, `n1`, …
pub(crate) fn nodes(n: usize) -> NodeTable {
    let mut t = NodeTable::new();
    for i in 0..n {
        t.upsert(Node { name: format!("n{i}"), ..Default::default() });
    }
    t
}

#[test]
fn an_exception_is_a_fault_with_its_type_message_and_line() {
    let table = nodes(3);
    let ctx = CallContext { worker: 0, nodes: &table };
    let slots: Vec<u32> = table.slots().collect();
    let task = Task { id: "t".into(), ..Default::default() };
    let app = std::fs::read_to_string(python::root().join("tests/plugins/python/raises/app.py")).unwrap();
    let line_of = |text: &str| app.lines().position(|l| l.contains(text)).unwrap() + 1;

    let divide = load(&raises(), crate::unhurried("raises-divide").with_config("divide")).unwrap();
    let fault = divide.score(ctx, &task, &slots).expect_err("1 // 0 raises");
    assert_eq!((fault.plugin.as_str(), fault.stage), ("raises-divide", Stage::Score));
    assert_eq!(fault.kind, FaultKind::GuestError, "{fault}");
    let expected = format!(
        "score: ZeroDivisionError: division by zero (app.py line {}, in score)",
        line_of("100 // len(task.tolerations)")
    );
    assert!(fault.message.contains(&expected), "{:?} lacks {expected:?}", fault.message);

    let key = load(&raises(), crate::unhurried("raises-key").with_config("key")).unwrap();
    let fault = key.score(ctx, &task, &slots).expect_err("a missing key raises");
    assert!(
        fault.message.contains(&format!("KeyError: 'n0' (app.py line {}, in score)", line_of("[node.name]"))),
        "{}",
        fault.message
    );

    // Verdicts with reasons, shared between nodes.
    let fine = load(&raises(), crate::unhurried("raises-none").with_config("fine")).unwrap();
    assert_eq!(fine.stages(), [Stage::Filter, Stage::Score]);
    let batch = fine.filter(ctx, &task, &slots).unwrap();
    assert_eq!(batch.codes, [0, 1, 1]);
    assert_eq!(batch.reasons[0].reason, "not a node ending in 0");
    assert_eq!(fine.score(ctx, &task, &slots).unwrap(), [50, 50, 50]);
}

#[test]
fn a_bad_configuration_is_refused_with_the_authors_exception() {
    let Err(e) = load(&raises(), crate::unhurried("raises-config").with_config("bad-config")) else {
        panic!("a configuration the policy refuses must not load")
    };
    assert!(matches!(e, LoadError::Config { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("ValueError: unknown mode 'bad-config' (app.py line"), "{text}");
    assert!(text.contains("raises-config"), "{text}");
}

#[test]
fn an_endless_loop_is_cut_at_the_deadline_and_says_which_stage() {
    let config = PluginConfig::new("raises-loop").with_config("loop").with_deadline(Duration::from_millis(50));
    let looping = load(&raises(), config).unwrap();
    let table = nodes(2);
    let ctx = CallContext { worker: 0, nodes: &table };
    let slots: Vec<u32> = table.slots().collect();
    let started = std::time::Instant::now();
    let fault = looping.filter(ctx, &Task::default(), &slots).expect_err("cut");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!((fault.kind, fault.stage), (FaultKind::Deadline, Stage::Filter), "{fault}");
    assert!(fault.to_string().contains("raises-loop"), "{fault}");
    // By how much: the CPU it used against its budget.
    assert!(fault.message.contains("of CPU, over its 50ms budget"), "{fault}");
}

/// The examples' own unit tests (`test_app.py`: the Rust example's test in Python), run natively
/// through the SDK's `Harness` with the record types componentize-py generates from the contract.
#[test]
fn the_python_examples_unit_tests_pass_natively() {
    let root = python::root();
    let bindings = tempfile::tempdir().unwrap();
    let generated = std::process::Command::new("componentize-py")
        .current_dir(&root)
        .args(["-d", "wit", "-w", "policy", "bindings"])
        .arg(bindings.path())
        .output()
        .expect("componentize-py (scripts/test installs it)");
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
    for name in ["gpu-model-affinity-py", "gpu-model-filter-py"] {
        let example = root.join("examples/plugins").join(name);
        let path =
            std::env::join_paths([bindings.path().to_path_buf(), root.join("sdk/python"), example.clone()]).unwrap();
        let out = std::process::Command::new("python3")
            .current_dir(&example)
            .args(["-m", "unittest", "-v", "test_app"])
            .env("PYTHONPATH", path)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {report}");
        assert!(report.contains("Ran 2 tests") && report.trim_end().ends_with("OK"), "{name}: {report}");
    }
}
