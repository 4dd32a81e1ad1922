//! Parser for AWS's `neuron-ls` table (Inferentia and Trainium devices): one row per device with
//! its `CONNECTED DEVICES`, the devices it has a direct NeuronLink to (a ring on inf1/inf2, a 4×4
//! torus on trn1/trn2); newer versions add `NUMA NODE`. Rows of processes under a device (an empty
//! device cell), the `--topology` drawing and the `instance-type:` lines around it are skipped.
//!
//! A NeuronLink pair is a direct device link, classed [`Link::NvLink`] with one bond and named
//! [`PeerLinks::NeuronLink`]; any other pair goes over more than one NeuronLink hop or the host, so
//! it is classed as a path across the node ([`Link::Node`] within one NUMA node, else
//! [`Link::Sys`]). Device selection then keeps a job on devices next to each other — a run on the
//! ring, a square of the torus — as AWS's own Neuron scheduler extension does. A table whose
//! devices are not `0..n` in order, a link listed by one end only, or a device cell that is no
//! number is refused with its line, never guessed.

use crate::{Error, Gpu, Link, NodeTopology, PeerLinks};

/// Parses what `neuron-ls` (or `neuron-ls --topology`, `--wide`, `--show-all-procs`) prints.
pub fn parse(text: &str) -> Result<NodeTopology, Error> {
    let lines: Vec<&str> = text.lines().collect();
    let table = Table::find(&lines)?;
    let device = table.column("NEURON DEVICE")?;
    let connected = table.column("CONNECTED DEVICES")?;
    let bdf = table.column("PCI BDF").ok();
    let numa = table.column("NUMA NODE").ok();
    let mut gpus = Vec::new();
    let mut peers: Vec<(usize, Vec<u32>)> = Vec::new();
    for (at, row) in &table.rows {
        let bad = |message: String| Error::Parse { line: at + 1, message };
        let id = row[device].as_str();
        if id.is_empty() {
            continue; // another process of the device above
        }
        let index: u32 = id.parse().map_err(|_| bad(format!("device {id:?} is no number")))?;
        if index as usize != gpus.len() {
            return Err(bad(format!("device {index} where device {} was expected", gpus.len())));
        }
        let list = row[connected].as_str();
        let linked: Vec<u32> = if list.is_empty() || list == "-" || list == "NA" {
            Vec::new()
        } else {
            list.split(',')
                .map(|d| d.trim().parse().map_err(|_| bad(format!("connected device {:?} is no number", d.trim()))))
                .collect::<Result<_, _>>()?
        };
        let numa = match numa.map(|c| row[c].as_str()) {
            None | Some("" | "-" | "NA" | "-1") => None,
            Some(n) => Some(n.parse().map_err(|_| bad(format!("NUMA node {n:?} is no number")))?),
        };
        let pci = bdf.map(|c| row[c].clone()).filter(|b| !b.is_empty() && b != "NA");
        gpus.push(Gpu { index, numa, pci, ..Gpu::default() });
        peers.push((*at, linked));
    }
    if gpus.is_empty() {
        return Err(Error::Parse { line: table.header + 1, message: "a device table without devices".into() });
    }
    let n = gpus.len();
    let mut direct = vec![false; n * n];
    for (i, (at, linked)) in peers.iter().enumerate() {
        for &j in linked {
            let j = j as usize;
            if j >= n || j == i {
                return Err(Error::Parse { line: at + 1, message: format!("device {i} connected to device {j}") });
            }
            direct[i * n + j] = true;
        }
    }
    for i in 0..n {
        for j in 0..n {
            if direct[i * n + j] && !direct[j * n + i] {
                return Err(Error::Parse {
                    line: peers[j].0 + 1,
                    message: format!("device {i} lists device {j} as connected, and device {j} does not list {i}"),
                });
            }
        }
    }
    let numa_of: Vec<Option<u32>> = gpus.iter().map(|g| g.numa).collect();
    let mut topology = NodeTopology::new(
        gpus,
        |i, j| match (direct[i * n + j], numa_of[i], numa_of[j]) {
            (true, ..) => Link::NvLink { links: 1, switched: false },
            (false, Some(a), Some(b)) if a == b => Link::Node,
            _ => Link::Sys,
        },
        Vec::new(),
    )?;
    topology.set_switched(false);
    topology.set_peer_links(PeerLinks::NeuronLink);
    Ok(topology)
}

/// The device table: column titles (each the words of its header rows joined, `NEURON DEVICE`)
/// and its rows' cells, trimmed, with their 0-based line.
struct Table {
    header: usize,
    titles: Vec<String>,
    rows: Vec<(usize, Vec<String>)>,
}

impl Table {
    /// The table whose header has a `CONNECTED` column: header rows up to the next `+---` rule,
    /// data rows after it up to the first line that is neither a row nor a rule.
    fn find(lines: &[&str]) -> Result<Table, Error> {
        let cells = |line: &str| -> Vec<String> {
            let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
            inner.split('|').map(|c| c.trim().to_string()).collect()
        };
        let is_row = |line: &str| line.trim_start().starts_with('|');
        let is_rule = |line: &str| line.trim_start().starts_with('+');
        let header =
            lines.iter().position(|l| is_row(l) && cells(l).iter().any(|c| c == "CONNECTED")).ok_or_else(|| {
                Error::Parse { line: 1, message: "no neuron-ls device table (no CONNECTED column)".into() }
            })?;
        let mut titles = cells(lines[header]);
        let mut at = header + 1;
        while at < lines.len() && is_row(lines[at]) {
            let more = cells(lines[at]);
            if more.len() != titles.len() {
                return Err(Error::Parse { line: at + 1, message: "header rows of different widths".into() });
            }
            for (t, m) in titles.iter_mut().zip(more) {
                if !m.is_empty() {
                    t.push(' ');
                    t.push_str(&m);
                }
            }
            at += 1;
        }
        let mut rows = Vec::new();
        for (i, line) in lines.iter().enumerate().skip(at) {
            if is_rule(line) {
                continue;
            }
            if !is_row(line) {
                break;
            }
            let row = cells(line);
            if row.len() != titles.len() {
                return Err(Error::Parse {
                    line: i + 1,
                    message: format!("{} cells in a table of {} columns", row.len(), titles.len()),
                });
            }
            rows.push((i, row));
        }
        Ok(Table { header, titles, rows })
    }

    fn column(&self, title: &str) -> Result<usize, Error> {
        self.titles.iter().position(|t| t == title).ok_or_else(|| Error::Parse {
            line: self.header + 1,
            message: format!("no {title} column (columns: {})", self.titles.join(", ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "+---+---+\n| NEURON | CONNECTED |\n| DEVICE | DEVICES |\n+---+---+\n";

    #[test]
    fn a_link_listed_by_one_end_only_or_a_wrong_device_is_refused_with_its_line() {
        let one_sided = format!("{HEAD}| 0 | 1 |\n| 1 |  |\n+---+---+\n");
        let e = parse(&one_sided).unwrap_err().to_string();
        assert!(e.contains("line 6") && e.contains("device 1 does not list 0"), "{e}");
        let skipped = format!("{HEAD}| 0 |  |\n| 2 |  |\n");
        assert!(parse(&skipped).unwrap_err().to_string().contains("device 2 where device 1 was expected"));
        let bad = format!("{HEAD}| 0 | x |\n");
        assert!(parse(&bad).unwrap_err().to_string().contains("connected device \"x\""));
        assert!(parse("nvidia-smi output").unwrap_err().to_string().contains("no neuron-ls device table"));
        assert!(parse(HEAD).unwrap_err().to_string().contains("without devices"));
    }
}
