//! Shared pieces of the cross-crate tests: fixture paths. Generators live in `wasmsched-sim`.

/// Paths of the guest fixtures built by `build.rs`.
pub mod fixtures {
    include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

    /// Read a fixture.
    pub fn read(path: &str) -> Vec<u8> {
        std::fs::read(path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
    }
}

/// Python policies built into components with `componentize-py` (PyPI, pinned in `scripts/test`),
/// against the contract's `policy` world and the Python SDK (`sdk/python`).
pub mod python {
    use std::hash::{Hash, Hasher};
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    /// The repository's root.
    pub fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// The component of the Python app in `dir` (its module `app.py`), built once per content of
    /// the app, the SDK and the contract (kept under the system's temporary directory).
    pub fn component(dir: &Path) -> PathBuf {
        static BUILDING: Mutex<()> = Mutex::new(());
        let _one_at_a_time = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        let root = root();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for source in [dir.join("app.py"), root.join("sdk/python/wasmsched_policy.py"), root.join("wit/policy.wit")] {
            std::fs::read(&source).unwrap_or_else(|e| panic!("{}: {e}", source.display())).hash(&mut hasher);
        }
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("app");
        let out_dir = std::env::temp_dir().join("wasmsched-python");
        std::fs::create_dir_all(&out_dir).unwrap();
        let out = out_dir.join(format!("{name}-{:016x}.wasm", hasher.finish()));
        if out.exists() {
            return out;
        }
        let partial = out.with_extension("partial");
        let status = std::process::Command::new("componentize-py")
            .current_dir(&root)
            .args(["-d", "wit", "-w", "policy", "componentize", "-p", "sdk/python", "-p"])
            .arg(dir)
            .args(["app", "-o"])
            .arg(&partial)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run componentize-py ({e}): `pip install componentize-py==0.25.1` (scripts/test does)")
            });
        assert!(status.success(), "componentize-py failed on {}", dir.display());
        std::fs::rename(&partial, &out).unwrap();
        out
    }
}

/// JavaScript policies built into components with componentize-js (npm, pinned in
/// `sdk/js/package.json`; `scripts/test` installs it), against the `policy` world and the
/// JavaScript SDK (`sdk/js`).
pub mod javascript {
    use std::hash::{Hash, Hasher};
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    use crate::python::root;

    /// The component of the JavaScript app in `dir` (its module `app.js`), built once per content of
    /// the app, the SDK and the contract (kept under the system's temporary directory).
    pub fn component(dir: &Path) -> PathBuf {
        static BUILDING: Mutex<()> = Mutex::new(());
        let _one_at_a_time = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        let root = root();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for source in [
            dir.join("app.js"),
            root.join("sdk/js/wasmsched_policy.js"),
            root.join("sdk/js/build.mjs"),
            root.join("wit/policy.wit"),
        ] {
            std::fs::read(&source).unwrap_or_else(|e| panic!("{}: {e}", source.display())).hash(&mut hasher);
        }
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("app");
        let out_dir = std::env::temp_dir().join("wasmsched-javascript");
        std::fs::create_dir_all(&out_dir).unwrap();
        let out = out_dir.join(format!("{name}-{:016x}.wasm", hasher.finish()));
        if out.exists() {
            return out;
        }
        let partial = out.with_extension("partial");
        let built = std::process::Command::new("node")
            .current_dir(&root)
            .arg("sdk/js/build.mjs")
            .arg(dir)
            .arg(&partial)
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
        std::fs::rename(&partial, &out).unwrap();
        out
    }
}
