//! Compile workspace plugin crates to WebAssembly components from a build script.
//!
//! Used by `plugins/build.rs` (the built-in policies embedded in the binary) and `tests/build.rs`
//! (guest fixtures, hostile ones included), the way wasmtime builds its test programs. The nested
//! cargo uses its own target directory (`<target>/guests`) so it never waits on the outer build's
//! lock, and the `guest` profile from the workspace manifest (LTO, stripped).

// Build scripts talk to cargo through stdout.
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Rust target plugins are built for.
pub const TARGET: &str = "wasm32-wasip2";

/// Build `packages` (workspace package names) as components and return `(package, wasm path)`.
///
/// Panics with the cargo output on failure: this runs inside a build script, where a panic is how
/// an error reaches the user.
pub fn build(packages: &[&str]) -> Vec<(String, PathBuf)> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run from a build script"));
    let workspace = find_workspace(&manifest_dir);
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("guests");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());

    let mut cmd = Command::new(cargo);
    cmd.current_dir(&workspace)
        .args(["build", "--target", TARGET, "--profile", "guest", "--target-dir"])
        .arg(&target_dir);
    for p in packages {
        cmd.args(["-p", p]);
    }
    // The outer build's settings must not leak into the guest build: clippy's wrapper, host
    // rustflags and the outer target would all break or slow it.
    for var in [
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CLIPPY_ARGS",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd.output().expect("failed to run cargo for the wasm guests");
    if !out.status.success() {
        panic!(
            "building wasm guests {packages:?} failed (is the {TARGET} target installed? `rustup target add {TARGET}`)\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    for dir in ["wit", "sdk", "plugins", "examples/plugins", "tests/plugins"] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    println!("cargo:rerun-if-changed={}", workspace.join("Cargo.lock").display());

    packages
        .iter()
        .map(|p| {
            let file = format!("{}.wasm", p.replace('-', "_"));
            (p.to_string(), target_dir.join(TARGET).join("guest").join(file))
        })
        .collect()
}

fn find_workspace(start: &Path) -> PathBuf {
    start
        .ancestors()
        .find(|d| d.join("Cargo.toml").is_file() && d.join("wit").is_dir())
        .expect("workspace root with wit/ above the build script's crate")
        .to_path_buf()
}
