//! Accelerator kinds besides NVIDIA's GPUs — AMD, Intel Gaudi, Huawei Ascend, AWS Neuron — from the
//! host ([`wasmsched_api::accelerators`] has the model).
//!
//! The SDK fills `GpuDevice::kind` and `GpuRequest::kind` before a plugin sees a node or a task (in
//! a component it asks the host once per node change and once per instance for the kinds), so
//! `GpuRequest::fits_device` and the SDK's helpers already keep a request to its own kind. A plugin
//! reads the kinds to prefer one vendor, or to report them.
//!
//! ```
//! use wasmsched_sdk::prelude::*;
//! use wasmsched_sdk::accelerators;
//!
//! fn vendor_of(node: &Node) -> &str {
//!     accelerators::display_name(node.gpus.first().map_or("", |g| g.kind.as_str()))
//! }
//! assert_eq!(vendor_of(&Node::default()), "nvidia");
//! ```

pub use wasmsched_api::accelerators::{Kind, NVIDIA, display_name, kind_of_request, stored_name};

/// The kinds the host knows besides NVIDIA's (none natively outside a host call).
pub fn kinds() -> Vec<Kind> {
    #[cfg(target_family = "wasm")]
    {
        crate::__private::kinds().to_vec()
    }
    #[cfg(not(target_family = "wasm"))]
    {
        wasmsched_api::accelerators::current().map(|v| v.kinds()).unwrap_or_default()
    }
}
