//! The kube crate's integration tests, as one binary: each extra test binary links the
//! crate's dependencies again, which is most of a clean test build's time.

mod accelerators;
mod boundary;
mod cluster_bench;
mod compute_domains;
mod crds;
mod dra;
mod driver;
mod extender;
mod history;
mod mutated;
mod observability;
mod policy_object;
mod soak;
mod support;
mod workloads;
