//! The embedded simulator: replays GPU-cluster traces through the scheduling core, in virtual
//! time, with no I/O beyond reading the trace, so a run is deterministic for a given seed.
//!
//! It runs the FGD paper's "submit until X % of GPU capacity has arrived" experiment (see
//! `docs/openb-protocol.md`, §2 and §5) with any [`PolicySet`], measuring allocation and
//! fragmentation after every pod; the paper's six policies are the `gpu-share-score` plugin.
//!
//! # Core concepts
//! - [`trace`]: openb CSV loaders (both column shapes), with file/line/column errors.
//! - [`workload`]: the protocol's seeded shuffle, tune-to-target and node ranks, and the trace's
//!   target workload for fragmentation.
//! - [`replay`]: submit each pod once, place it with the policy set, record the allocation and
//!   fragmentation series and reduce them to the paper's columns.
//! - [`experiment`]: the traces × policies × seeds grid in parallel, and the headline table.
//! - [`timed`]: time-driven replay through the scheduling core (queues, gangs, preemption), and the
//!   scenario format (JSON/YAML).
//! - [`philly`]: Microsoft's Philly job log (real multi-GPU jobs of hours to weeks) as a scenario.
//! - [`generate`]: seeded random clusters and tasks, shared with tests and benchmarks.
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use wasmsched_core::{NativePlugin, PolicySet};
//! use wasmsched_sim::{replay, trace, workload};
//!
//! let nodes = trace::parse_nodes("nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\nn1,8000,65536,2,T4\n").unwrap();
//! let pods = trace::parse_pods("pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,500\np2,1000,1024,2,1000\n").unwrap();
//! let set = PolicySet::builder()
//!     .filter(Arc::new(NativePlugin::<wasmsched_plugin_resource_fit::ResourceFit>::new("", 1).unwrap()))
//!     .build();
//! let order = workload::build(&pods, &nodes, 42, 1.3);
//! let run = replay::run(&set, &order.nodes, &order.pods, &workload::target_workload(&pods));
//! assert_eq!(run.placed + run.failed, order.pods.len());
//! ```

pub mod experiment;
pub mod generate;
pub mod philly;
pub mod replay;
pub mod timed;
pub mod trace;
pub mod workload;
