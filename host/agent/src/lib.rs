//! The node agent's logic: what a node looks like ([`Discovery`]), what the agent writes on it
//! ([`NodeReport`]), and the state machine that publishes changes and health ([`Agent`]).
//!
//! The binary (`wasmsched-agent`) wires it to NVML or `nvidia-smi` text, a timer, the XID watcher
//! and an event sink. Writing to the Kubernetes Node object comes with the Kubernetes integration;
//! until then the report is written as JSON files (`--write DIR`) that a sidecar or the Helm chart's
//! node-labeller can apply.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;
use wasmsched_events::EventSink;
use wasmsched_events::schema::{GpuHealth, NodeGpuHealthChanged, NodeInventoryChanged, Payload};
use wasmsched_nvml::{Health, Session, XidEvent};
use wasmsched_topology::NodeTopology;
use wasmsched_topology::annotation::{self, TOPOLOGY_ANNOTATION};

pub use wasmsched_topology::annotation::{DEGRADED_ANNOTATION, UNHEALTHY_ANNOTATION};

/// Where the node's GPUs come from.
pub enum Source {
    /// NVML (the real thing).
    Nvml,
    /// `nvidia-smi topo -m` output in a file (hosts without NVML access, tests, replays).
    Smi(std::path::PathBuf),
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
    pub fn discover(&self) -> anyhow::Result<Discovery> {
        match self {
            Source::Nvml => {
                let session = Session::open()?;
                let inventory = session.inventory()?;
                let topology = inventory.topology()?;
                Ok(Discovery { topology, driver: inventory.driver.clone(), inventory: Some(inventory) })
            }
            Source::Smi(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                let topology =
                    wasmsched_topology::smi::parse(&text).with_context(|| format!("parsing {}", path.display()))?;
                Ok(Discovery { topology, driver: String::new(), inventory: None })
            }
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
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, map) in [("annotations.json", &self.annotations), ("labels.json", &self.labels)] {
            let path = dir.join(name);
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, serde_json::to_vec_pretty(map)?)
                .with_context(|| format!("writing {}", tmp.display()))?;
            std::fs::rename(&tmp, &path).with_context(|| format!("renaming to {}", path.display()))?;
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
            published: None,
        }
    }

    /// The report for the current topology and health.
    pub fn report(&self) -> NodeReport {
        let Some(topology) = &self.topology else { return NodeReport::default() };
        let mut report = NodeReport { annotations: BTreeMap::new(), labels: annotation::labels(topology) };
        report.annotations.insert(TOPOLOGY_ANNOTATION.into(), annotation::to_annotation(topology));
        for (key, wanted) in [(UNHEALTHY_ANNOTATION, Health::Unhealthy), (DEGRADED_ANNOTATION, Health::Degraded)] {
            let gpus: Vec<String> =
                self.health.iter().filter(|(_, h)| **h == wanted).map(|(g, _)| g.to_string()).collect();
            if !gpus.is_empty() {
                report.annotations.insert(key.into(), gpus.join(","));
            }
        }
        report
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
        if let Some(sink) = &self.sink {
            sink.emit(Payload::NodeGpuHealthChanged(NodeGpuHealthChanged {
                node: self.node.clone(),
                gpu: index,
                uuid: Some(event.uuid.clone()),
                from: wire(before),
                to: wire(after),
                reason: match event.xid {
                    Some(xid) => format!("XID {xid}: {}", event.description),
                    None => event.description.clone(),
                },
                xid: event.xid.and_then(|x| u32::try_from(x).ok()),
            }));
        }
        self.publish_if_changed()
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
                unhealthy_gpus: self.health.iter().filter(|(_, h)| **h == Health::Unhealthy).map(|(g, _)| *g).collect(),
            }));
        }
        self.published = Some(report.clone());
        Some(report)
    }

    /// GPUs currently marked unhealthy.
    pub fn unhealthy(&self) -> BTreeSet<u32> {
        self.health.iter().filter(|(_, h)| **h == Health::Unhealthy).map(|(g, _)| *g).collect()
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
