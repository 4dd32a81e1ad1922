//! CPUs and memory for the chosen GPUs: the NUMA nodes of the host, and a `numactl` line that pins
//! a process to specific CPUs next to its GPUs.

use std::path::Path;

use crate::{CpuSet, NodeTopology};

/// One NUMA node of the host.
#[derive(Clone, Debug, PartialEq)]
pub struct NumaNode {
    /// Node id.
    pub id: u32,
    /// Its CPUs.
    pub cpus: CpuSet,
    /// Memory in MiB, when known.
    pub memory_mb: Option<u64>,
    /// SLIT distance to each node, indexed by position in the list, when known.
    pub distances: Vec<u32>,
}

/// Parses `numactl --hardware`: CPUs, sizes and the distance table.
pub fn parse_numactl(text: &str) -> Result<Vec<NumaNode>, String> {
    let mut nodes: Vec<NumaNode> = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        match tokens.as_slice() {
            ["node", id, "cpus:", cpus @ ..] => {
                let id: u32 = id.parse().map_err(|_| format!("bad node id in `{line}`"))?;
                let cpus = cpus
                    .iter()
                    .map(|c| c.parse::<u32>().map_err(|_| format!("bad CPU `{c}` in `{line}`")))
                    .collect::<Result<CpuSet, _>>()?;
                nodes.push(NumaNode { id, cpus, memory_mb: None, distances: Vec::new() });
            }
            ["node", id, "size:", size, "MB"] => {
                let node = find(&mut nodes, id, line)?;
                node.memory_mb = Some(size.parse().map_err(|_| format!("bad size in `{line}`"))?);
            }
            ["node", "distances:"] => {
                lines.next(); // the `node 0 1` header
                for node in nodes.iter_mut() {
                    let row = lines.next().ok_or("distance table is short")?;
                    let (label, values) = row.split_once(':').ok_or_else(|| format!("bad distance row `{row}`"))?;
                    if label.trim().parse::<u32>().ok() != Some(node.id) {
                        return Err(format!("distance row `{row}` is not node {}", node.id));
                    }
                    node.distances = values
                        .split_whitespace()
                        .map(|d| d.parse().map_err(|_| format!("bad distance `{d}`")))
                        .collect::<Result<_, _>>()?;
                }
            }
            _ => {}
        }
    }
    if nodes.is_empty() {
        return Err("no `node N cpus:` line: is this `numactl --hardware` output?".into());
    }
    Ok(nodes)
}

fn find<'a>(nodes: &'a mut [NumaNode], id: &str, line: &str) -> Result<&'a mut NumaNode, String> {
    let id: u32 = id.parse().map_err(|_| format!("bad node id in `{line}`"))?;
    nodes.iter_mut().find(|n| n.id == id).ok_or_else(|| format!("`{line}` names node {id} before its cpus line"))
}

/// Reads the NUMA nodes from sysfs (`<root>/devices/system/node/node*/cpulist`, `distance`);
/// `root` is `/sys` on a real host.
pub fn read_sysfs(root: &Path) -> std::io::Result<Vec<NumaNode>> {
    let dir = root.join("devices/system/node");
    let mut nodes = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_prefix("node")).and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let cpulist = std::fs::read_to_string(entry.path().join("cpulist"))?;
        let cpus = CpuSet::parse(&cpulist).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let distances = std::fs::read_to_string(entry.path().join("distance"))
            .map(|d| d.split_whitespace().filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default();
        nodes.push(NumaNode { id, cpus, memory_mb: None, distances });
    }
    nodes.sort_by_key(|n| n.id);
    Ok(nodes)
}

/// The NUMA nodes as the topology itself describes them: each node's CPUs are the union of the CPU
/// affinity of its GPUs (what `nvidia-smi topo -m` prints per GPU). Nodes without GPUs are not
/// seen; use [`read_sysfs`] or [`parse_numactl`] on the host for the full list.
pub fn numa_from_topology(topology: &NodeTopology) -> Vec<NumaNode> {
    topology
        .numa_nodes()
        .into_iter()
        .map(|id| NumaNode {
            id,
            cpus: topology.gpus().iter().filter(|g| g.numa == Some(id)).flat_map(|g| g.cpus.iter()).collect(),
            memory_mb: None,
            distances: Vec::new(),
        })
        .collect()
}

/// CPUs (and memory nodes) chosen for a process using some GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuPlan {
    /// The CPUs to pin to.
    pub cpus: CpuSet,
    /// NUMA nodes those CPUs belong to, ascending: where memory should be bound.
    pub numa_nodes: Vec<u32>,
}

impl CpuPlan {
    /// The `numactl` command line that runs `command` on these CPUs and their memory.
    pub fn numactl(&self, command: &[&str]) -> Vec<String> {
        let nodes: Vec<String> = self.numa_nodes.iter().map(u32::to_string).collect();
        let mut line = vec![
            "numactl".to_string(),
            format!("--physcpubind={}", self.cpus),
            format!("--membind={}", nodes.join(",")),
            "--".to_string(),
        ];
        line.extend(command.iter().map(|s| s.to_string()));
        line
    }
}

/// Picks `count` CPUs for a process using `gpus`: first from the NUMA nodes holding most of those
/// GPUs (ties: lower node id), then from the others, skipping CPUs already `pinned` to other
/// processes. Errors for an unknown GPU, a GPU without a NUMA node, or too few free CPUs.
pub fn plan(
    topology: &NodeTopology,
    numa: &[NumaNode],
    gpus: &[u32],
    count: usize,
    pinned: &CpuSet,
) -> Result<CpuPlan, String> {
    let mut per_node: Vec<(u32, usize)> = numa.iter().map(|n| (n.id, 0)).collect();
    for &gpu in gpus {
        let info = topology
            .gpus()
            .get(gpu as usize)
            .ok_or_else(|| format!("GPU {gpu} is not on this node ({} GPUs)", topology.len()))?;
        let id = info.numa.ok_or_else(|| format!("the NUMA node of GPU {gpu} is unknown"))?;
        let slot = per_node
            .iter_mut()
            .find(|(n, _)| *n == id)
            .ok_or_else(|| format!("GPU {gpu} is on NUMA node {id}, which the host does not list"))?;
        slot.1 += 1;
    }
    per_node.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut chosen = Vec::with_capacity(count);
    let mut nodes = Vec::new();
    for (id, _) in &per_node {
        if chosen.len() == count {
            break;
        }
        let node = numa.iter().find(|n| n.id == *id).expect("listed");
        let before = chosen.len();
        chosen.extend(node.cpus.iter().filter(|c| !pinned.contains(*c)).take(count - before));
        if chosen.len() > before {
            nodes.push(*id);
        }
    }
    if chosen.len() < count {
        return Err(format!("{count} CPUs requested, {} are free", chosen.len()));
    }
    nodes.sort_unstable();
    Ok(CpuPlan { cpus: chosen.into_iter().collect(), numa_nodes: nodes })
}
