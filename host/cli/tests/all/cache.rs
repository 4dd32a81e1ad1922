//! Compiled components are cached on disk across commands (`WASMSCHED_CACHE_DIR`), and a cache
//! that cannot be used never stops a command.

use std::process::{Command, Output};

fn wasmsched(cache: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wasmsched")).env("WASMSCHED_CACHE_DIR", cache).args(args).output().expect("run")
}

const SCENARIO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios/two-queues.json");

fn replay(cache: &str) -> serde_json::Value {
    let o = wasmsched(cache, &["replay", "--scenario", SCENARIO, "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_second_command_reuses_the_compiled_components_with_the_same_results() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache = cache.to_str().unwrap();
    let first = replay(cache);
    let artifacts = || {
        std::fs::read_dir(cache)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "cwasm"))
            .count()
    };
    let cached = artifacts();
    assert!(cached >= 2, "resource-fit and the score policy are cached: {cached}");
    let second = replay(cache);
    assert_eq!(artifacts(), cached, "nothing recompiled");
    assert_eq!(first["queues"], second["queues"], "same decisions from the cached artifacts");

    // A corrupted artifact is detected by its digest, recompiled, and the result is unchanged.
    for entry in std::fs::read_dir(cache).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|x| x == "cwasm") {
            std::fs::write(&path, b"garbage").unwrap();
        }
    }
    assert_eq!(replay(cache)["queues"], first["queues"]);

    // A cache directory that cannot be created (a file is in the way) only costs compile time.
    let blocked = dir.path().join("file");
    std::fs::write(&blocked, b"").unwrap();
    assert_eq!(replay(blocked.join("sub").to_str().unwrap())["queues"], first["queues"]);
    assert_eq!(replay("off")["queues"], first["queues"]);
}
