//! Shared pieces of the cross-crate tests: fixture paths. Generators live in `wasmsched-sim`.

/// Paths of the guest fixtures built by `build.rs`.
pub mod fixtures {
    include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

    /// Read a fixture.
    pub fn read(path: &str) -> Vec<u8> {
        std::fs::read(path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
    }
}

pub mod promql;

/// The repository's root.
pub fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A guest built by a language's tool, once per content of its `sources` (kept under the system's
/// temporary directory in `kind`): `build(out)` writes the component to `out` or panics saying why.
fn cached_component(
    kind: &str,
    dir: &std::path::Path,
    sources: &[std::path::PathBuf],
    build: impl FnOnce(&std::path::Path),
) -> std::path::PathBuf {
    use std::hash::{Hash, Hasher};
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for source in sources {
        std::fs::read(source).unwrap_or_else(|e| panic!("{}: {e}", source.display())).hash(&mut hasher);
    }
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("app");
    let out_dir = std::env::temp_dir().join(format!("wasmsched-{kind}"));
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join(format!("{name}-{:016x}.wasm", hasher.finish()));
    if !out.exists() {
        let partial = out.with_extension("partial");
        build(&partial);
        std::fs::rename(&partial, &out).unwrap();
    }
    out
}

/// Python policies built into components with `componentize-py` (PyPI, pinned in `scripts/test`),
/// against the contract's `policy` world and the Python SDK (`sdk/python`).
pub mod python {
    use std::path::{Path, PathBuf};

    pub use crate::root;

    /// The component of the Python app in `dir` (its module `app.py`), built once per content of
    /// the app, the SDK and the contract.
    pub fn component(dir: &Path) -> PathBuf {
        let root = root();
        let sources = [dir.join("app.py"), root.join("sdk/python/wasmsched_policy.py"), root.join("wit/policy.wit")];
        crate::cached_component("python", dir, &sources, |out| {
            let status = std::process::Command::new("componentize-py")
                .current_dir(&root)
                .args(["-d", "wit", "-w", "policy", "componentize", "-p", "sdk/python", "-p"])
                .arg(dir)
                .args(["app", "-o"])
                .arg(out)
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot run componentize-py ({e}): `pip install componentize-py==0.25.1` (scripts/test does)"
                    )
                });
            assert!(status.success(), "componentize-py failed on {}", dir.display());
        })
    }
}

/// JavaScript policies built into components with componentize-js (npm, pinned in
/// `sdk/js/package.json`; `scripts/test` installs it), against the `policy` world and the
/// JavaScript SDK (`sdk/js`).
pub mod javascript {
    use std::path::{Path, PathBuf};

    use crate::root;

    /// The component of the JavaScript app in `dir` (its module `app.js`), built once per content
    /// of the app, the SDK, its build script and the contract.
    pub fn component(dir: &Path) -> PathBuf {
        let root = root();
        let sources = [
            dir.join("app.js"),
            root.join("sdk/js/wasmsched_policy.js"),
            root.join("sdk/js/build.mjs"),
            root.join("wit/policy.wit"),
        ];
        crate::cached_component("javascript", dir, &sources, |out| {
            let built = std::process::Command::new("node")
                .current_dir(&root)
                .arg("sdk/js/build.mjs")
                .arg(dir)
                .arg(out)
                .output()
                .unwrap_or_else(|e| {
                    panic!("cannot run node ({e}): install Node.js and `npm ci --prefix sdk/js` (scripts/test does)")
                });
            assert!(
                built.status.success(),
                "building {} failed (`npm ci --prefix sdk/js` installs componentize-js):\n{}",
                dir.display(),
                String::from_utf8_lossy(&built.stderr)
            );
        })
    }
}
