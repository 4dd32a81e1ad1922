//! Parser for AMD's topology tools: `rocm-smi --showtopo` (sections "Link Type between two GPUs",
//! "Hops between two GPUs", "Numa Nodes", GPUs named `GPU0`…) and `amd-smi topology` (tables
//! "LINK TYPE TABLE:", "HOPS TABLE:", GPUs named by PCI bus id, in index order).
//!
//! Link classes are the same as NVIDIA's: an xGMI (Infinity Fabric) link between two GPUs is a
//! direct accelerator link, classed [`Link::NvLink`] with one bond (the class placement scores by;
//! each xGMI link of an MI300X moves 64 GB/s a direction, about one NVLink 4 bond's 50–75 % per
//! link count); PCIe paths are classed by their hops and NUMA nodes — within one NUMA node one or
//! two hops are [`Link::Phb`], more [`Link::Node`]; across NUMA nodes (or, with NUMA unknown,
//! three hops and more) [`Link::Sys`]. Anything else (a cell that is no link type, a table that is
//! not square, no link table at all) is refused with its line, never guessed.

use crate::{Error, Gpu, Link, NodeTopology};

/// Parses what `rocm-smi --showtopo` or `amd-smi topology` prints.
pub fn parse(text: &str) -> Result<NodeTopology, Error> {
    let lines: Vec<&str> = text.lines().collect();
    let links = table(&lines, &["Link Type between two GPUs", "LINK TYPE TABLE"])?.ok_or_else(|| Error::Parse {
        line: 1,
        message: "no link type table (rocm-smi --showtopo, amd-smi topology)".into(),
    })?;
    let n = links.names.len();
    let hops = table(&lines, &["Hops between two GPUs", "HOPS TABLE"])?;
    if let Some(h) = &hops
        && h.names != links.names
    {
        return Err(Error::Parse {
            line: h.at + 1,
            message: "the hops table names other GPUs than the link table".into(),
        });
    }
    let numa = numa_nodes(&lines, n)?;
    let mut gpus: Vec<Gpu> =
        (0..n as u32).map(|index| Gpu { index, numa: numa[index as usize], ..Gpu::default() }).collect();
    for (g, name) in gpus.iter_mut().zip(&links.names) {
        if is_bus_id(name) {
            g.pci = Some(name.clone());
        }
    }
    let mut classes = vec![Link::Sys; n * n];
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i) {
            let cell = links.cells[i * n + j].as_str();
            let hop: Option<u32> = hops.as_ref().and_then(|h| h.cells[i * n + j].parse().ok());
            let same_numa = match (numa[i], numa[j]) {
                (Some(a), Some(b)) => Some(a == b),
                _ => None,
            };
            classes[i * n + j] = match cell {
                "XGMI" => Link::NvLink { links: 1, switched: false },
                "PCIE" => match (same_numa, hop) {
                    (Some(false), _) => Link::Sys,
                    (Some(true), Some(h)) if h <= 2 => Link::Phb,
                    (Some(true), _) => Link::Node,
                    (None, Some(h)) if h <= 2 => Link::Phb,
                    (None, _) => Link::Sys,
                },
                other => {
                    return Err(Error::Parse {
                        line: links.header + 2 + i,
                        message: format!("cell {other:?} between GPU {i} and GPU {j} is no link type (XGMI, PCIE)"),
                    });
                }
            };
        }
    }
    for i in 0..n {
        for j in 0..i {
            if classes[i * n + j] != classes[j * n + i] {
                return Err(Error::Invalid(format!("the link between GPU {j} and GPU {i} differs by direction")));
            }
        }
    }
    let mut topology = NodeTopology::new(gpus, |i, j| classes[i * n + j], Vec::new())?;
    // A full xGMI mesh is point-to-point links, not a switch (NVIDIA's eight-GPU rule does not hold).
    topology.set_switched(false);
    topology.set_peer_links(crate::PeerLinks::Xgmi);
    Ok(topology)
}

/// A square table: the GPU names of its header and its cells, row-major (the diagonal as printed).
struct Table {
    /// 0-based line of its title.
    at: usize,
    /// 0-based line of its header (row `i` is the line after it plus `i`).
    header: usize,
    names: Vec<String>,
    cells: Vec<String>,
}

/// The first table whose title line contains one of `titles`: its header is the next non-empty line,
/// its rows the lines after that start with a header name, in header order.
fn table(lines: &[&str], titles: &[&str]) -> Result<Option<Table>, Error> {
    let Some(at) = lines.iter().position(|l| titles.iter().any(|t| l.contains(t))) else { return Ok(None) };
    let bad = |line: usize, message: String| Error::Parse { line: line + 1, message };
    let header_at = (at + 1..lines.len())
        .find(|&i| !lines[i].trim().is_empty())
        .ok_or_else(|| bad(at, "a table without a header".into()))?;
    let names: Vec<String> = lines[header_at].split_whitespace().map(String::from).collect();
    if names.is_empty() || !names.iter().all(|n| is_gpu_name(n) || is_bus_id(n)) {
        return Err(bad(header_at, format!("header {:?} names no GPUs", lines[header_at].trim())));
    }
    let n = names.len();
    let mut cells = Vec::with_capacity(n * n);
    for (k, name) in names.iter().enumerate() {
        let at = header_at + 1 + k;
        let row: Vec<&str> = lines.get(at).map(|l| l.split_whitespace().collect()).unwrap_or_default();
        if row.first() != Some(&name.as_str()) {
            return Err(bad(at, format!("expected the row of {name}")));
        }
        if row.len() != n + 1 {
            return Err(bad(at, format!("{} cells for {n} GPUs", row.len() - 1)));
        }
        cells.extend(row[1..].iter().map(|c| c.to_string()));
    }
    Ok(Some(Table { at, header: header_at, names, cells }))
}

/// `GPU0`, `GPU12`: rocm-smi's column names.
fn is_gpu_name(s: &str) -> bool {
    s.strip_prefix("GPU").is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// `0000:0c:00.0`: amd-smi's.
fn is_bus_id(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.bytes().enumerate().all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// rocm-smi's `GPU[i] : (Topology) Numa Node: k` lines (amd-smi's topology does not say).
fn numa_nodes(lines: &[&str], n: usize) -> Result<Vec<Option<u32>>, Error> {
    let mut numa = vec![None; n];
    for (at, line) in lines.iter().enumerate() {
        let Some((gpu, rest)) = line.trim().strip_prefix("GPU[").and_then(|l| l.split_once(']')) else { continue };
        let Some(node) = rest.split_once("(Topology) Numa Node:").map(|(_, v)| v.trim()) else { continue };
        let bad = |message: String| Error::Parse { line: at + 1, message };
        let i: usize = gpu.parse().map_err(|_| bad(format!("GPU index {gpu:?}")))?;
        if i >= n {
            return Err(bad(format!("NUMA node of GPU {i}, and the tables have {n} GPUs")));
        }
        // A GPU without NUMA placement (a single-node machine) prints -1.
        numa[i] = node.parse::<u32>().ok();
    }
    Ok(numa)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_that_is_no_link_type_is_refused_with_its_line() {
        let text = "LINK TYPE TABLE:\n             0000:03:00.0 0000:0c:00.0\n0000:03:00.0 SELF         NVLINK\n0000:0c:00.0 PCIE         SELF\n";
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("\"NVLINK\""), "{e}");
        assert!(parse("nothing here").unwrap_err().to_string().contains("no link type table"));
        let short = "LINK TYPE TABLE:\n             0000:03:00.0 0000:0c:00.0\n0000:03:00.0 SELF\n";
        assert!(parse(short).unwrap_err().to_string().contains("1 cells for 2 GPUs"));
        let one_way = "LINK TYPE TABLE:\n             0000:03:00.0 0000:0c:00.0\n0000:03:00.0 SELF XGMI\n0000:0c:00.0 PCIE SELF\n";
        assert!(parse(one_way).unwrap_err().to_string().contains("differs by direction"));
    }
}
