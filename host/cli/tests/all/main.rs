//! The CLI crate's integration tests, as one binary: each extra test binary links the
//! crate's dependencies again. They run the real `wasmsched` binary.

mod bench;
mod cache;
mod dashboard;
mod domains;
mod dra;
mod events;
mod experiment;
mod history;
mod plugin_new;
mod policy;
mod policy_bench;
mod python;
mod replay;
mod run;
#[path = "../../../events/tests/all/support/mod.rs"]
mod support;
mod topo;
mod tutorial;
mod usage;

/// Run the real `wasmsched` binary from the checkout's root (where `examples/` is).
fn wasmsched(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(args)
        .output()
        .expect("run wasmsched")
}
