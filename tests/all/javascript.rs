//! Policies in JavaScript (`sdk/js`, built with componentize-js): the JavaScript
//! `gpu-model-affinity` places the openb trace exactly as the Rust example does, and a throw, a bad
//! configuration or an endless loop is a fault in the author's words, attributed to plugin and stage.

use std::path::{Path, PathBuf};
use std::time::Duration;

use wasmsched_api::{Stage, Task};
use wasmsched_core::{CallContext, FaultKind, PolicyPlugin};

use crate::python::nodes;
use wasmsched_runtime::{LoadError, PluginConfig, WasmPlugin};
use wasmsched_tests::{fixtures, javascript, python};

/// The JavaScript engine's heap grows past the default 64 MiB cap before it collects: JavaScript
/// policies are given 256 MiB (`memory_mib: 256` in a policy set; docs say so).
const MEMORY: usize = 256 << 20;

fn example() -> PathBuf {
    javascript::component(&python::root().join("examples/plugins/gpu-model-affinity-js"))
}

fn raises() -> PathBuf {
    javascript::component(&python::root().join("tests/plugins/js/raises"))
}

fn load(path: &Path, config: PluginConfig) -> Result<WasmPlugin, LoadError> {
    crate::python::rt().load(&fixtures::read(path.to_str().unwrap()), config.with_memory_limit(MEMORY))
}

#[test]
fn the_javascript_gpu_model_affinity_places_the_openb_trace_as_the_rust_example() {
    let js = load(&example(), crate::unhurried("gma-js").with_config(crate::python::GMA_CONFIG)).unwrap();
    assert_eq!(js.sdk_version(), "wasmsched-js/0.1.0");
    crate::python::assert_places_as_the_rust_example(js);
}

#[test]
fn the_javascript_gpu_model_filter_decides_the_openb_trace_as_the_rust_example() {
    let path = javascript::component(&python::root().join("examples/plugins/gpu-model-filter-js"));
    let js = load(&path, crate::unhurried("gpu-model-filter").with_config(crate::python::GMF_CONFIG)).unwrap();
    crate::python::assert_filters_as_the_rust_example(js);
}

#[test]
fn a_throw_is_a_fault_with_its_type_message_and_line() {
    let table = nodes(3);
    let ctx = CallContext { worker: 0, nodes: &table };
    let slots: Vec<u32> = table.slots().collect();
    let task = Task { id: "t".into(), ..Default::default() };
    let app = std::fs::read_to_string(python::root().join("tests/plugins/js/raises/app.js")).unwrap();
    let line_of = |text: &str| app.lines().position(|l| l.contains(text)).unwrap() + 1;

    let typed = load(&raises(), crate::unhurried("raises-type").with_config("type")).unwrap();
    let fault = typed.score(ctx, &task, &slots).expect_err("node.missing.field throws");
    assert_eq!((fault.plugin.as_str(), fault.stage, fault.kind), ("raises-type", Stage::Score, FaultKind::GuestError));
    let expected = format!(
        "score: TypeError: can't access property \"field\", node.missing is undefined (app.js line {})",
        line_of("node.missing.field")
    );
    assert!(fault.message.contains(&expected), "{:?} lacks {expected:?}", fault.message);

    let fine = load(&raises(), crate::unhurried("raises-fine").with_config("fine")).unwrap();
    assert_eq!(fine.stages(), [Stage::Filter, Stage::Score]);
    let batch = fine.filter(ctx, &task, &slots).unwrap();
    assert_eq!(batch.codes, [0, 1, 1]);
    assert_eq!(batch.reasons[0].reason, "not a node ending in 0");
    assert_eq!(fine.score(ctx, &task, &slots).unwrap(), [50, 50, 50]);

    let Err(e) = load(&raises(), crate::unhurried("raises-config").with_config("bad-config")) else {
        panic!("a configuration the policy refuses must not load")
    };
    assert!(matches!(e, LoadError::Config { .. }), "{e}");
    assert!(e.to_string().contains("RangeError: unknown mode 'bad-config' (app.js line"), "{e}");
}

#[test]
fn an_endless_javascript_loop_is_cut_at_the_deadline() {
    let config = PluginConfig::new("raises-loop").with_config("loop").with_deadline(Duration::from_millis(50));
    let looping = load(&raises(), config).unwrap();
    let table = nodes(2);
    let ctx = CallContext { worker: 0, nodes: &table };
    let slots: Vec<u32> = table.slots().collect();
    let fault = looping.filter(ctx, &Task::default(), &slots).expect_err("cut");
    assert_eq!((fault.kind, fault.stage), (FaultKind::Deadline, Stage::Filter), "{fault}");
    // By how much: the CPU it used against its budget.
    assert!(fault.message.contains("of CPU, over its 50ms budget"), "{fault}");
}

/// The example's own unit tests (`app.test.mjs`: the Rust example's test in JavaScript), run
/// natively with `node --test` through the SDK's `Harness`, the SDK beside the app as the build
/// places it.
#[test]
fn the_javascript_examples_unit_tests_pass_natively() {
    let root = python::root();
    for name in ["gpu-model-affinity-js", "gpu-model-filter-js"] {
        let work = tempfile::tempdir().unwrap();
        let example = root.join("examples/plugins").join(name);
        for entry in std::fs::read_dir(&example).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, work.path().join(path.file_name().unwrap())).unwrap();
        }
        std::fs::copy(root.join("sdk/js/wasmsched_policy.js"), work.path().join("wasmsched_policy.js")).unwrap();
        let out = std::process::Command::new("node")
            .current_dir(work.path())
            .args(["--test", "app.test.mjs"])
            .output()
            .expect("node (scripts/test installs it)");
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {report}{}", String::from_utf8_lossy(&out.stderr));
        assert!(report.contains("# pass 2") && report.contains("# fail 0"), "{name}: {report}");
    }
}

/// The TypeScript declarations of the contract in `sdk/js/types` are what jco generates from
/// `wit/policy.wit` now: regenerate with `node sdk/js/types.mjs` when the contract changes.
#[test]
fn the_typescript_declarations_are_generated_from_the_wit_and_current() {
    let root = python::root();
    let out = tempfile::tempdir().unwrap();
    let generated = std::process::Command::new("node")
        .arg(root.join("sdk/js/types.mjs"))
        .arg(out.path())
        .output()
        .expect("node (scripts/test installs it)");
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
    let files = |dir: &Path| -> Vec<(String, String)> {
        let mut all = Vec::new();
        for sub in ["", "interfaces"] {
            for entry in std::fs::read_dir(dir.join(sub)).unwrap() {
                let path = entry.unwrap().path();
                if path.is_file() {
                    let name = path.strip_prefix(dir).unwrap().display().to_string();
                    all.push((name, std::fs::read_to_string(&path).unwrap()));
                }
            }
        }
        all.sort();
        all
    };
    let (want, have) = (files(out.path()), files(&root.join("sdk/js/types")));
    let names = |f: &[(String, String)]| f.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&have), names(&want), "regenerate with `node sdk/js/types.mjs`");
    for ((name, a), (_, b)) in have.iter().zip(&want) {
        assert!(a == b, "sdk/js/types/{name} is stale: regenerate with `node sdk/js/types.mjs`");
    }
    // Every stage of the contract has its declarations, with the records' fields as the SDK
    // documents them (camelCase; 64-bit integers as bigint).
    let all: String = have.iter().map(|(_, t)| t.as_str()).collect();
    for module in ["filter", "score", "preempt", "fair-share", "select-devices"] {
        assert!(all.contains(&format!("declare module 'wasmsched:policy/{module}@")), "{module}");
    }
    assert!(all.contains("gpuMilli: bigint"), "Resources.gpu_milli as the SDK documents it");
}
