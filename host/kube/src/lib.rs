//! wasmsched as a Kubernetes scheduler.
//!
//! The data flow, module by module:
//! - [`convert`]: Nodes and Pods to the scheduling model (quantities, GPUs, groups, queues).
//! - [`cache`]: the cluster from the watch streams, plus pods assumed while their bind is in flight.
//! - [`queues`]: `Queue` objects as the core's queue tree.
//! - [`priorities`]: `PriorityClass` objects, for pod groups that name one.
//! - [`groups`]: which gang a pod belongs to — our `PodGroup`, the upstream Workload API's, the
//!   coscheduling plugin's, Volcano's, or its owner (Job, JobSet, training job, Ray, LWS).
//! - [`workloads`]: our pods (and their groups) as the core's workloads.
//! - [`dra`]: ResourceSlices, DeviceClasses and ResourceClaims: which nodes can serve a pod's
//!   claims, and the allocations written on them before a bind.
//! - [`compute_domains`]: the `ComputeDomain` (multi-node NVLink) a pod asks for: one NVLink
//!   domain for its workload, the object created and deleted with its pods.
//! - [`disruption`]: `PodDisruptionBudget`s, which withdraw the pods they protect as victims.
//! - [`scheduler`]: the loop — watch, run the core's cycle with the registry's live policy set,
//!   carry out its decisions.
//! - [`executor`]: where the loop's writes go — one interface, the API server's implementation
//!   ([`bind`]) and one in memory, for driving the loop without HTTP.
//! - [`bind`]: the API effects — `pods/binding` with the GPU ids, `PodScheduled` and events,
//!   evictions through the Eviction API.
//! - [`pod_status`]: why each pending pod waits (`PodScheduled=False`), coalesced and retried.
//! - [`status`]: what the scheduler reports on `Queue` and `PodGroup` objects.
//! - [`throttle`]: the client's rate and burst (kube-scheduler's `clientConnection`), and the
//!   Lease's own client.
//! - [`extender`]: the same policy set behind kube-scheduler's extender protocol, for clusters that
//!   keep kube-scheduler.
//! - [`leader`]: one active replica, on a `coordination.k8s.io` Lease.
//! - [`metrics`]: kube-scheduler's metric names, `/metrics`, `/healthz`, `/readyz`.
//! - [`policy`]: the default policy set and the registry that swaps versions live.
//! - [`crd`]: the `Queue`, `PodGroup` and `SchedulingPolicy` resources.
//!
//! The core does no I/O; everything that talks to the API server is here, behind kube-rs. The
//! loop's inputs are streams and its writes go through an executor, so it is tested both in memory
//! (`tests/all/driver.rs`) and, for what only the HTTP boundary shows, against a fake API server.

pub mod accelerators;
pub mod bind;
pub mod cache;
pub mod compute_domains;
pub mod convert;
pub mod crd;
pub mod disruption;
pub mod dra;
pub mod executor;
pub mod extender;
pub mod groups;
pub mod leader;
pub mod metrics;
pub mod pod_status;
pub mod policy;
pub mod policy_source;
pub mod priorities;
pub mod queues;
pub mod scheduler;
pub mod snapshot;
pub mod status;
pub mod throttle;
pub mod workloads;

pub use scheduler::{Scheduler, SchedulerConfig};
pub use throttle::{ClientRate, Clients};
