//! Effects: how a driver carries out the core's decisions.
//!
//! The core decides and changes only its own state; binding a pod, evicting one, asking for a
//! checkpoint or telling a user why work waits is the driver's business. Both drivers — the
//! Kubernetes loop and the simulator's timed replay — implement [`Effects`] and hand the core's
//! decisions to [`carry_out`], so a decision means the same in both, and a new kind of decision
//! is a compile error in each until it is handled.
//!
//! Every method also gets the whole decision, for what observes it (events, metrics) rather
//! than acts on it.

use wasmsched_api::DeviceShare;

use crate::cycle::{Decision, EvictReason, Explanation};
use crate::plugin::PluginFault;

/// What a driver does for each kind of [`Decision`].
pub trait Effects {
    /// `task` (of `workload`) goes to `node` with `devices`: bind it.
    fn bind(&mut self, decision: &Decision, workload: &str, task: &str, node: &str, devices: &[DeviceShare]);

    /// An attempt of `workload` failed; `explanation` says why, for its waiting members.
    fn unschedulable(&mut self, decision: &Decision, workload: &str, explanation: &Explanation);

    /// Ask running `task` to checkpoint, for `preemptor`; the core evicts it at `deadline` (core
    /// seconds) unless the driver reports the checkpoint first
    /// ([`SchedulerCore::checkpoint_done`](crate::SchedulerCore::checkpoint_done)).
    fn request_checkpoint(&mut self, decision: &Decision, task: &str, preemptor: &str, deadline: u64);

    /// Stop `task` (of `workload`, on `node`) for `reason`. With
    /// [`CoreConfig::await_termination`](crate::CoreConfig::await_termination) its room stays
    /// held until the driver reports it gone ([`SchedulerCore::terminated`](crate::SchedulerCore::terminated)).
    fn evict(&mut self, decision: &Decision, workload: &str, task: &str, node: &str, reason: &EvictReason);

    /// Gang `workload` was given up after waiting past its timeout.
    fn timed_out(&mut self, decision: &Decision, workload: &str);

    /// A plugin failed; the cycle went on without it.
    fn fault(&mut self, decision: &Decision, fault: &PluginFault);
}

/// Hand `decision` to the matching method of `effects`.
pub fn carry_out(decision: &Decision, effects: &mut impl Effects) {
    match decision {
        Decision::Bound { workload, task, node, devices, .. } => effects.bind(decision, workload, task, node, devices),
        Decision::Unschedulable { workload, explanation } => effects.unschedulable(decision, workload, explanation),
        Decision::PreemptionRequested { task, preemptor, deadline, .. } => {
            effects.request_checkpoint(decision, task, preemptor, *deadline)
        }
        Decision::Evicted { workload, task, node, reason } => effects.evict(decision, workload, task, node, reason),
        Decision::TimedOut { workload } => effects.timed_out(decision, workload),
        Decision::Fault(fault) => effects.fault(decision, fault),
    }
}
