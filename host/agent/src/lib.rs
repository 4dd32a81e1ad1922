//! The node agent's logic: what a node looks like ([`Discovery`]), what the agent writes on it
//! ([`NodeReport`]), and the state machine that publishes changes and health ([`Agent`]).
//!
//! The binary (`wasmsched-agent`) wires it to NVML or `nvidia-smi` text, a timer, the XID watcher
//! and an event sink, and writes the report on the node's Kubernetes Node object
//! ([`node_object`], `--patch-node`) or as JSON files (`--write DIR`). With `--device-plugin` it
//! also serves the GPUs to the kubelet ([`device_plugin`]) and gives each pod's containers exactly
//! the GPUs the scheduler chose for it ([`decisions`]), running the MPS control daemons that hold
//! share pods to their shares ([`mps`]).

pub mod decisions;
pub mod device_plugin;
pub mod metrics;
pub mod mps;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use wasmsched_events::EventSink;
use wasmsched_events::schema::{GpuHealth, NodeGpuHealthChanged, NodeInventoryChanged, Payload};
use wasmsched_nvml::{Health, Session, XidEvent};
use wasmsched_topology::NodeTopology;
use wasmsched_topology::annotation::{self, TOPOLOGY_ANNOTATION};

pub use wasmsched_topology::annotation::{DEGRADED_ANNOTATION, OUT_OF_SERVICE_ANNOTATION, UNHEALTHY_ANNOTATION};

/// What discovering a node or writing its report can fail with.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// NVML could not be opened or asked.
    #[error(transparent)]
    Nvml(#[from] wasmsched_nvml::Error),
    /// A file could not be read or written.
    #[error("{what} {path}: {source}")]
    File {
        /// What was being done (`reading`, `writing`, …).
        what: &'static str,
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A topology tool's text (`nvidia-smi topo -m`, `amd-smi topology`) could not be parsed.
    #[error("parsing {path}: {source}")]
    Smi {
        /// The file.
        path: String,
        /// Why.
        source: wasmsched_topology::Error,
    },
    /// An annotation on the Node object (an operator's) does not parse.
    #[error("node {node}: {source}")]
    Annotation {
        /// The node.
        node: String,
        /// Why, naming the annotation.
        source: wasmsched_topology::Error,
    },
    /// The Node object could not be read or patched.
    #[error("{what} node {node}: {source}")]
    Kube {
        /// `reading` or `patching`.
        what: &'static str,
        /// The node.
        node: String,
        /// Why.
        source: kube::Error,
    },
}

fn file_error(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> AgentError {
    let path = path.display().to_string();
    move |source| AgentError::File { what, path, source }
}

/// Where the node's GPUs come from.
pub enum Source {
    /// NVML (the real thing).
    Nvml,
    /// `nvidia-smi topo -m` output in a file (hosts without NVML access, tests, replays).
    Smi(std::path::PathBuf),
    /// Another vendor's devices: a saved output of its topology tool.
    VendorText(VendorTool, std::path::PathBuf),
    /// Another vendor's devices: this program (its topology tool) asked on every discovery.
    VendorProgram(VendorTool, std::path::PathBuf),
    /// An NVML inventory recorded earlier (`wasmsched-agent discover --inventory`): stand-in
    /// devices for nodes without GPUs (tests, a kubelet on a machine without a GPU).
    Recorded(std::path::PathBuf),
}

/// Other vendors' topology tools the agent reads. Their SMI libraries have no maintained Rust
/// binding; their commands print the same, and their outputs are what the tests record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VendorTool {
    /// AMD: `amd-smi topology` (or a saved `rocm-smi --showtopo`).
    AmdSmi,
    /// AWS Inferentia and Trainium: `neuron-ls`.
    NeuronLs,
    /// Huawei Ascend: `npu-smi info -t topo`.
    NpuSmi,
}

impl VendorTool {
    /// The arguments the program is run with.
    fn args(self) -> &'static [&'static str] {
        match self {
            VendorTool::AmdSmi => &["topology"],
            VendorTool::NeuronLs => &[],
            VendorTool::NpuSmi => &["info", "-t", "topo"],
        }
    }

    fn parse(self, text: &str) -> Result<NodeTopology, wasmsched_topology::Error> {
        match self {
            VendorTool::AmdSmi => wasmsched_topology::amd_smi::parse(text),
            VendorTool::NeuronLs => wasmsched_topology::neuron_ls::parse(text),
            VendorTool::NpuSmi => wasmsched_topology::smi::parse_npu_smi(text),
        }
    }
}

/// One discovery: the topology and the driver that reported it.
pub struct Discovery {
    /// The topology.
    pub topology: NodeTopology,
    /// Driver version (empty for `nvidia-smi` text).
    pub driver: String,
    /// The raw NVML inventory, when NVML was the source.
    pub inventory: Option<wasmsched_nvml::Inventory>,
}

impl Source {
    /// Discovers the node now.
    pub fn discover(&self) -> Result<Discovery, AgentError> {
        match self {
            Source::Nvml => {
                let session = Session::open()?;
                let inventory = session.inventory()?;
                let topology = inventory.topology()?;
                Ok(Discovery { topology, driver: inventory.driver.clone(), inventory: Some(inventory) })
            }
            Source::Recorded(path) => {
                let text = std::fs::read_to_string(path).map_err(file_error("reading", path))?;
                let inventory: wasmsched_nvml::Inventory =
                    serde_json::from_str(&text).map_err(|e| AgentError::File {
                        what: "parsing",
                        path: path.display().to_string(),
                        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                    })?;
                let topology = inventory.topology()?;
                Ok(Discovery { topology, driver: inventory.driver.clone(), inventory: Some(inventory) })
            }
            Source::VendorText(tool, path) => {
                let text = std::fs::read_to_string(path).map_err(file_error("reading", path))?;
                let topology =
                    tool.parse(&text).map_err(|source| AgentError::Smi { path: path.display().to_string(), source })?;
                Ok(Discovery { topology, driver: String::new(), inventory: None })
            }
            Source::VendorProgram(tool, program) => {
                let shown =
                    [program.display().to_string()].into_iter().chain(tool.args().iter().map(|a| a.to_string()));
                let shown = shown.collect::<Vec<_>>().join(" ");
                let out = std::process::Command::new(program)
                    .args(tool.args())
                    .output()
                    .map_err(|source| AgentError::File { what: "running", path: shown.clone(), source })?;
                if !out.status.success() {
                    let message = format!("{} {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
                    return Err(AgentError::File {
                        what: "running",
                        path: shown,
                        source: std::io::Error::other(message),
                    });
                }
                let text = String::from_utf8_lossy(&out.stdout);
                let topology = tool.parse(&text).map_err(|source| AgentError::Smi { path: shown, source })?;
                Ok(Discovery { topology, driver: String::new(), inventory: None })
            }
            Source::Smi(path) => {
                let text = std::fs::read_to_string(path).map_err(file_error("reading", path))?;
                let topology = wasmsched_topology::smi::parse(&text)
                    .map_err(|source| AgentError::Smi { path: path.display().to_string(), source })?;
                Ok(Discovery { topology, driver: String::new(), inventory: None })
            }
        }
    }
}

impl Discovery {
    /// The GPUs as the device plugin serves them, those in `unhealthy` reported so.
    pub fn gpu_devices(&self, unhealthy: &BTreeSet<u32>) -> Vec<device_plugin::GpuDevice> {
        match &self.inventory {
            Some(inventory) => inventory
                .devices
                .iter()
                .map(|d| device_plugin::GpuDevice {
                    index: d.index,
                    id: d.uuid.clone(),
                    numa: d.numa,
                    memory_mib: Some(d.memory_bytes / (1 << 20)),
                    healthy: !unhealthy.contains(&d.index),
                })
                .collect(),
            None => self
                .topology
                .gpus()
                .iter()
                .map(|g| device_plugin::GpuDevice {
                    index: g.index,
                    id: g.uuid.clone().unwrap_or_else(|| format!("gpu-{}", g.index)),
                    numa: g.numa,
                    memory_mib: None,
                    healthy: !unhealthy.contains(&g.index),
                })
                .collect(),
        }
    }
}

/// What the agent writes on its Node: annotations and labels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeReport {
    /// Annotations (the topology JSON, unhealthy and degraded GPUs).
    pub annotations: BTreeMap<String, String>,
    /// Capability labels.
    pub labels: BTreeMap<String, String>,
}

impl NodeReport {
    /// Writes `annotations.json` and `labels.json` into `dir` (atomically: write then rename).
    pub fn write(&self, dir: &Path) -> Result<(), AgentError> {
        std::fs::create_dir_all(dir).map_err(file_error("creating", dir))?;
        for (name, map) in [("annotations.json", &self.annotations), ("labels.json", &self.labels)] {
            let path = dir.join(name);
            let tmp = dir.join(format!(".{name}.tmp"));
            let json = serde_json::to_vec_pretty(map).expect("a map of strings is JSON");
            std::fs::write(&tmp, json).map_err(file_error("writing", &tmp))?;
            std::fs::rename(&tmp, &path).map_err(file_error("renaming to", &path))?;
        }
        Ok(())
    }
}

/// The agent's state: the last report it published and the health it knows.
pub struct Agent {
    node: String,
    sink: Option<EventSink>,
    topology: Option<NodeTopology>,
    driver: String,
    health: BTreeMap<u32, Health>,
    /// GPUs an operator took out of service ([`OUT_OF_SERVICE_ANNOTATION`]).
    out_of_service: BTreeSet<u32>,
    published: Option<NodeReport>,
}

impl Agent {
    /// An agent for `node`, publishing to `sink` (None: no events).
    pub fn new(node: impl Into<String>, sink: Option<EventSink>) -> Agent {
        Agent {
            node: node.into(),
            sink,
            topology: None,
            driver: String::new(),
            health: BTreeMap::new(),
            out_of_service: BTreeSet::new(),
            published: None,
        }
    }

    /// The report for the current topology and health.
    pub fn report(&self) -> NodeReport {
        let Some(topology) = &self.topology else { return NodeReport::default() };
        let mut report = NodeReport { annotations: BTreeMap::new(), labels: annotation::labels(topology) };
        report.annotations.insert(TOPOLOGY_ANNOTATION.into(), annotation::to_annotation(topology));
        let unhealthy = self.unhealthy();
        let degraded = self.health.iter().filter(|(g, h)| **h == Health::Degraded && !unhealthy.contains(g));
        let degraded: BTreeSet<u32> = degraded.map(|(g, _)| *g).collect();
        for (key, gpus) in [(UNHEALTHY_ANNOTATION, unhealthy), (DEGRADED_ANNOTATION, degraded)] {
            if !gpus.is_empty() {
                let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
                report.annotations.insert(key.into(), list.join(","));
            }
        }
        report
    }

    /// Takes the GPUs an operator has out of service now (the node's
    /// [`OUT_OF_SERVICE_ANNOTATION`]): they are unhealthy while listed, and back as the XIDs left
    /// them once not. Publishes `node-gpu-health-changed` for each GPU that changed, and the
    /// changed report.
    pub fn set_out_of_service(&mut self, gpus: BTreeSet<u32>) -> Option<NodeReport> {
        if gpus == self.out_of_service {
            return None;
        }
        let xid = |g: &u32| self.health.get(g).copied().unwrap_or(Health::Healthy);
        let changes: Vec<(u32, Health, Health, &str)> = self
            .out_of_service
            .symmetric_difference(&gpus)
            .filter_map(|g| {
                let (from, to, why) = if gpus.contains(g) {
                    (xid(g), Health::Unhealthy, "taken out of service by an operator (wasmsched.io/gpu-out-of-service)")
                } else {
                    (Health::Unhealthy, xid(g), "back in service (removed from wasmsched.io/gpu-out-of-service)")
                };
                (from != to).then_some((*g, from, to, why))
            })
            .collect();
        for (gpu, from, to, reason) in changes {
            let uuid = self.topology.as_ref().and_then(|t| t.gpus().get(gpu as usize)).and_then(|g| g.uuid.clone());
            self.health_changed(gpu, uuid, from, to, reason.into(), None);
        }
        self.out_of_service = gpus;
        self.publish_if_changed()
    }

    /// Takes a new discovery. Returns the report when it differs from the last one published (and
    /// publishes `node-inventory-changed`), None when nothing changed.
    pub fn observe(&mut self, discovery: Discovery) -> Option<NodeReport> {
        self.topology = Some(discovery.topology);
        self.driver = discovery.driver;
        self.publish_if_changed()
    }

    /// Takes an XID event: updates the GPU's health (never back to healthy: a GPU that failed
    /// stays drained until the agent restarts after repair), publishes `node-gpu-health-changed`
    /// and the changed report.
    pub fn on_xid(&mut self, event: &XidEvent) -> Option<NodeReport> {
        let topology = self.topology.as_ref()?;
        let Some(index) = topology.gpus().iter().position(|g| g.uuid.as_deref() == Some(event.uuid.as_str())) else {
            tracing::warn!(uuid = %event.uuid, "XID for a GPU the agent does not know");
            return None;
        };
        let index = index as u32;
        let before = self.health.get(&index).copied().unwrap_or(Health::Healthy);
        let after = worse(before, event.health);
        if after == before {
            return None;
        }
        self.health.insert(index, after);
        let reason = match event.xid {
            Some(xid) => format!("XID {xid}: {}", event.description),
            None => event.description.clone(),
        };
        let xid = event.xid.and_then(|x| u32::try_from(x).ok());
        self.health_changed(index, Some(event.uuid.clone()), before, after, reason, xid);
        self.publish_if_changed()
    }

    /// Publishes `node-gpu-health-changed`.
    fn health_changed(
        &self,
        gpu: u32,
        uuid: Option<String>,
        from: Health,
        to: Health,
        reason: String,
        xid: Option<u32>,
    ) {
        if let Some(sink) = &self.sink {
            let (node, from, to) = (self.node.clone(), wire(from), wire(to));
            sink.emit(Payload::NodeGpuHealthChanged(NodeGpuHealthChanged { node, gpu, uuid, from, to, reason, xid }));
        }
    }

    fn publish_if_changed(&mut self) -> Option<NodeReport> {
        let report = self.report();
        if self.published.as_ref() == Some(&report) {
            return None;
        }
        if let (Some(sink), Some(topology)) = (&self.sink, &self.topology) {
            sink.emit(Payload::NodeInventoryChanged(NodeInventoryChanged {
                node: self.node.clone(),
                gpus: topology.len() as u32,
                interconnect: topology.interconnect().into(),
                driver: self.driver.clone(),
                topology: report.annotations.get(TOPOLOGY_ANNOTATION).cloned().unwrap_or_default(),
                labels: report.labels.clone(),
                unhealthy_gpus: self.unhealthy().into_iter().collect(),
            }));
        }
        self.published = Some(report.clone());
        Some(report)
    }

    /// GPUs currently unhealthy: by XID, or out of service.
    pub fn unhealthy(&self) -> BTreeSet<u32> {
        let by_xid = self.health.iter().filter(|(_, h)| **h == Health::Unhealthy).map(|(g, _)| *g);
        by_xid.chain(self.out_of_service.iter().copied()).collect()
    }

    /// Hands back the sink (to flush and close it).
    pub fn into_sink(self) -> Option<EventSink> {
        self.sink
    }
}

fn worse(a: Health, b: Health) -> Health {
    let rank = |h: Health| match h {
        Health::Healthy => 0,
        Health::Degraded => 1,
        Health::Unhealthy => 2,
    };
    if rank(b) > rank(a) { b } else { a }
}

fn wire(h: Health) -> GpuHealth {
    match h {
        Health::Healthy => GpuHealth::Healthy,
        Health::Degraded => GpuHealth::Degraded,
        Health::Unhealthy => GpuHealth::Unhealthy,
    }
}

#[cfg(test)]
mod mirrors {
    use super::*;

    /// The event schema's GPU health mirrors NVML's by hand: `wire`'s match fails to compile when
    /// NVML's side gains a variant, this one when the schema's does, and the round trip fails when
    /// `wire` never says a variant.
    #[test]
    fn every_health_the_events_say_is_one_nvml_reports() {
        for h in [GpuHealth::Healthy, GpuHealth::Degraded, GpuHealth::Unhealthy] {
            let nvml = match h {
                GpuHealth::Healthy => Health::Healthy,
                GpuHealth::Degraded => Health::Degraded,
                GpuHealth::Unhealthy => Health::Unhealthy,
            };
            assert_eq!(wire(nvml), h);
        }
    }
}

/// Writes the report on the Kubernetes Node object, where the scheduler reads it.
pub mod node_object {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams};
    use serde_json::{Map, Value, json};
    use wasmsched_topology::annotation::{
        DEGRADED_ANNOTATION, LABEL_PREFIX, TOPOLOGY_ANNOTATION, UNHEALTHY_ANNOTATION,
    };

    use super::{AgentError, NodeReport};

    /// The merge patch that makes `current` (the node's labels and annotations) carry `report`:
    /// the report's keys set, and the keys the agent owns but no longer reports (a GPU healthy
    /// again, a capability gone) removed. Keys the agent does not own are never touched. `None`
    /// when the node already says it all.
    pub fn patch(
        report: &NodeReport,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> Option<Value> {
        fn diff(
            want: &BTreeMap<String, String>,
            have: &BTreeMap<String, String>,
            owned: impl Fn(&str) -> bool,
        ) -> Map<String, Value> {
            let mut out = Map::new();
            for (k, v) in want {
                if have.get(k) != Some(v) {
                    out.insert(k.clone(), json!(v));
                }
            }
            for k in have.keys().filter(|k| owned(k) && !want.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            out
        }
        let owned_annotation = |k: &str| [TOPOLOGY_ANNOTATION, UNHEALTHY_ANNOTATION, DEGRADED_ANNOTATION].contains(&k);
        let labels = diff(&report.labels, labels, |k| k.starts_with(LABEL_PREFIX));
        let annotations = diff(&report.annotations, annotations, owned_annotation);
        if labels.is_empty() && annotations.is_empty() {
            return None;
        }
        Some(json!({"metadata": {"labels": labels, "annotations": annotations}}))
    }

    /// The GPUs the node `name` has out of service ([`super::OUT_OF_SERVICE_ANNOTATION`]; none
    /// when it is absent). A value that does not parse is an error naming it: the caller keeps
    /// what it had, so a typo never puts GPUs back in service.
    pub async fn out_of_service(
        client: &kube::Client,
        name: &str,
    ) -> Result<std::collections::BTreeSet<u32>, AgentError> {
        let nodes: Api<Node> = Api::all(client.clone());
        let node =
            nodes.get(name).await.map_err(|source| AgentError::Kube { what: "reading", node: name.into(), source })?;
        let annotations = node.metadata.annotations.unwrap_or_default();
        let Some(value) = annotations.get(super::OUT_OF_SERVICE_ANNOTATION) else { return Ok(Default::default()) };
        let gpus = wasmsched_topology::annotation::gpu_list(super::OUT_OF_SERVICE_ANNOTATION, value)
            .map_err(|source| AgentError::Annotation { node: name.into(), source })?;
        Ok(gpus.into_iter().collect())
    }

    /// Patches the node `name` with `report` (read, compare, merge-patch).
    pub async fn write(client: &kube::Client, name: &str, report: &NodeReport) -> Result<bool, AgentError> {
        let kube_error = |what| move |source| AgentError::Kube { what, node: name.to_string(), source };
        let nodes: Api<Node> = Api::all(client.clone());
        let node = nodes.get(name).await.map_err(kube_error("reading"))?;
        let labels = node.metadata.labels.unwrap_or_default();
        let annotations = node.metadata.annotations.unwrap_or_default();
        let Some(p) = patch(report, &labels, &annotations) else { return Ok(false) };
        nodes.patch(name, &PatchParams::default(), &Patch::Merge(&p)).await.map_err(kube_error("patching"))?;
        Ok(true)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        }

        #[test]
        fn sets_what_changed_and_removes_only_what_the_agent_owns() {
            let report = NodeReport {
                annotations: map(&[(TOPOLOGY_ANNOTATION, "{v2}")]),
                labels: map(&[("wasmsched.io/nvlink", "nv18")]),
            };
            let labels = map(&[("wasmsched.io/nvlink", "nv18"), ("wasmsched.io/numa-nodes", "2"), ("team", "ml")]);
            let annotations = map(&[(TOPOLOGY_ANNOTATION, "{v1}"), (UNHEALTHY_ANNOTATION, "3"), ("other", "x")]);
            let p = patch(&report, &labels, &annotations).unwrap();
            assert_eq!(
                p,
                json!({"metadata": {
                    "labels": {"wasmsched.io/numa-nodes": null},
                    "annotations": {TOPOLOGY_ANNOTATION: "{v2}", UNHEALTHY_ANNOTATION: null}
                }})
            );
            let done_labels = map(&[("wasmsched.io/nvlink", "nv18"), ("team", "ml")]);
            let done_annotations = map(&[(TOPOLOGY_ANNOTATION, "{v2}"), ("other", "x")]);
            assert_eq!(patch(&report, &done_labels, &done_annotations), None);
        }
    }
}
