//! Compile workspace plugin crates to WebAssembly components from a build script.
//!
//! Used by `plugins/build.rs` (the built-in policies embedded in the binary) and `tests/build.rs`
//! (guest fixtures, hostile ones included), the way wasmtime builds its test programs. The nested
//! cargo uses its own target directory (`<target>/guests`, inside the outer build's) so it never
//! waits on the outer build's lock, and the `guest` profile from the workspace manifest (LTO,
//! stripped).

// Build scripts talk to cargo through stdout.
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::Command;

mod toolchain;

/// The Rust target plugins are built for.
pub const TARGET: &str = "wasm32-wasip2";

/// Build `packages` (workspace package names) as components and return `(package, wasm path)`.
///
/// Panics with the cargo output on failure: this runs inside a build script, where a panic is how
/// an error reaches the user.
pub fn build(packages: &[&str]) -> Vec<(String, PathBuf)> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run from a build script"));
    let workspace = find_workspace(&manifest_dir);
    let target_dir = std::env::var_os("OUT_DIR")
        .and_then(|out| outer_target_dir(Path::new(&out)))
        .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from))
        .unwrap_or_else(|| workspace.join("target"))
        .join("guests");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());

    // Before anything compiles: a missing target stops the outer build within seconds, not after
    // the nested one has failed beside minutes of third-party crates.
    match toolchain::ensure_target(&target_dir) {
        Ok(Some(installed)) => println!("cargo:warning={installed}"),
        Ok(None) => {}
        Err(why) => {
            eprintln!("{why}");
            println!("cargo:warning={}", why.lines().next().unwrap_or_default());
            println!("cargo:warning={}", why.lines().last().unwrap_or_default());
            std::process::exit(1);
        }
    }

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
        panic!("building wasm guests {packages:?} failed\n{}", String::from_utf8_lossy(&out.stderr));
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

/// The outer build's target directory, however it was chosen (`--target-dir`, `CARGO_TARGET_DIR`,
/// `build.target-dir` in a cargo config): the one holding this build script's `OUT_DIR`
/// (`<target>/[<triple>/]<profile>/build/<package>-<hash>/out`), the outer of the two that cargo
/// marks with a `CACHEDIR.TAG` (so `--target <triple>` shares the guests). Reading only
/// `CARGO_TARGET_DIR` put the guests in the checkout's `target/` under `cargo build --target-dir
/// DIR`: a "clean" build in DIR reused them.
fn outer_target_dir(out_dir: &Path) -> Option<PathBuf> {
    out_dir.ancestors().skip(4).take(2).filter(|d| d.join("CACHEDIR.TAG").is_file()).last().map(Path::to_path_buf)
}

fn find_workspace(start: &Path) -> PathBuf {
    start
        .ancestors()
        .find(|d| d.join("Cargo.toml").is_file() && d.join("wit").is_dir())
        .expect("workspace root with wit/ above the build script's crate")
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::outer_target_dir;
    use std::path::Path;

    /// A target directory as cargo lays it out: `CACHEDIR.TAG` at its root and, for `--target`,
    /// in the triple's directory too.
    fn out_dir(target: &Path, triple: Option<&str>) -> std::path::PathBuf {
        let tag = |dir: &Path| {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("CACHEDIR.TAG"), "Signature: 8a477f597d28d172789f06886806bc55").unwrap();
        };
        tag(target);
        let base = triple.map_or_else(|| target.to_path_buf(), |t| target.join(t));
        tag(&base);
        let out = base.join("release/build/wasmsched-plugins-0123abcd/out");
        std::fs::create_dir_all(&out).unwrap();
        out
    }

    #[test]
    fn the_guests_go_where_the_outer_build_goes() {
        let dir = tempfile::tempdir().unwrap();
        // `--target-dir DIR` (or a config's `build.target-dir`): DIR, not the checkout's target/.
        let flagged = dir.path().join("flagged");
        assert_eq!(outer_target_dir(&out_dir(&flagged, None)).as_deref(), Some(flagged.as_path()));
        // `--target <triple>`: the same directory, not a second one under the triple.
        let cross = dir.path().join("cross");
        let out = out_dir(&cross, Some("x86_64-unknown-linux-gnu"));
        assert_eq!(outer_target_dir(&out).as_deref(), Some(cross.as_path()));
        // Not cargo's layout: the caller falls back (CARGO_TARGET_DIR, then target/).
        let stray = dir.path().join("a/b/c/d/e/out");
        std::fs::create_dir_all(&stray).unwrap();
        assert_eq!(outer_target_dir(&stray), None);
    }
}
