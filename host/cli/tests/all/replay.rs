//! `wasmsched replay` on its defaults, through the real command.

use super::wasmsched;

#[test]
fn replay_without_arguments_makes_the_queues_contend() {
    let o = wasmsched(&["replay", "--native", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let waited = r["utilisation_mean_while_waiting_percent"].as_f64().expect("jobs waited");
    // The recorded times never fill the cluster (~1 %); the defaults do, and the scheduler keeps it
    // mostly allocated while work waits.
    assert!(waited > 50.0, "{waited}");
    assert!(r["utilisation_peak_percent"].as_f64().unwrap() > 90.0);
    assert!(r["evictions"].as_u64().unwrap() > 0, "preemption acts under contention");
    let delay = r["queues"]["LS"]["delay_mean"].as_f64().unwrap();
    assert!(delay > 0.0, "work queued: {delay}");
}
