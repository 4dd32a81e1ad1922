//! The data model: plain structs mirroring `wasmsched:policy/types`.

use crate::ResourceName;

/// Milli-GPUs in one whole device.
pub const GPU_MILLI: u32 = 1000;

/// An amount of schedulable resources, in base units.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    /// CPU in milli-cores.
    pub cpu_milli: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// GPU capacity in milli-GPUs (queues and fair share; per-device state is in [`GpuDevice`]).
    pub gpu_milli: u64,
    /// Extended resources, sorted by name, each name at most once.
    pub extended: Extended,
}

/// Extended resources, the first one stored inline: a filter reads a node's free amount of a
/// requested resource from the node's record itself, as it reads the GPU aggregates, rather
/// than through a pointer to a list elsewhere (a cache miss per node scanned; BENCHMARKS.md,
/// "DRA inside `bench`"). Most nodes name one (a DRA class's device count, say), or none.
pub type Extended = smallvec::SmallVec<[(ResourceName, u64); 1]>;

impl Resources {
    /// `self + other`, `None` if any quantity overflows.
    pub fn checked_add(&self, other: &Resources) -> Option<Resources> {
        let mut out = self.clone();
        out.cpu_milli = out.cpu_milli.checked_add(other.cpu_milli)?;
        out.memory_bytes = out.memory_bytes.checked_add(other.memory_bytes)?;
        out.gpu_milli = out.gpu_milli.checked_add(other.gpu_milli)?;
        for (name, v) in &other.extended {
            match out.extended.binary_search_by(|(n, _)| n.as_str().cmp(name.as_str())) {
                Ok(i) => out.extended[i].1 = out.extended[i].1.checked_add(*v)?,
                Err(i) => out.extended.insert(i, (*name, *v)),
            }
        }
        Some(out)
    }

    /// `self += other`, each quantity saturating at `u64::MAX`.
    pub fn saturating_add_assign(&mut self, other: &Resources) {
        self.cpu_milli = self.cpu_milli.saturating_add(other.cpu_milli);
        self.memory_bytes = self.memory_bytes.saturating_add(other.memory_bytes);
        self.gpu_milli = self.gpu_milli.saturating_add(other.gpu_milli);
        for (name, v) in &other.extended {
            match self.extended.binary_search_by(|(n, _)| n.as_str().cmp(name.as_str())) {
                Ok(i) => self.extended[i].1 = self.extended[i].1.saturating_add(*v),
                Err(i) => self.extended.insert(i, (*name, *v)),
            }
        }
    }

    /// `self - other`, each quantity saturating at zero.
    pub fn saturating_sub(&self, other: &Resources) -> Resources {
        let mut out = self.clone();
        out.cpu_milli = out.cpu_milli.saturating_sub(other.cpu_milli);
        out.memory_bytes = out.memory_bytes.saturating_sub(other.memory_bytes);
        out.gpu_milli = out.gpu_milli.saturating_sub(other.gpu_milli);
        for (name, v) in &mut out.extended {
            *v = v.saturating_sub(other.extended(name));
        }
        out
    }

    /// The quantity of an extended resource, 0 when absent.
    #[inline(always)]
    pub fn extended(&self, name: &str) -> u64 {
        // Filters ask this per node with the task's name, interned like the node's
        // ([`ResourceName`]), and a node's first extended resource is most often the one asked
        // (a DRA class, the device plugin's GPUs): that one is found by address in the filter's
        // own loop, the rest out of line. Out of line with the text comparison, it cost a filter
        // of DRA-counted pods ~7 ns a node, a quarter of its time; as a loop inside a Wasm
        // filter, Cranelift spilled its locals (`wasmsched bench --dra`).
        match self.extended.first() {
            None => 0,
            Some((n, v)) if n.as_str().as_ptr() == name.as_ptr() && n.len() == name.len() => *v,
            Some(_) => self.extended_by_text(name),
        }
    }

    #[inline(never)]
    fn extended_by_text(&self, name: &str) -> u64 {
        // A node has a handful of extended resources: a scan with a word-wise comparison. Filters
        // ask this per node, and inside a Wasm plugin a byte-wise `memcmp` of names like
        // `deviceclass.resource.kubernetes.io/gpu.nvidia.com` cost more than the rest of the check.
        if self.extended.len() <= 8 {
            return self.extended.iter().find(|(n, _)| same_name(n, name)).map_or(0, |(_, v)| *v);
        }
        self.extended.binary_search_by(|(n, _)| n.as_str().cmp(name)).map_or(0, |i| self.extended[i].1)
    }
}

/// `a == b`: the same address (interned names, [`ResourceName`]) or the same bytes, compared
/// eight at a time.
#[inline]
pub fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    if a.as_ptr() == b.as_ptr() {
        return true;
    }
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
    if a.len() < 8 {
        return a == b;
    }
    // Whole words, then the last eight bytes (overlapping the last word): no call for the tail.
    let words = a.len() / 8 * 8;
    let tail = a.len() - 8;
    a[..words].chunks_exact(8).zip(b[..words].chunks_exact(8)).all(|(x, y)| word(x) == word(y))
        && word(&a[tail..]) == word(&b[tail..])
}

/// Health of a GPU device as reported by the node agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GpuHealth {
    /// Usable.
    #[default]
    Healthy,
    /// Usable but reported problems (e.g. correctable errors); policies may avoid it.
    Degraded,
    /// Must not receive new work.
    Unhealthy,
}

/// One GPU device on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuDevice {
    /// Index of the device on its node.
    pub index: u32,
    /// Model name.
    pub model: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// Unallocated share in milli-GPUs ([`GPU_MILLI`] = entirely free).
    pub free_milli: u32,
    /// Unallocated device memory in bytes.
    pub free_memory_bytes: u64,
    /// Health.
    pub health: GpuHealth,
    /// NUMA node, if known.
    pub numa_node: Option<u32>,
    /// Accelerator kind ([`crate::accelerators`]): empty for NVIDIA GPUs, else the kind's name
    /// (`amd`, `gaudi`, …). A request is only ever given devices of its own kind.
    pub kind: crate::accelerators::KindName,
}

impl GpuDevice {
    /// Healthy and entirely free.
    pub fn is_idle(&self) -> bool {
        self.health != GpuHealth::Unhealthy && self.free_milli == GPU_MILLI
    }
}

/// A node's GPU devices, with aggregates kept in step with them.
///
/// Filters and scores ask the same questions of every node — how many devices are usable, how
/// many entirely free, how much share is left — and walking the devices for each node was the
/// largest cost of a placement, several times more so in a component than natively. The answers
/// are kept here instead ([`Gpus::summary`]), and are trustworthy because the devices can be read
/// freely (`Gpus` dereferences to a slice) but changed only through [`Gpus::update`] and
/// [`Gpus::set_free`], which recompute them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Gpus {
    devices: Vec<GpuDevice>,
    summary: GpuSummary,
}

/// Aggregates over a node's devices ([`Gpus::summary`]). "Usable" means not
/// [`GpuHealth::Unhealthy`], as in [`GpuDevice::is_idle`] and [`GpuRequest::fits_device`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuSummary {
    /// Usable devices.
    pub usable: u32,
    /// Usable devices with at least a whole device's share ([`GPU_MILLI`]) free.
    pub whole_free: u32,
    /// Free share summed over usable devices, in milli-GPUs.
    pub free_milli: u64,
    /// The largest free share of one usable device (0 when none).
    pub max_free_milli: u32,
    /// Devices of more than one accelerator kind (rare: the host then checks kinds device by
    /// device, [`crate::accelerators`]).
    pub mixed_kinds: bool,
}

impl GpuSummary {
    fn of(devices: &[GpuDevice]) -> GpuSummary {
        let mut s = GpuSummary::default();
        let kind = devices.first().map(|g| g.kind).unwrap_or_default();
        // One pass: recomputed on every bind and release.
        for g in devices {
            s.mixed_kinds |= g.kind != kind;
            if g.health == GpuHealth::Unhealthy {
                continue;
            }
            s.usable += 1;
            s.whole_free += u32::from(g.free_milli >= GPU_MILLI);
            s.free_milli += u64::from(g.free_milli);
            s.max_free_milli = s.max_free_milli.max(g.free_milli);
        }
        s
    }
}

impl Gpus {
    /// The aggregates of the devices as they are now.
    #[inline]
    pub fn summary(&self) -> &GpuSummary {
        &self.summary
    }

    /// Change the devices (any way at all); the aggregates are recomputed afterwards.
    pub fn update<R>(&mut self, f: impl FnOnce(&mut Vec<GpuDevice>) -> R) -> R {
        let out = f(&mut self.devices);
        self.summary = GpuSummary::of(&self.devices);
        out
    }

    /// Set device `i`'s free share and memory (what binding and releasing change); `false` when
    /// there is no device `i`.
    pub fn set_free(&mut self, i: usize, free_milli: u32, free_memory_bytes: u64) -> bool {
        self.update(|d| match d.get_mut(i) {
            Some(g) => {
                (g.free_milli, g.free_memory_bytes) = (free_milli, free_memory_bytes);
                true
            }
            None => false,
        })
    }

    /// The devices, by value.
    pub fn into_vec(self) -> Vec<GpuDevice> {
        self.devices
    }
}

impl From<Vec<GpuDevice>> for Gpus {
    fn from(devices: Vec<GpuDevice>) -> Self {
        let summary = GpuSummary::of(&devices);
        Gpus { devices, summary }
    }
}

impl FromIterator<GpuDevice> for Gpus {
    fn from_iter<I: IntoIterator<Item = GpuDevice>>(iter: I) -> Self {
        Gpus::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl std::ops::Deref for Gpus {
    type Target = [GpuDevice];

    #[inline]
    fn deref(&self) -> &[GpuDevice] {
        &self.devices
    }
}

impl<'a> IntoIterator for &'a Gpus {
    type Item = &'a GpuDevice;
    type IntoIter = std::slice::Iter<'a, GpuDevice>;

    fn into_iter(self) -> Self::IntoIter {
        self.devices.iter()
    }
}

/// Taint effects, as in Kubernetes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TaintEffect {
    /// New tasks without a matching toleration are not placed.
    #[default]
    NoSchedule,
    /// A soft version of `NoSchedule`: scores may avoid the node.
    PreferNoSchedule,
    /// Like `NoSchedule`, and running tasks are evicted (by the host, not by policies).
    NoExecute,
}

/// A node taint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Taint {
    /// Key.
    pub key: String,
    /// Value (may be empty).
    pub value: String,
    /// Effect.
    pub effect: TaintEffect,
}

/// A node as policies see it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Node {
    /// Unique name.
    pub name: String,
    /// Labels, sorted by key.
    pub labels: Vec<(String, String)>,
    /// Taints.
    pub taints: Vec<Taint>,
    /// What the node offers in total.
    pub allocatable: Resources,
    /// What bound and reserved tasks request.
    pub allocated: Resources,
    /// GPU devices, by index, with their aggregates.
    pub gpus: Gpus,
    /// Cordoned.
    pub unschedulable: bool,
}

impl Node {
    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Unallocated CPU in milli-cores (0 when over-committed).
    #[inline]
    pub fn free_cpu_milli(&self) -> u64 {
        self.allocatable.cpu_milli.saturating_sub(self.allocated.cpu_milli)
    }

    /// Unallocated memory in bytes (0 when over-committed).
    #[inline]
    pub fn free_memory_bytes(&self) -> u64 {
        self.allocatable.memory_bytes.saturating_sub(self.allocated.memory_bytes)
    }

    /// Total unallocated GPU share over healthy devices, in milli-GPUs.
    #[inline]
    pub fn free_gpu_milli(&self) -> u64 {
        self.gpus.summary().free_milli
    }
}

/// Toleration operators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TolerationOperator {
    /// Key and value must match.
    #[default]
    Equal,
    /// Key must match (an empty key matches every taint).
    Exists,
}

/// A toleration of taints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Toleration {
    /// Key; empty with [`TolerationOperator::Exists`] tolerates everything.
    pub key: String,
    /// Operator.
    pub operator: TolerationOperator,
    /// Value for [`TolerationOperator::Equal`].
    pub value: String,
    /// Effect; `None` tolerates every effect.
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    /// Whether this toleration tolerates `taint` (Kubernetes semantics).
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != taint.effect) {
            return false;
        }
        match self.operator {
            TolerationOperator::Exists => self.key.is_empty() || self.key == taint.key,
            TolerationOperator::Equal => self.key == taint.key && self.value == taint.value,
        }
    }
}

/// Quality-of-service class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Qos {
    /// Requests equal limits.
    Guaranteed,
    /// Requests below limits.
    #[default]
    Burstable,
    /// No requests.
    BestEffort,
}

/// What a task asks of GPUs: `count` whole devices (`milli_per_gpu` = [`GPU_MILLI`]) or one shared
/// device (`count` = 1, `milli_per_gpu` < [`GPU_MILLI`]). `count` = 0 asks for none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuRequest {
    /// Number of devices.
    pub count: u32,
    /// Share of each device in milli-GPUs.
    pub milli_per_gpu: u32,
    /// Device memory needed on each device (0 = no constraint).
    pub memory_bytes_per_gpu: u64,
    /// Allowed models; empty allows any.
    pub models: Vec<String>,
    /// Accelerator kind of the devices ([`crate::accelerators`]): empty for NVIDIA GPUs.
    pub kind: crate::accelerators::KindName,
}

impl GpuRequest {
    /// Total milli-GPUs requested.
    #[inline]
    pub fn total_milli(&self) -> u64 {
        u64::from(self.count) * u64::from(self.milli_per_gpu)
    }

    /// What it counts in a `Resources::gpu_milli` (quotas, fair share): [`GpuRequest::total_milli`]
    /// for NVIDIA's kind, 0 for another kind, which counts as its own extended resource instead
    /// ([`crate::accelerators`]).
    #[inline]
    pub fn counted_milli(&self) -> u64 {
        if self.kind.is_empty() { self.total_milli() } else { 0 }
    }

    /// Whether `model` is allowed.
    #[inline]
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }

    /// Whether `gpu` could host one share of this request (kind, model, health, share and memory).
    #[inline]
    pub fn fits_device(&self, gpu: &GpuDevice) -> bool {
        gpu.kind == self.kind
            && gpu.health != GpuHealth::Unhealthy
            && gpu.free_milli >= self.milli_per_gpu
            && gpu.free_memory_bytes >= self.memory_bytes_per_gpu
            && self.allows_model(&gpu.model)
    }
}

/// One schedulable unit: a pod, or a member of a gang.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Task {
    /// Unique id.
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// Pod group, if any.
    pub group: Option<String>,
    /// Queue.
    pub queue: String,
    /// Priority (higher is more important).
    pub priority: i32,
    /// QoS class.
    pub qos: Qos,
    /// CPU, memory and extended resources (GPUs are in [`Task::gpu`]).
    pub request: Resources,
    /// GPU request.
    pub gpu: GpuRequest,
    /// Required node labels.
    pub node_selector: Vec<(String, String)>,
    /// Required and preferred node affinity.
    pub node_affinity: crate::NodeAffinity,
    /// Tolerations.
    pub tolerations: Vec<Toleration>,
    /// Pod labels (what other pods' affinity terms select). Host-only, like `pod_affinity`.
    pub labels: Vec<(String, String)>,
    /// Inter-pod (anti-)affinity, `None` for none (most pods: boxed, so a task without it stays
    /// small). Host-only: not in the policy contract, which plugins see resolved into
    /// `node_affinity` (see [`crate::PodAffinity`]). Read it with [`Task::pod_terms`].
    pub pod_affinity: Option<Box<crate::PodAffinity>>,
}

static NO_POD_TERMS: crate::PodAffinity = crate::PodAffinity::NONE;

impl Task {
    /// Its inter-pod (anti-)affinity, empty when it has none.
    pub fn pod_terms(&self) -> &crate::PodAffinity {
        self.pod_affinity.as_deref().unwrap_or(&NO_POD_TERMS)
    }
}

/// Why a node cannot take a task.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rejection {
    /// Human-readable reason, aggregated across nodes in explanations.
    pub reason: String,
    /// Preemption cannot help (e.g. a selector mismatch).
    pub unresolvable: bool,
}

/// The stages a plugin may implement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Which nodes can run a task.
    Filter,
    /// Rank feasible nodes.
    Score,
    /// Choose victims for a task that does not fit.
    Preempt,
    /// Deserved shares and queue order.
    FairShare,
    /// Choose GPUs on the chosen node.
    SelectDevices,
}

impl Stage {
    /// Every stage, in pipeline order.
    pub const ALL: [Stage; 5] = [Stage::Filter, Stage::Score, Stage::SelectDevices, Stage::Preempt, Stage::FairShare];

    /// The stage's name as in the WIT contract.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Filter => "filter",
            Stage::Score => "score",
            Stage::Preempt => "preempt",
            Stage::FairShare => "fair-share",
            Stage::SelectDevices => "select-devices",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A share of one GPU given to a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceShare {
    /// [`GpuDevice::index`].
    pub gpu: u32,
    /// Milli-GPUs taken.
    pub milli: u32,
}

/// A running task that may be preempted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Victim {
    /// The task.
    pub task: Task,
    /// Seconds since it started.
    pub running_seconds: u64,
    /// Members of its group running now.
    pub group_running: u32,
    /// Its group's min-member (1 for a lone task).
    pub group_min_member: u32,
    /// It can save a checkpoint when asked.
    pub checkpointable: bool,
}

/// A node where preemption could make room, with the victims the host allows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PreemptCandidate {
    /// Mirror slot of the node.
    pub node: u32,
    /// Preemptible tasks on it, lowest priority first.
    pub victims: Vec<Victim>,
}

/// A preemption plan.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Preemption {
    /// Index into the candidate list.
    pub candidate: u32,
    /// Indexes into that candidate's victims.
    pub victims: Vec<u32>,
}

/// A queue as fair-share policies see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueState {
    /// Name.
    pub name: String,
    /// Index of the parent in the list; `None` for a root.
    pub parent: Option<u32>,
    /// Weight among siblings.
    pub weight: u32,
    /// Always deserved, never reclaimed.
    pub guarantee: Resources,
    /// Upper bound, `None` for unbounded. It bounds only the extended resources it names: one
    /// it does not name is unbounded (as in the host's quota checks).
    pub capability: Option<Resources>,
    /// Allocated now.
    pub allocated: Resources,
    /// Allocated plus pending.
    pub request: Resources,
    /// Past usage in GPU-milli-seconds, decayed by the host's half-life.
    pub decayed_usage: f64,
    /// Others may reclaim what it borrowed.
    pub reclaimable: bool,
}

/// The result of a fair-share computation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShareDecision {
    /// Deserved share per queue, in input order.
    pub deserved: Vec<Resources>,
    /// Queue indexes in serving order.
    pub order: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_aggregates_follow_every_way_devices_change() {
        let device = |index, free_milli, health| GpuDevice { index, free_milli, health, ..Default::default() };
        let fresh = |d: &[GpuDevice]| GpuSummary::of(d);
        let mut gpus: Gpus = vec![
            device(0, GPU_MILLI, GpuHealth::Healthy),
            device(1, 300, GpuHealth::Degraded),
            device(2, GPU_MILLI, GpuHealth::Unhealthy),
        ]
        .into();
        assert_eq!(
            *gpus.summary(),
            GpuSummary { usable: 2, whole_free: 1, free_milli: 1300, max_free_milli: 1000, mixed_kinds: false }
        );
        assert!(gpus.set_free(0, 250, 0));
        assert_eq!(
            *gpus.summary(),
            GpuSummary { usable: 2, whole_free: 0, free_milli: 550, max_free_milli: 300, mixed_kinds: false }
        );
        assert!(!gpus.set_free(7, 0, 0), "no such device");
        gpus.update(|d| d[2].health = GpuHealth::Healthy);
        assert_eq!(gpus.summary().whole_free, 1);
        gpus.update(|d| d.truncate(1));
        assert_eq!(*gpus.summary(), fresh(&gpus));
        let collected: Gpus = (0..4).map(|i| device(i, 100 * i, GpuHealth::Healthy)).collect();
        assert_eq!(
            *collected.summary(),
            GpuSummary { usable: 4, whole_free: 0, free_milli: 600, max_free_milli: 300, mixed_kinds: false }
        );
        assert_eq!(*Gpus::default().summary(), GpuSummary::default());
        let node = Node { gpus: collected, ..Default::default() };
        assert_eq!(node.free_gpu_milli(), 600);
        assert_eq!(node.gpus.len(), 4, "reads go to the devices");
        assert_eq!(node.gpus.clone().into_vec().len(), 4);
    }

    #[test]
    fn names_compare_equal_exactly_when_every_byte_does() {
        let base = "deviceclass.resource.kubernetes.io/gpu.nvidia.com";
        assert!(same_name(base, base));
        for i in 0..base.len() {
            let mut other = base.as_bytes().to_vec();
            other[i] ^= 1;
            assert!(!same_name(base, std::str::from_utf8(&other).unwrap_or("x")), "byte {i}");
        }
        assert!(!same_name(base, &base[1..]) && same_name("", "") && !same_name("a", ""));
        // Every length around the word size, compared with a copy (another address).
        for len in 1..=20 {
            let name = &base[..len];
            let copy: String = name.chars().collect();
            assert!(same_name(name, &copy), "{len}");
            for i in 0..len {
                let mut other = name.as_bytes().to_vec();
                other[i] ^= 1;
                assert!(!same_name(name, std::str::from_utf8(&other).unwrap_or("x")), "length {len}, byte {i}");
            }
        }
        let r = Resources { extended: vec![("a".into(), 1), (base.into(), 8)].into(), ..Default::default() };
        assert_eq!((r.extended(base), r.extended("a"), r.extended("b")), (8, 1, 0));
        // As filters ask (the interned name, found by address) wherever it stands, and by text
        // past the eight a scan covers (the list then sorted, as `Extended` keeps it).
        let names: Vec<crate::ResourceName> =
            (0..12).map(|i| crate::ResourceName::new(&format!("example.com/r{i:02}"))).collect();
        for count in [1, 2, 8, 12] {
            let r = Resources {
                extended: names[..count].iter().enumerate().map(|(i, n)| (*n, i as u64 + 1)).collect(),
                ..Default::default()
            };
            for (i, n) in names[..count].iter().enumerate() {
                let text: String = n.as_str().chars().collect();
                assert_eq!((r.extended(n.as_str()), r.extended(&text)), (i as u64 + 1, i as u64 + 1), "{count}: {n}");
            }
            assert_eq!(r.extended(names[11].as_str()), if count == 12 { 12 } else { 0 });
        }
    }

    #[test]
    fn resource_addition_merges_extended_and_handles_overflow() {
        let a = Resources { cpu_milli: 1, extended: vec![("b".into(), 2)].into(), ..Default::default() };
        let b =
            Resources { cpu_milli: 2, extended: vec![("a".into(), 1), ("b".into(), 3)].into(), ..Default::default() };
        assert_eq!(
            b.saturating_sub(&a),
            Resources { cpu_milli: 1, extended: vec![("a".into(), 1), ("b".into(), 1)].into(), ..Default::default() }
        );
        assert_eq!(a.saturating_sub(&b), Resources { extended: vec![("b".into(), 0)].into(), ..Default::default() });
        let sum = a.checked_add(&b).unwrap();
        assert_eq!((sum.cpu_milli, sum.extended("a"), sum.extended("b")), (3, 1, 5));
        let max = Resources { gpu_milli: u64::MAX, ..Default::default() };
        assert_eq!(max.checked_add(&max), None);
        let mut s = max.clone();
        s.saturating_add_assign(&b);
        assert_eq!((s.gpu_milli, s.cpu_milli, s.extended("b")), (u64::MAX, 2, 3));
    }
}
