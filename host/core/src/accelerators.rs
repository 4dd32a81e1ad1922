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
use wasmsched_api::accelerators::{AcceleratorView, Kind, KindName, display_name};
use wasmsched_api::{GpuHealth, Node, Task};

/// The kinds the host knows and the kinds of the devices of nodes that have any but NVIDIA's.
#[derive(Clone, Debug, Default)]
pub struct Accelerators {
    kinds: Vec<Kind>,
    /// Per node with a device of another kind than NVIDIA's, each device's stored kind.
    devices: AHashMap<String, Vec<KindName>>,
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
            self.devices.insert(node.name.clone(), node.gpus.iter().map(|g| g.kind).collect());
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
        self.devices.get(node).map(|kinds| kinds.iter().map(|k| k.to_string()).collect())
    }
}

/// Why a node cannot take a task for want of devices of its kind ([`kind_rejection`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindRejection {
    /// Fewer usable devices of the kind than asked: no eviction can help.
    TooFew,
    /// Enough of them, but not free enough (on a node of two kinds): preemption may help.
    Busy,
}

impl KindRejection {
    /// The reason shown for it, for a task asking `kind`.
    pub fn reason(self, kind: &str) -> String {
        let kind = display_name(kind);
        match self {
            KindRejection::TooFew => format!("too few {kind} devices"),
            KindRejection::Busy => format!("{kind} devices busy"),
        }
    }

    /// Whether preemption cannot help.
    pub fn unresolvable(self) -> bool {
        self == KindRejection::TooFew
    }
}

/// Why `node` cannot take `task` for want of devices of its kind; None when it can, as far as
/// kinds go. On a node of one kind (nearly all) this reads the node's summary alone: the wrong
/// kind, or fewer usable devices than asked; whether they are free is then the policies' to judge,
/// as on a cluster of one vendor. On a node of several kinds every device is looked at, and busy
/// devices of the kind are a rejection too (a policy counting the node's devices would count the
/// other kind's).
pub fn kind_rejection(task: &Task, node: &Node) -> Option<KindRejection> {
    let request = &task.gpu;
    if request.count == 0 {
        return None;
    }
    let summary = node.gpus.summary();
    if !summary.mixed_kinds {
        let same = node.gpus.first().is_some_and(|g| g.kind == request.kind);
        return (!same || summary.usable < request.count).then_some(KindRejection::TooFew);
    }
    let (mut usable, mut fit) = (0u32, 0u32);
    for g in node.gpus.iter().filter(|g| g.kind == request.kind && g.health != GpuHealth::Unhealthy) {
        usable += 1;
        fit += u32::from(request.fits_device(g));
    }
    if usable < request.count {
        Some(KindRejection::TooFew)
    } else if fit < request.count {
        Some(KindRejection::Busy)
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
                .map(|(i, k)| GpuDevice { index: i as u32, kind: (*k).into(), free_milli: free, ..Default::default() })
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
        use KindRejection::{Busy, TooFew};
        let amd = node(&["amd"; 8], 1000);
        assert_eq!(kind_rejection(&task("", 1), &amd), Some(TooFew));
        assert_eq!(TooFew.reason(""), "too few nvidia devices");
        assert_eq!(kind_rejection(&task("amd", 8), &amd), None);
        assert_eq!(kind_rejection(&task("amd", 9), &amd), Some(TooFew));
        assert_eq!(kind_rejection(&task("amd", 2), &node(&["amd"; 2], 0)), None, "one kind: busy is the policies'");
        assert_eq!(kind_rejection(&task("", 1), &node(&[], 0)), Some(TooFew), "no devices at all");
        let mixed = node(&["", "", "amd", "amd"], 1000);
        assert_eq!(kind_rejection(&task("", 2), &mixed), None);
        assert_eq!(kind_rejection(&task("", 3), &mixed), Some(TooFew));
        let mut busy = node(&["", "amd", "amd"], 1000);
        busy.gpus.set_free(1, 0, 0);
        assert_eq!(kind_rejection(&task("amd", 2), &busy), Some(Busy), "two kinds: the kind's own devices judged");
        assert_eq!((Busy.reason("amd"), Busy.unresolvable()), ("amd devices busy".to_string(), false));
        assert_eq!(kind_rejection(&task("amd", 0), &node(&[], 0)), None, "no devices asked");
    }

    #[test]
    fn the_table_s_brief_per_slot_answers_as_the_node_does_through_changes() {
        let mut t = crate::NodeTable::new();
        let named = |name: &str, kinds: &[&str]| Node { name: name.into(), ..node(kinds, 1000) };
        let a = t.upsert(named("amd", &["amd"; 4]));
        let n = t.upsert(named("nv", &["", ""]));
        let m = t.upsert(named("mixed", &["", "amd", "amd"]));
        let e = t.upsert(named("cpu", &[]));
        let check = |t: &crate::NodeTable| {
            for slot in [a, n, m, e] {
                for (kind, count) in [("", 1), ("", 2), ("", 3), ("amd", 2), ("amd", 4), ("amd", 5)] {
                    let want = kind_rejection(&task(kind, count), t.get(slot).unwrap());
                    assert_eq!(t.kind_rejection(slot, &task(kind, count)), want, "slot {slot}, {kind} × {count}");
                }
            }
        };
        check(&t);
        // A device gone unhealthy (an `update`, as the agent's facts are applied) counts at once.
        t.update(a, |node| node.gpus.update(|g| g[0].health = GpuHealth::Unhealthy));
        assert_eq!(t.kind_rejection(a, &task("amd", 4)), Some(KindRejection::TooFew));
        check(&t);
        // A node replaced by one of the other kind, and a removed node's slot reused.
        t.upsert(named("amd", &["", "", "", ""]));
        check(&t);
        t.remove("nv");
        let reused = t.upsert(named("new", &["amd"; 8]));
        assert_eq!(reused, n);
        check(&t);
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
