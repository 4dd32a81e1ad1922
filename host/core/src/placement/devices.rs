//! The device-selection stage: which GPUs of the chosen node a task gets — the set's plugin, or
//! the default rule.

use wasmsched_api::{DeviceShare, Node, Rejection, Task};

use crate::node_table::{NodeTable, Slot};
use crate::plugin::{CallContext, FailurePolicy, PluginFault, validate};
use crate::policy_set::PolicySet;

/// The set's device selection on one node (its plugin, else the default rule; a fail-open fault
/// falls back to the default and goes to `skipped`), not yet checked against the node.
pub(super) fn select_devices(
    set: &PolicySet,
    ctx: CallContext<'_>,
    task: &Task,
    slot: Slot,
    node: &wasmsched_api::Node,
    skipped: &mut Vec<PluginFault>,
) -> Result<Result<Vec<DeviceShare>, wasmsched_api::Rejection>, PluginFault> {
    Ok(match &set.devices {
        None => default_select_devices(task, node),
        Some(p) => match p.select_devices(ctx, task, slot) {
            Ok(r) => r,
            Err(fault) if p.failure_policy() == FailurePolicy::FailOpen => {
                skipped.push(fault);
                default_select_devices(task, node)
            }
            Err(fault) => return Err(fault),
        },
    })
}

/// The GPUs `set` gives `task` on node `slot` (its device-selection plugin, else the default
/// rule), checked against the node; the reason when none fit.
pub fn select_devices_on(
    set: &PolicySet,
    nodes: &NodeTable,
    task: &Task,
    worker: usize,
    slot: Slot,
) -> Result<Vec<DeviceShare>, String> {
    let node = nodes.get(slot).ok_or("node not found")?;
    let chosen = select_devices(set, CallContext { worker, nodes }, task, slot, node, &mut Vec::new());
    let devices = chosen.map_err(|fault| fault.to_string())?.map_err(|r| r.reason)?;
    validate::devices(&devices, task, node)?;
    Ok(devices)
}

/// Device selection used when the policy set has no device-selection plugin:
/// [`wasmsched_api::default_devices`] (lowest-index whole GPUs; best fit for a share), the same
/// rule plugins fall back to.
pub fn default_select_devices(task: &Task, node: &Node) -> Result<Vec<DeviceShare>, Rejection> {
    wasmsched_api::default_devices(&task.gpu, node)
}
