//! Write wasmsched scheduling policies in Rust and export them as WebAssembly components.
//!
//! A policy is a type that implements [`Plugin`] and one or more stage traits ([`Filter`],
//! [`Score`], [`SelectDevices`], [`Preempt`], [`FairShare`]) with plain Rust types. One macro,
//! [`export_plugin!`], turns it into a component that implements the `wasmsched:policy` WIT
//! contract:
//!
//! ```
//! use wasmsched_sdk::prelude::*;
//!
//! pub struct OnlyA100;
//!
//! impl Plugin for OnlyA100 {
//!     const NAME: &'static str = "only-a100";
//!     fn new(_config: &str) -> Result<Self, String> { Ok(OnlyA100) }
//! }
//!
//! impl Filter for OnlyA100 {
//!     fn filter(&mut self, _task: &Task, node: &Node) -> Verdict {
//!         if node.gpus.iter().any(|g| g.model.starts_with("A100")) { Verdict::Fit }
//!         else { Verdict::unresolvable("no A100 on node") }
//!     }
//! }
//!
//! wasmsched_sdk::export_plugin!(OnlyA100: filter);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2`; the `.wasm` in
//! `target/wasm32-wasip2/release/` is the component. Natively the macro only declares the stages,
//! so the same crate links into tests and into the host as an ordinary library;
//! [`testing::NativeHarness`] runs it with the exact batch semantics the component has.
//!
//! # What the SDK hides
//! - The node mirror: the host sends node changes tagged with generations and stage calls carry
//!   slot numbers; the SDK keeps the table and hands your code `&Node`.
//! - Compact verdicts: rejection reasons are interned per batch.
//! - Panics: a panic is logged through the host (with its message) and then traps; the host
//!   replaces the instance and applies your plugin's failure policy.

pub use wasmsched_api::*;

pub mod accelerators;
pub mod domains;
pub mod testing;
pub mod topology;

/// Reading plugin configuration.
#[cfg(feature = "json")]
pub mod config {
    /// Parse `text` as JSON into `T`; empty (or blank) text gives `T::default()`. Errors read
    /// `invalid <plugin> configuration: <serde's message>`, which the host shows operators verbatim.
    pub fn json<T: serde::de::DeserializeOwned + Default>(plugin: &str, text: &str) -> Result<T, String> {
        if text.trim().is_empty() {
            return Ok(T::default());
        }
        serde_json::from_str(text).map_err(|e| format!("invalid {plugin} configuration: {e}"))
    }
}

mod candidates;

#[cfg(target_family = "wasm")]
#[doc(hidden)]
pub mod __private;

/// Version of this SDK, reported to the host in `plugin-info`.
pub const SDK_VERSION: &str = concat!("wasmsched-sdk/", env!("CARGO_PKG_VERSION"));

/// Everything a plugin needs, for `use wasmsched_sdk::prelude::*`.
pub mod prelude {
    pub use wasmsched_api::{
        AttributeValue, ClaimDevice, ClaimRequest, DeviceShare, FairShare, Filter, GPU_MILLI, GpuDevice, GpuHealth,
        GpuRequest, GpuSummary, Gpus, MAX_SCORE, Node, NodeAffinity, NodeSelectorTerm, Plugin, Preempt,
        PreemptCandidate, Preemption, PreferredTerm, Qos, QueueState, RankClaimDevices, Rejection, Resources, Score,
        SelectDevices, SelectorOperator, SelectorRequirement, ShareDecision, Taint, TaintEffect, Task, Toleration,
        TolerationOperator, Verdict, Victim,
    };
}

/// Log a message through the host (a no-op natively). Use sparingly on hot paths: each call
/// crosses the boundary.
pub fn log(level: LogLevel, message: &str) {
    #[cfg(target_family = "wasm")]
    __private::log(level, message);
    #[cfg(not(target_family = "wasm"))]
    let _ = (level, message);
}

/// Log levels for [`log`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    /// Trace.
    Trace,
    /// Debug.
    Debug,
    /// Info.
    Info,
    /// Warn.
    Warn,
    /// Error.
    Error,
}

/// Export a plugin type as a wasmsched component, naming the stages it implements:
/// `export_plugin!(MyPolicy: filter, score);`. Stages: `filter`, `score`, `select_devices`,
/// `rank_claim_devices` (DRA devices), `preempt`, `fair_share`. Natively it only implements [`Stages`] for the type.
#[macro_export]
macro_rules! export_plugin {
    ($ty:ty : $($stage:ident),+ $(,)?) => {
        $crate::declare_stages!($ty : $($stage),+);
        $crate::__export_component!($ty : $($stage),+);
    };
}

#[doc(hidden)]
#[cfg(not(target_family = "wasm"))]
#[macro_export]
macro_rules! __export_component {
    ($ty:ty : $($stage:ident),+) => {};
}

/// `{ yes }` when `want` (`filter` or `score`) is among the listed stages, else `{ no }`: the export
/// macro dispatches a listed stage statically (the type is known to implement its trait) and an
/// unlisted one through [`Stages`] (which answers "not implemented").
#[doc(hidden)]
#[macro_export]
macro_rules! __if_stage {
    ($want:ident [] { $($yes:tt)* } else { $($no:tt)* }) => { $($no)* };
    (filter [filter $($rest:ident)*] { $($yes:tt)* } else { $($no:tt)* }) => { $($yes)* };
    (score [score $($rest:ident)*] { $($yes:tt)* } else { $($no:tt)* }) => { $($yes)* };
    ($want:ident [$other:ident $($rest:ident)*] { $($yes:tt)* } else { $($no:tt)* }) => {
        $crate::__if_stage!($want [$($rest)*] { $($yes)* } else { $($no)* })
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_listed_stage_is_dispatched_statically_and_an_unlisted_one_is_not() {
        let pick = |listed: bool| if listed { "static" } else { "dynamic" };
        assert_eq!(crate::__if_stage!(filter [score filter] { pick(true) } else { pick(false) }), "static");
        assert_eq!(crate::__if_stage!(score [score] { pick(true) } else { pick(false) }), "static");
        assert_eq!(crate::__if_stage!(score [filter select_devices] { pick(true) } else { pick(false) }), "dynamic");
        assert_eq!(crate::__if_stage!(filter [fair_share] { pick(true) } else { pick(false) }), "dynamic");
    }
}
