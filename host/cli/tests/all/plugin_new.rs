//! `wasmsched plugin new`: each language's project, written outside the repository, passes its own
//! test, builds into a component, and that component and the policy set its build script writes
//! pass `plugin check` and `policy check` unchanged. Bad names and occupied directories write
//! nothing.

use std::path::Path;
use std::process::{Command, Output};

fn wasmsched(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .args(args)
        .current_dir(dir)
        .env("WASMSCHED_CACHE_DIR", dir.join("compiled"))
        .output()
        .expect("run wasmsched")
}

/// `build.sh test` of the project in `dir`, with the `wasmsched` under test on PATH.
fn build(dir: &Path) -> String {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_wasmsched")).parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    let out = Command::new(dir.join("build.sh"))
        .arg("test")
        .env("PATH", path)
        // The project is outside this workspace: its own target directory and toolchain.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{}/build.sh test failed:\n{text}", dir.display());
    text
}

fn checks_pass(work: &Path, name: &str) {
    let project = work.join(name);
    let check = wasmsched(&project, &["plugin", "check", &format!("{name}.wasm")]);
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{text}{}", String::from_utf8_lossy(&check.stderr));
    assert!(text.contains(&format!("plugin   {name}\n")) && text.contains("stages   score"), "{text}");
    let policy = wasmsched(&project, &["policy", "check", "policy.yaml"]);
    let text = String::from_utf8_lossy(&policy.stdout);
    assert!(policy.status.success(), "{text}{}", String::from_utf8_lossy(&policy.stderr));
    assert!(text.contains(&format!("policy set {name} passes every gate")), "{text}");
}

#[test]
fn a_new_python_policy_builds_tests_and_passes_the_gates() {
    let work = tempfile::tempdir().unwrap();
    let o = wasmsched(work.path(), &["plugin", "new", "spread-py", "--lang", "python"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = build(&work.path().join("spread-py"));
    assert!(log.contains("Ran 1 test") && log.contains("OK"), "{log}");
    checks_pass(work.path(), "spread-py");

    // Occupied directories and bad names write nothing.
    let again = wasmsched(work.path(), &["plugin", "new", "spread-py", "--lang", "python"]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("is not empty"));
    let bad = wasmsched(work.path(), &["plugin", "new", "Spread_Py", "--lang", "python"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("is not a policy name"));
    assert!(!work.path().join("Spread_Py").exists());
    let no_sdk = wasmsched(work.path(), &["plugin", "new", "spread-rs", "--lang", "rust"]);
    assert!(!no_sdk.status.success() && String::from_utf8_lossy(&no_sdk.stderr).contains("--sdk"));
}

#[test]
fn a_new_rust_policy_builds_tests_and_passes_the_gates() {
    let work = tempfile::tempdir().unwrap();
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk").canonicalize().unwrap();
    let o = wasmsched(work.path(), &["plugin", "new", "spread-rs", "--lang", "rust", "--sdk", sdk.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = build(&work.path().join("spread-rs"));
    assert!(log.contains("test result: ok. 1 passed"), "{log}");
    checks_pass(work.path(), "spread-rs");
}

#[test]
fn a_new_javascript_policy_builds_tests_and_passes_the_gates() {
    let work = tempfile::tempdir().unwrap();
    let o = wasmsched(work.path(), &["plugin", "new", "spread-js", "--lang", "js"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = build(&work.path().join("spread-js"));
    assert!(log.contains("# pass 1") && log.contains("# fail 0"), "{log}");
    checks_pass(work.path(), "spread-js");
}
