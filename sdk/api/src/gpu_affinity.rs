//! The GPU shape label: which GPU shapes (`share`, `<k>-gpu`) the pods on a node have.
//!
//! The FGD paper's `gpu-clustering` scorer co-locates pods of the same shape. It reads the label;
//! whoever binds pods (the simulator, a driver) keeps it up to date. Both sides use these
//! functions, so they agree on the label's spelling.

use crate::model::{GPU_MILLI, Node, Task};

/// Node label with the distinct GPU shapes (`share`, `<k>-gpu`) of the pods on the node, sorted and
/// comma-separated; `gpu-clustering` prefers nodes whose pods look like the one being placed.
pub const AFFINITY_LABEL: &str = "wasmsched.io/gpu-affinity";

/// The GPU shape class of a task: `share` (one partial GPU), `<k>-gpu` (whole GPUs), none for CPU-only.
pub fn affinity(task: &Task) -> Option<String> {
    let g = &task.gpu;
    match (g.count, g.milli_per_gpu) {
        (0, _) | (_, 0) => None,
        (1, m) if m < GPU_MILLI => Some("share".into()),
        (k, _) => Some(format!("{k}-gpu")),
    }
}

/// Whether `node`'s [`AFFINITY_LABEL`] already says what [`record_affinity`] would record for
/// `task` (binders skip the label update, a full node change for mirrors, when it does).
pub fn affinity_recorded(node: &Node, task: &Task) -> bool {
    affinity(task).is_none_or(|aff| node.label(AFFINITY_LABEL).is_some_and(|v| v.split(',').any(|s| s == aff)))
}

/// Record on `node`'s [`AFFINITY_LABEL`] that `task` was bound to it.
pub fn record_affinity(node: &mut Node, task: &Task) {
    let Some(aff) = affinity(task) else { return };
    let at = node.labels.iter().position(|(k, _)| k == AFFINITY_LABEL);
    let mut set: Vec<&str> =
        at.map(|i| node.labels[i].1.split(',').filter(|s| !s.is_empty()).collect()).unwrap_or_default();
    if set.contains(&aff.as_str()) {
        return;
    }
    set.push(&aff);
    set.sort_unstable();
    let value = set.join(",");
    match at {
        Some(i) => node.labels[i].1 = value,
        None => node.labels.push((AFFINITY_LABEL.into(), value)),
    }
}
