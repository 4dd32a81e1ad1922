//! `wasmsched policy bench` at toy sizes: swap phases really swap, and the control run never does.

use std::process::Command;

fn policy_bench(extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .env("WASMSCHED_CACHE_DIR", "off")
        .args(["policy", "bench", "--repeat", "1", "--size", "0", "--nodes", "60"])
        .args(["--decisions", "150", "--rounds", "3", "--swap-ms", "1"])
        .args(extra)
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The number after `key` on the first line that has it.
fn number_after(text: &str, key: &str) -> Option<f64> {
    let rest = text.lines().find_map(|l| l.split_once(key).map(|(_, r)| r.trim_start().to_string()))?;
    rest.split(|c: char| !(c.is_ascii_digit() || c == '.')).next()?.parse().ok()
}

#[test]
fn swap_phases_put_new_versions_live_and_the_control_run_keeps_one() {
    let swapping = policy_bench(&[]);
    assert!(swapping.contains("arrival to live, cached compiled artifact"), "{swapping}");
    let first = number_after(&swapping, "first decision with a new version:").expect("first decisions reported");
    assert!(first > 0.0, "a prepared version went live during its phase:\n{swapping}");
    for case in ["no swaps", "swaps of prepared versions", "swaps of freshly prepared versions"] {
        let row = swapping.lines().find(|l| l.trim_start().starts_with(case));
        assert!(row.is_some_and(|r| r.contains("p99") && r.contains("ratio")), "{case} missing:\n{swapping}");
    }

    let control = policy_bench(&["--null-swaps"]);
    assert!(control.contains("null swaps (control"), "{control}");
    assert!(
        !control.contains("first decision with a new version"),
        "the control run must never change the live version:\n{control}"
    );
}
