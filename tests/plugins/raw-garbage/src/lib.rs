//! A plugin written directly against the WIT bindings (as an author in another language would),
//! answering malformed results chosen by its configuration: `short` (too few filter codes),
//! `bad-code` (a code with no reason), `no-such-gpu` (a device that does not exist), `stale-slot`
//! (claims success without a mirror: filter answers for slots it never received),
//! `usage-refused` (refuses every usage update, forgetting its mirror; its filter passes only the
//! slots it holds, so it works only if the host then resends every node), `delta-out-of-range`
//! (fair share by changes answering a share for a queue that does not exist), `delta-missing`
//! (answering no share at all after a reset).
//! Natively this crate is empty.
#![cfg_attr(not(target_family = "wasm"), allow(unused))]
// Raw wit-bindgen output declares exported `unsafe extern` functions.
#![allow(unsafe_code)]

#[cfg(target_family = "wasm")]
mod component {
    wit_bindgen::generate!({ path: "../../../wit", world: "policy" });

    use exports::wasmsched::policy::{
        fair_share, fair_share_delta, filter, mirror, mirror_usage, plugin, preempt, score, select_devices,
    };
    use wasmsched::policy::types::{Node, Rejection, Resources, Stage, Task};

    static mut MODE: String = String::new();
    /// `usage-refused`: the slots received by `upsert` since the last reset or refusal.
    static mut HELD: Vec<u32> = Vec::new();

    #[allow(static_mut_refs)]
    fn mode() -> &'static str {
        // SAFETY: single-threaded guest; written once in init before any read.
        unsafe { MODE.as_str() }
    }

    struct Raw;

    impl plugin::Guest for Raw {
        #[allow(static_mut_refs)]
        fn init(config: String) -> Result<plugin::PluginInfo, String> {
            // SAFETY: single-threaded guest; init runs before every other export.
            unsafe { MODE = config };
            Ok(plugin::PluginInfo {
                name: "raw-garbage".into(),
                stages: vec![Stage::Filter, Stage::Score, Stage::SelectDevices, Stage::FairShare],
                sdk_version: "raw-bindings".into(),
            })
        }
    }

    #[allow(static_mut_refs)]
    fn held() -> &'static mut Vec<u32> {
        // SAFETY: single-threaded guest; no reference outlives the export call using it.
        unsafe { &mut HELD }
    }

    impl mirror::Guest for Raw {
        fn reset(_: u64, _: u32) {
            held().clear();
        }
        fn upsert(_: u64, nodes: Vec<(u32, Node)>) {
            held().extend(nodes.iter().map(|(s, _)| *s));
        }
        fn remove(_: u64, slots: Vec<u32>) {
            held().retain(|s| !slots.contains(s));
        }
    }

    impl mirror_usage::Guest for Raw {
        fn update_usage(_: u64, _: Vec<(u32, mirror_usage::NodeUsage)>) -> Result<(), String> {
            if mode() != "usage-refused" {
                return Ok(());
            }
            held().clear();
            Err("out of step".into())
        }
    }

    impl filter::Guest for Raw {
        fn filter(_task: Task, candidates: Vec<u32>) -> Result<filter::FilterResult, String> {
            let n = candidates.len();
            Ok(match mode() {
                "short" => filter::FilterResult { codes: vec![0; n / 2], reasons: vec![] },
                "bad-code" => filter::FilterResult {
                    codes: vec![7; n],
                    reasons: vec![Rejection { reason: "r".into(), unresolvable: false }],
                },
                "usage-refused" => filter::FilterResult {
                    codes: candidates.iter().map(|s| u16::from(!held().contains(s))).collect(),
                    reasons: vec![Rejection { reason: "not mirrored".into(), unresolvable: false }],
                },
                _ => filter::FilterResult { codes: vec![0; n], reasons: vec![] },
            })
        }
    }

    impl score::Guest for Raw {
        fn score(_task: Task, candidates: Vec<u32>) -> Result<Vec<u32>, String> {
            Ok(vec![100; candidates.len() + 3])
        }
    }

    impl select_devices::Guest for Raw {
        fn select_devices(
            _task: Task,
            _node: u32,
        ) -> Result<Result<Vec<select_devices::DeviceShare>, Rejection>, String> {
            Ok(Ok(vec![select_devices::DeviceShare { gpu: 99, milli: 1000 }]))
        }
    }

    impl preempt::Guest for Raw {
        fn select_victims(_: Task, _: Vec<preempt::Candidate>) -> Result<Option<preempt::Preemption>, String> {
            Err("not implemented".into())
        }
    }

    impl fair_share::Guest for Raw {
        fn compute(_: Vec<fair_share::QueueState>, _: Resources) -> Result<fair_share::ShareDecision, String> {
            Err("not implemented".into())
        }
    }

    impl fair_share_delta::Guest for Raw {
        fn compute_changed(
            _reset: bool,
            count: u32,
            _changed: Vec<(u32, fair_share::QueueState)>,
            _cluster: Resources,
        ) -> Result<fair_share_delta::ShareDelta, String> {
            let none = || Resources { cpu_milli: 0, memory_bytes: 0, gpu_milli: 0, extended: vec![] };
            let deserved = match mode() {
                "delta-out-of-range" => (0..=count).map(|i| (i, none())).collect(),
                "delta-missing" => vec![],
                _ => return Err("not implemented".into()),
            };
            Ok(fair_share_delta::ShareDelta { deserved, order: (0..count).collect() })
        }
    }

    export!(Raw);
}
