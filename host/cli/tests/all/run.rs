//! `wasmsched run` outside a cluster: a clear error, not a hang or a panic.

use std::process::Command;

#[test]
fn run_without_a_cluster_says_what_it_could_not_reach() {
    let out = Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .env("WASMSCHED_CACHE_DIR", "off")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .args(["run", "--policy-object", "gpu", "--metrics-addr", "127.0.0.1:0"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("connecting to the Kubernetes API"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_policy_bucket_without_a_nats_server_is_refused_before_anything_starts() {
    let out = Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .env("WASMSCHED_CACHE_DIR", "off")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .args(["run", "--policy-bucket", "policies", "--metrics-addr", "127.0.0.1:0"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--policy-bucket needs the NATS server it is on (--nats)"), "{stderr}");
    assert!(!stderr.contains("connecting to the Kubernetes API"), "refused before connecting: {stderr}");
}
