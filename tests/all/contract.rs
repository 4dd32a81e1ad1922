//! Loading refuses what does not implement the contract, with errors that name the plugin.

use wasmsched_runtime::{LoadError, Runtime, RuntimeConfig};
use wasmsched_tests::fixtures;

fn rt() -> Runtime {
    Runtime::new(RuntimeConfig::default()).unwrap()
}

fn load_err(bytes: &[u8], name: &str, config: &str) -> LoadError {
    match rt().load(bytes, crate::unhurried(name).with_config(config)) {
        Ok(_) => panic!("{name} must not load"),
        Err(e) => {
            assert!(e.to_string().contains(name), "error names the plugin: {e}");
            e
        }
    }
}

#[test]
fn incompatible_contract_version_is_refused() {
    let e = load_err(&fixtures::read(fixtures::WRONG_CONTRACT), "future", "");
    assert!(matches!(e, LoadError::Contract { .. }), "{e}");
    assert!(e.to_string().contains("wasmsched:policy/plugin"), "{e}");
}

#[test]
fn component_of_another_world_is_refused() {
    // The smallest valid component: magic, component version, layer. It exports nothing.
    let empty = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
    assert!(matches!(load_err(&empty, "empty", ""), LoadError::Contract { .. }));
}

#[test]
fn truncated_corrupt_and_non_component_files_are_refused() {
    let good = wasmsched_plugins::RESOURCE_FIT.wasm;
    assert!(matches!(load_err(&good[..good.len() / 2], "truncated", ""), LoadError::Compile { .. }));
    let mut corrupt = good.to_vec();
    let mid = corrupt.len() / 2;
    corrupt[mid..mid + 64].fill(0xff);
    assert!(matches!(load_err(&corrupt, "corrupt", ""), LoadError::Compile { .. } | LoadError::Contract { .. }));
    let core_module = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
    assert!(matches!(load_err(&core_module, "core-module", ""), LoadError::Compile { .. }));
    assert!(matches!(load_err(b"#!/bin/sh\necho not wasm\n", "script", ""), LoadError::Compile { .. }));
    assert!(matches!(load_err(&[], "nothing", ""), LoadError::Compile { .. }));
}

#[test]
fn bad_configuration_is_refused_with_the_plugins_reason() {
    let fit = wasmsched_plugins::RESOURCE_FIT;
    let e = load_err(fit.wasm, "resource-fit", r#"{"ignore_gpu_memory": "yes"}"#);
    assert!(matches!(e, LoadError::Config { .. }), "{e}");
    assert!(e.to_string().contains("invalid resource-fit configuration"), "{e}");
    let e = load_err(&fixtures::read(fixtures::HOSTILE), "hostile", "nonsense");
    assert!(e.to_string().contains("unknown hostile mode"), "{e}");
}

#[test]
fn a_panic_during_init_is_a_load_error_that_names_it_not_a_crash() {
    let e = load_err(&fixtures::read(fixtures::HOSTILE), "init-panics", "init-panic");
    assert!(matches!(e, LoadError::Init { .. }), "{e}");
    assert!(
        e.to_string().contains("init failed") && e.to_string().contains("hostile plugin panics during init"),
        "{e}"
    );
    assert!(
        !e.to_string().contains("configuration rejected"),
        "a trap is not the plugin's verdict on its configuration: {e}"
    );
}

#[test]
fn an_export_with_the_wrong_signature_is_named_with_its_expected_type() {
    let e = load_err(&fixtures::read(fixtures::WRONG_SIGNATURE), "wrong-signature", "");
    assert!(matches!(e, LoadError::Contract { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("export wasmsched:policy/plugin@0.2.0 does not have the contract's types"), "{text}");
    // The type checker's words: what it expected and what it found.
    assert!(text.contains("expected"), "{text}");
}

#[test]
fn a_component_over_the_size_limit_is_refused_before_it_is_read_or_compiled() {
    let rt = wasmsched_runtime::Runtime::new(wasmsched_runtime::RuntimeConfig {
        max_component_bytes: 1024,
        ..Default::default()
    })
    .unwrap();
    let fit = wasmsched_plugins::RESOURCE_FIT;
    let e = rt.load(fit.wasm, crate::unhurried("resource-fit")).unwrap_err();
    assert!(matches!(e, LoadError::TooLarge { limit: 1024, .. }), "{e}");
    assert!(e.to_string().contains("over the limit of 1024 bytes"), "{e}");

    // A 64 GiB sparse file: reading it would take minutes and all memory; the size check is at once.
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.wasm");
    std::fs::File::create(&huge).unwrap().set_len(64 << 30).unwrap();
    let started = std::time::Instant::now();
    let e = wasmsched_runtime::read_component(&huge, wasmsched_runtime::DEFAULT_MAX_COMPONENT_BYTES).unwrap_err();
    assert!(matches!(e, LoadError::TooLarge { size, .. } if size == 64 << 30), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "took {:?}", started.elapsed());
    let small = dir.path().join("fit.wasm");
    std::fs::write(&small, fit.wasm).unwrap();
    assert_eq!(wasmsched_runtime::read_component(&small, 1 << 20).unwrap(), fit.wasm);
}

#[test]
fn loaded_plugins_report_their_stages_and_sdk() {
    use wasmsched_api::Stage;
    use wasmsched_core::PolicyPlugin;
    let rt = rt();
    let fit = rt.load(wasmsched_plugins::RESOURCE_FIT.wasm, crate::unhurried("resource-fit")).unwrap();
    assert_eq!(fit.stages(), &[Stage::Filter]);
    assert!(fit.sdk_version().starts_with("wasmsched-sdk/"));
    assert_eq!(fit.digest().len(), 64);
    let hostile = rt.load(&fixtures::read(fixtures::HOSTILE), crate::unhurried("h").with_config("ok")).unwrap();
    assert_eq!(hostile.stages(), &[Stage::Filter, Stage::Score, Stage::Preempt, Stage::FairShare]);
}
