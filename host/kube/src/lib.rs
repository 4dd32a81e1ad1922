//! wasmsched as a Kubernetes scheduler.
//!
//! The data flow, module by module:
//! - [`convert`]: Nodes and Pods to the scheduling model (quantities, GPUs, groups, queues).
//! - [`cache`]: the cluster from the watch streams, plus pods assumed while their bind is in flight.
//! - [`queue`]: pending pods by priority, with back-off.
//! - [`scheduler`]: the loop — watch, decide with the registry's live policy set, bind.
//! - [`bind`]: the API effects — `pods/binding` with the GPU ids, `PodScheduled` and events,
//!   evictions through the Eviction API.
//! - [`leader`]: one active replica, on a `coordination.k8s.io` Lease.
//! - [`metrics`]: kube-scheduler's metric names, `/metrics`, `/healthz`, `/readyz`.
//! - [`policy`]: the default policy set and the registry that swaps versions live.
//! - [`crd`]: the `Queue`, `PodGroup` and `SchedulingPolicy` resources.
//!
//! The core does no I/O; everything that talks to the API server is here, behind kube-rs, so the
//! Kubernetes boundary can be tested over HTTP against a fake API server.

pub mod bind;
pub mod cache;
pub mod convert;
pub mod crd;
pub mod leader;
pub mod metrics;
pub mod policy;
pub mod policy_source;
pub mod queue;
pub mod scheduler;

pub use scheduler::{Scheduler, SchedulerConfig};
