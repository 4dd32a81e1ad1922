//! A plugin written directly against the WIT bindings (as an author in another language would),
//! answering malformed results chosen by its configuration: `short` (too few filter codes),
//! `bad-code` (a code with no reason), `no-such-gpu` (a device that does not exist), `stale-slot`
//! (claims success without a mirror: filter answers for slots it never received),
//! `usage-refused` (refuses every usage update, forgetting its mirror; its filter passes only the
//! slots it holds, so it works only if the host then resends every node), `delta-out-of-range`
//! (fair share by changes answering a share for a queue that does not exist), `delta-missing`
//! (answering no share at all after a reset), `brief-task-error` (its `placement.filter` fails
//! for a task sent as a `brief-task`, succeeds for a full one), `stops-short` (its
//! `placement.filter` stops one fit before `enough`), `rank-out-of-range` / `rank-twice` (its DRA
//! ranking names a device that is not a candidate, or one twice), `reset-loop` / `upsert-loop`
//! (the mirror call that starts or fills a fresh instance's copy of the nodes never returns).
//! `placement` answers as the plain stage exports do.
//! Natively this crate is empty.
#![cfg_attr(not(target_family = "wasm"), allow(unused))]
// Raw wit-bindgen output declares exported `unsafe extern` functions.
#![allow(unsafe_code)]

#[cfg(target_family = "wasm")]
mod component {
    wit_bindgen::generate!({ path: "../../../wit", world: "policy" });

    use exports::wasmsched::policy::{
        fair_share, fair_share_delta, filter, mirror, mirror_usage, placement, plugin, preempt, score,
        select_claim_devices, select_devices,
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
            spin_in("reset-loop");
            held().clear();
        }
        fn upsert(_: u64, nodes: Vec<(u32, Node)>) {
            spin_in("upsert-loop");
            held().extend(nodes.iter().map(|(s, _)| *s));
        }
        fn remove(_: u64, slots: Vec<u32>) {
            held().retain(|s| !slots.contains(s));
        }
    }

    /// Never return in mode `looping`: only the host's budget ends the call.
    fn spin_in(looping: &str) {
        if mode() == looping {
            loop {
                std::hint::black_box(0u64);
            }
        }
    }

    impl mirror_usage::Guest for Raw {
        fn update_usage(_: u64, usage: Vec<(u32, mirror_usage::NodeUsage)>) -> Result<(), String> {
            refuse_usage(usage.len())
        }
    }

    /// In `usage-refused` mode, any usage update is refused and the mirror forgotten.
    fn refuse_usage(updates: usize) -> Result<(), String> {
        if mode() != "usage-refused" || updates == 0 {
            return Ok(());
        }
        held().clear();
        Err("out of step".into())
    }

    fn filter_codes(candidates: &[u32]) -> filter::FilterResult {
        let n = candidates.len();
        match mode() {
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
        }
    }

    impl filter::Guest for Raw {
        fn filter(_task: Task, candidates: Vec<u32>) -> Result<filter::FilterResult, String> {
            Ok(filter_codes(&candidates))
        }
    }

    impl score::Guest for Raw {
        fn score(_task: Task, candidates: Vec<u32>) -> Result<Vec<u32>, String> {
            Ok(vec![100; candidates.len() + 3])
        }
    }

    /// The same answers through the lighter calls; `stage-error` in `brief-task-error` mode when
    /// the task came brief, so tests can see which form the host sent.
    impl placement::Guest for Raw {
        fn filter(
            _: u64,
            usage: Vec<(u32, mirror_usage::NodeUsage)>,
            task: placement::StageTask,
            candidates: Vec<u32>,
            enough: Option<u32>,
        ) -> Result<filter::FilterResult, placement::StageError> {
            refuse_usage(usage.len()).map_err(placement::StageError::OutOfStep)?;
            if mode() == "brief-task-error" && matches!(task, placement::StageTask::Brief(_)) {
                return Err(placement::StageError::Failed("the task came brief".into()));
            }
            if mode() == "stops-short" {
                // Stops before `enough` candidates fit (all of them fit).
                let n = enough.unwrap_or(0).saturating_sub(1) as usize;
                return Ok(filter::FilterResult { codes: vec![0; n.min(candidates.len())], reasons: vec![] });
            }
            Ok(filter_codes(&candidates))
        }

        fn score(
            _: u64,
            usage: Vec<(u32, mirror_usage::NodeUsage)>,
            _task: placement::StageTask,
            candidates: Vec<u32>,
        ) -> Result<Vec<u32>, placement::StageError> {
            refuse_usage(usage.len()).map_err(placement::StageError::OutOfStep)?;
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

    impl select_claim_devices::Guest for Raw {
        fn rank(_task: Task, _node: u32, request: select_claim_devices::ClaimRequest) -> Result<Vec<u32>, String> {
            let n = request.candidates.len() as u32;
            Ok(match mode() {
                "rank-out-of-range" => vec![n],
                "rank-twice" => vec![0, 0],
                _ => (0..n).rev().collect(),
            })
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
            let none = || Resources { cpu_milli: 0, memory_bytes: 0, gpu_milli: 0, extended: Default::default() };
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
