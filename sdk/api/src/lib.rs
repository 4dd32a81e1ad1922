//! The wasmsched policy API: the types and stage traits a scheduling policy is written against.
//!
//! This crate is the plain-Rust face of the WIT contract in `wit/policy.wit`. The same types are
//! used on both sides of the Wasm boundary:
//!
//! - plugin authors implement [`Filter`], [`Score`], [`SelectDevices`], [`Preempt`] or [`FairShare`]
//!   (each optional) on a type that implements [`Plugin`], and export it with the SDK's
//!   `export_plugin!` macro;
//! - the host runs the very same implementation natively (benchmark baseline, differential oracle)
//!   or as a component, and cannot tell the two apart by their answers.
//!
//! It has no dependencies so that it compiles quickly for `wasm32-wasip2` and stays a pure data
//! model: no I/O, no clock, no randomness.
//!
//! # Core concepts
//! - [`Task`] and [`Node`]: what is placed and where. Quantities use base units: CPU in
//!   milli-cores, memory in bytes, GPUs in milli-GPUs ([`GPU_MILLI`] = one device).
//! - [`Verdict`]: a filter's answer for one node. A verdict is data, not an error; plugin faults are
//!   reported separately as `Err(String)` from the batch entry points.
//! - [`Score`]: a bounded node score, `0..=`[`MAX_SCORE`].
//!
//! # Example
//! ```
//! use wasmsched_api::*;
//!
//! struct NeedsGpu;
//! impl Plugin for NeedsGpu {
//!     const NAME: &'static str = "needs-gpu";
//!     fn new(_config: &str) -> Result<Self, String> { Ok(NeedsGpu) }
//! }
//! impl Filter for NeedsGpu {
//!     fn filter(&mut self, _task: &Task, node: &Node) -> Verdict {
//!         if node.gpus.is_empty() { Verdict::unresolvable("node has no GPU") } else { Verdict::Fit }
//!     }
//! }
//! let node = Node { name: "n0".into(), ..Node::default() };
//! assert!(!NeedsGpu.filter(&Task::default(), &node).fits());
//! ```

/// The hook through which the host answers a plugin's host-import questions natively: a view
/// installed on the calling thread for the length of a call (what the Wasm runtime's imports read
/// from the store). Defines `with_view` and `current` for the trait named.
macro_rules! call_view {
    ($view:ident) => {
        #[cfg(not(target_family = "wasm"))]
        mod native {
            use std::cell::RefCell;
            use std::sync::Arc;

            use super::$view;

            thread_local! {
                static CURRENT: RefCell<Option<Arc<dyn $view>>> = const { RefCell::new(None) };
            }

            /// Runs `f` with `view` answering this thread's questions (what the host does around
            /// every native plugin call), restoring the previous view afterwards.
            pub fn with_view<R>(view: Option<Arc<dyn $view>>, f: impl FnOnce() -> R) -> R {
                struct Restore(Option<Arc<dyn $view>>);
                impl Drop for Restore {
                    fn drop(&mut self) {
                        let previous = self.0.take();
                        CURRENT.with_borrow_mut(|c| *c = previous);
                    }
                }
                let _restore = Restore(CURRENT.with_borrow_mut(|c| std::mem::replace(c, view)));
                f()
            }

            /// The view installed on this thread, if any.
            pub fn current() -> Option<Arc<dyn $view>> {
                CURRENT.with_borrow(|c| c.clone())
            }
        }

        #[cfg(not(target_family = "wasm"))]
        pub use native::{current, with_view};
    };
}

pub mod accelerators;
mod affinity;
pub mod batch;
pub mod domains;
pub mod fragmentation;
pub mod gpu_affinity;
mod model;
mod resource_name;
mod stages;
pub mod topology;

pub use affinity::*;
pub use model::*;
pub use resource_name::ResourceName;
pub use stages::*;

/// The device choice when no policy says otherwise, shared by the host (a policy set without a
/// device-selection plugin) and plugins that fall back to it.
///
/// Whole GPUs: the lowest-index devices that can take them. A shared GPU: best fit, the device
/// with the least free share that still fits (ties to the lowest index), which keeps whole
/// devices free for whole-GPU tasks.
pub fn default_devices(req: &GpuRequest, node: &Node) -> Result<Vec<DeviceShare>, Rejection> {
    if req.count == 0 {
        return Ok(Vec::new());
    }
    let fits = node.gpus.iter().filter(|g| req.fits_device(g));
    let chosen: Vec<DeviceShare> = if req.milli_per_gpu >= GPU_MILLI {
        fits.take(req.count as usize).map(|g| DeviceShare { gpu: g.index, milli: req.milli_per_gpu }).collect()
    } else {
        fits.min_by_key(|g| (g.free_milli, g.index))
            .map(|g| DeviceShare { gpu: g.index, milli: req.milli_per_gpu })
            .into_iter()
            .collect()
    };
    if chosen.len() == req.count as usize {
        Ok(chosen)
    } else {
        Err(Rejection { reason: "no device set fits the GPU request".into(), unresolvable: false })
    }
}

/// Version of the WIT package this API mirrors. The host refuses components built against an
/// incompatible major (for 0.x: minor) version.
pub const CONTRACT_VERSION: &str = "0.2.0";
