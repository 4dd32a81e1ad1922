//! Accelerator kinds as the host keeps them: which kinds exist besides NVIDIA's, which kind each
//! device of each node is, and the host's own rule that a task only lands where devices of its
//! kind are (see [`wasmsched_api::accelerators`] for the model).
//!
//! The rule is the host's, not a policy's, because policies built before kinds existed cannot
//! know them: to such a filter an AMD node's eight devices are eight GPUs, and it would pass an
//! NVIDIA pod there. So before any policy filter runs, a node without enough usable devices of
//! the task's kind is rejected here (unresolvable: no eviction adds devices) and one whose devices
//! of that kind are busy is rejected as preemption might help. A cluster of NVIDIA GPUs alone
//! never pays for it: the check runs only once a node with another kind has been seen.

use ahash::AHashMap;
use wasmsched_api::accelerators::{AcceleratorView, Kind, display_name};
use wasmsched_api::{GpuHealth, Node, Task};

/// The kinds the host knows and the kinds of the devices of nodes that have any but NVIDIA's.
#[derive(Clone, Debug, Default)]
pub struct Accelerators {
    kinds: Vec<Kind>,
    /// Per node with a device of another kind than NVIDIA's, each device's stored kind.
    devices: AHashMap<String, Vec<String>>,
    /// A node with another kind has been seen (never cleared: the check stays on, which is
    /// only ever more careful).
    seen: bool,
}

impl Accelerators {
    /// Set the kinds known besides NVIDIA's (a frontend's accelerator table).
    pub fn set_kinds(&mut self, kinds: Vec<Kind>) {
        self.kinds = kinds;
    }

    /// The kinds known besides NVIDIA's.
    pub fn kinds(&self) -> &[Kind] {
        &self.kinds
    }

    /// Whether the host must check kinds: some node has had a device of another kind.
    #[inline]
    pub fn checks(&self) -> bool {
        self.seen
    }

    /// Whether [`Accelerators::set`] with `node` would change anything.
    pub fn differs(&self, node: &Node) -> bool {
        let other = node.gpus.iter().any(|g| !g.kind.is_empty());
        match self.devices.get(&node.name) {
            Some(kinds) => {
                !other
                    || kinds.len() != node.gpus.len()
                    || kinds.iter().zip(node.gpus.iter()).any(|(k, g)| *k != g.kind)
            }
            None => other,
        }
    }

    /// Record `node`'s devices' kinds (after it was added or changed).
    pub fn set(&mut self, node: &Node) {
        if node.gpus.iter().any(|g| !g.kind.is_empty()) {
            self.seen = true;
            self.devices.insert(node.name.clone(), node.gpus.iter().map(|g| g.kind.clone()).collect());
        } else {
            self.devices.remove(&node.name);
        }
    }

    /// Forget a removed node.
    pub fn remove(&mut self, name: &str) {
        self.devices.remove(name);
    }
}

impl AcceleratorView for Accelerators {
    fn kinds(&self) -> Vec<Kind> {
        self.kinds.clone()
    }

    fn device_kinds(&self, node: &str) -> Option<Vec<String>> {
        self.devices.get(node).cloned()
    }
}

/// Why `node` cannot take `task` for want of devices of its kind: `(reason, unresolvable)`; None
/// when it has enough usable devices of the kind free enough for the request.
pub fn kind_rejection(task: &Task, node: &Node) -> Option<(String, bool)> {
    let request = &task.gpu;
    if request.count == 0 {
        return None;
    }
    let (mut usable, mut fit) = (0u32, 0u32);
    for g in node.gpus.iter().filter(|g| g.kind == request.kind && g.health != GpuHealth::Unhealthy) {
        usable += 1;
        fit += u32::from(request.fits_device(g));
    }
    let kind = display_name(&request.kind);
    if usable < request.count {
        Some((format!("too few {kind} devices"), true))
    } else if fit < request.count {
        Some((format!("{kind} devices busy"), false))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmsched_api::{GpuDevice, GpuRequest};

    fn node(kinds: &[&str], free: u32) -> Node {
        Node {
            name: "n".into(),
            gpus: kinds
                .iter()
                .enumerate()
                .map(|(i, k)| GpuDevice {
                    index: i as u32,
                    kind: k.to_string(),
                    free_milli: free,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn task(kind: &str, count: u32) -> Task {
        Task {
            gpu: GpuRequest { count, milli_per_gpu: 1000, kind: kind.into(), ..Default::default() },
            ..Default::default()
        }
    }

    #[test]
    fn a_task_needs_enough_devices_of_its_own_kind() {
        let amd = node(&["amd"; 8], 1000);
        assert_eq!(kind_rejection(&task("", 1), &amd), Some(("too few nvidia devices".into(), true)));
        assert_eq!(kind_rejection(&task("amd", 8), &amd), None);
        assert_eq!(kind_rejection(&task("amd", 9), &amd).map(|r| r.1), Some(true));
        let mixed = node(&["", "", "amd", "amd"], 1000);
        assert_eq!(kind_rejection(&task("", 2), &mixed), None);
        assert_eq!(kind_rejection(&task("", 3), &mixed), Some(("too few nvidia devices".into(), true)));
        assert_eq!(kind_rejection(&task("amd", 2), &node(&["amd"; 2], 0)), Some(("amd devices busy".into(), false)));
        assert_eq!(kind_rejection(&task("amd", 0), &node(&[], 0)), None, "no devices asked");
    }

    #[test]
    fn only_nodes_with_another_kind_are_recorded() {
        let mut a = Accelerators::default();
        a.set(&node(&["", ""], 1000));
        assert!(!a.checks());
        a.set(&node(&["gaudi"; 2], 1000));
        assert!(a.checks());
        assert_eq!(a.device_kinds("n"), Some(vec!["gaudi".to_string(); 2]));
        a.set(&node(&[""], 1000));
        assert_eq!(a.device_kinds("n"), None, "now NVIDIA only");
        assert!(a.checks(), "the check stays on");
    }
}
