//! Parser for `nvidia-smi topo -m` (alias `--matrix`).
//!
//! Handles what real machines print: the tab-led header (a leading tab that a naive `strip()` loses,
//! making the header look like a GPU row), `X` cells padded with spaces, `NV#` bonds of any width,
//! NIC columns named `NIC#` (with a `NIC Legend`) or `mlx5_#`, old `SOC` for `SYS`, optional
//! `CPU Affinity` / `NUMA Affinity` / `GPU NUMA ID` columns, trailing legends, and the terminal
//! escapes (an underlined header) that driver 580 prints even into a file or a pipe. Anything else
//! is refused with the line and column, never guessed.
//!
//! Huawei's `npu-smi info -t topo` prints the same matrix for Ascend NPUs — `NPU#` columns, `HCCS`
//! for a direct link — read by [`parse_npu_smi`].

use crate::{CpuSet, Error, Gpu, Link, Nic, NodeTopology, PeerLinks};

/// What a vendor's copy of the matrix names differently.
struct Dialect {
    /// Device columns: `GPU0`, `NPU0`, …
    device: &'static str,
    /// The command, for errors.
    tool: &'static str,
    /// A direct device link's code besides NVIDIA's `NV#` (one bond).
    direct: Option<&'static str>,
}

const NVIDIA_SMI: Dialect = Dialect { device: "GPU", tool: "nvidia-smi topo -m", direct: None };
const NPU_SMI: Dialect = Dialect { device: "NPU", tool: "npu-smi info -t topo", direct: Some("HCCS") };

const TRAILING: [&str; 3] = ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"];

/// Parses the text `nvidia-smi topo -m` prints.
pub fn parse(text: &str) -> Result<NodeTopology, Error> {
    parse_as(text, &NVIDIA_SMI)
}

/// Parses the text `npu-smi info -t topo` prints (Ascend NPUs; an `HCCS` pair is a direct link,
/// named [`PeerLinks::Hccs`]). A full HCCS mesh is point-to-point links, never taken for a switch.
pub fn parse_npu_smi(text: &str) -> Result<NodeTopology, Error> {
    let mut topology = parse_as(text, &NPU_SMI)?;
    topology.set_switched(false);
    topology.set_peer_links(PeerLinks::Hccs);
    Ok(topology)
}

fn parse_as(text: &str, dialect: &Dialect) -> Result<NodeTopology, Error> {
    let text = without_escapes(text);
    let lines: Vec<&str> = text.lines().collect();
    let (header_at, columns, trailing) = header(&lines, dialect)?;
    let is_gpu_name = |name: &str| is_device_name(name, dialect.device);
    let gpu_columns = columns.iter().take_while(|c| is_gpu_name(c)).count();
    if gpu_columns == 0 {
        return Err(bad(header_at, "the header names no GPU column"));
    }
    if let Some(c) = columns[gpu_columns..].iter().find(|c| is_gpu_name(c)) {
        return Err(bad(header_at, format!("GPU column {c} comes after a NIC column")));
    }

    let mut rows: Vec<Option<Row>> = vec![None; columns.len()];
    for (at, line) in lines.iter().enumerate().skip(header_at + 1) {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with("Legend") {
            break;
        }
        let tokens: Vec<&str> = trimmed.split_whitespace().collect();
        let Some(position) = columns.iter().position(|c| c == tokens[0]) else {
            return Err(bad(at, format!("row `{}` is not a column of the header", tokens[0])));
        };
        if rows[position].is_some() {
            return Err(bad(at, format!("row {} appears twice", tokens[0])));
        }
        if tokens.len() < 1 + columns.len() {
            return Err(bad(
                at,
                format!("row {} has {} cells, the header has {} columns", tokens[0], tokens.len() - 1, columns.len()),
            ));
        }
        let cells: Vec<String> = tokens[1..=columns.len()].iter().map(|s| s.to_string()).collect();
        if cells[position] != "X" {
            return Err(bad(at, format!("row {} has `{}` on the diagonal, not X", tokens[0], cells[position])));
        }
        let extra: Vec<String> = tokens[1 + columns.len()..].iter().map(|s| s.to_string()).collect();
        rows[position] = Some(Row { at, cells, extra });
    }

    let mut gpus = Vec::with_capacity(gpu_columns);
    let mut matrix = vec![Link::Sys; gpu_columns * gpu_columns];
    let mut nic_paths = vec![Vec::with_capacity(gpu_columns); columns.len() - gpu_columns];
    for (i, row) in rows.iter().take(gpu_columns).enumerate() {
        let Some(row) = row else {
            return Err(bad(header_at, format!("no row for {}", columns[i])));
        };
        for (j, cell) in row.cells.iter().enumerate() {
            if j == i {
                continue;
            }
            let direct = dialect.direct.filter(|d| d == cell).map(|_| Link::NvLink { links: 1, switched: false });
            let link = direct.or_else(|| Link::from_code(cell)).ok_or_else(|| {
                bad(row.at, format!("unknown link `{cell}` in row {} column {}", columns[i], columns[j]))
            })?;
            if j < gpu_columns {
                matrix[i * gpu_columns + j] = link;
            } else {
                nic_paths[j - gpu_columns].push(link);
            }
        }
        gpus.push(gpu(i, row, &trailing)?);
    }

    let legend = nic_legend(&lines);
    let nics = columns[gpu_columns..]
        .iter()
        .zip(nic_paths)
        .map(|(column, gpu_links)| Nic {
            name: legend
                .iter()
                .find(|(alias, _)| alias == column)
                .map_or_else(|| column.clone(), |(_, name)| name.clone()),
            gpu_links,
        })
        .collect();

    let inferred = infer_numa(&mut gpus);
    let mut topology = NodeTopology::new(gpus, |i, j| matrix[i * gpu_columns + j], nics)?;
    if inferred {
        topology.set_numa_inferred();
    }
    Ok(topology)
}

/// The text without ANSI control sequences (`ESC [ … final-byte`): nvidia-smi 580 underlines the
/// header with `ESC[4m … ESC[0m` whether or not it writes to a terminal.
fn without_escapes(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('\u{1b}') {
        return text.into();
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next_if_eq(&'[').is_some() {
            // Parameter and intermediate bytes, then one final byte in @..~.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out.into()
}

#[derive(Clone)]
struct Row {
    at: usize,
    cells: Vec<String>,
    extra: Vec<String>,
}

fn bad(line: usize, message: impl Into<String>) -> Error {
    Error::Parse { line: line + 1, message: message.into() }
}

fn is_device_name(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix).is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Finds the header: the first line whose first token is `GPU0` (`NPU0`). Returns its line index,
/// the device columns, and which trailing columns follow them, in order.
fn header(lines: &[&str], dialect: &Dialect) -> Result<(usize, Vec<String>, Vec<&'static str>), Error> {
    let first = format!("{}0", dialect.device);
    let at =
        lines.iter().position(|l| l.split_whitespace().next() == Some(first.as_str())).ok_or_else(|| Error::Parse {
            line: 1,
            message: format!("no header line starting with {first}: is this `{}` output?", dialect.tool),
        })?;
    let line = lines[at];
    let devices_end = TRAILING.iter().filter_map(|name| line.find(name)).min().unwrap_or(line.len());
    let columns: Vec<String> = line[..devices_end].split_whitespace().map(String::from).collect();
    let mut trailing: Vec<(usize, &'static str)> =
        TRAILING.iter().filter_map(|name| line.find(name).map(|p| (p, *name))).collect();
    trailing.sort();
    let rest = line[devices_end..].split_whitespace().collect::<Vec<_>>().join(" ");
    let known = trailing.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(" ");
    if rest != known {
        return Err(bad(at, format!("unknown trailing columns `{rest}`")));
    }
    let mut unique = columns.clone();
    unique.sort();
    unique.dedup();
    if unique.len() != columns.len() {
        return Err(bad(at, "the header repeats a column"));
    }
    Ok((at, columns, trailing.into_iter().map(|(_, n)| n).collect()))
}

fn gpu(index: usize, row: &Row, trailing: &[&'static str]) -> Result<Gpu, Error> {
    let mut gpu = Gpu { index: index as u32, ..Gpu::default() };
    // Values are positional; an empty trailing cell (NIC rows) just shortens the row.
    for (name, value) in trailing.iter().zip(row.extra.iter()) {
        match *name {
            "CPU Affinity" => {
                gpu.cpus = CpuSet::parse(value).map_err(|e| bad(row.at, e))?;
            }
            "NUMA Affinity" if value != "N/A" => {
                // Some hosts print a range (`0-1`) for a GPU equidistant to two nodes: no single node.
                gpu.numa = value.parse().ok();
            }
            _ => {}
        }
    }
    if row.extra.len() > trailing.len() {
        return Err(bad(
            row.at,
            format!(
                "row GPU{index} has {} cells after the matrix, the header names {}",
                row.extra.len(),
                trailing.len()
            ),
        ));
    }
    Ok(gpu)
}

/// `NIC0: mlx5_0` lines of the `NIC Legend` block.
fn nic_legend(lines: &[&str]) -> Vec<(String, String)> {
    let Some(start) = lines.iter().position(|l| l.trim() == "NIC Legend:") else {
        return Vec::new();
    };
    lines[start + 1..]
        .iter()
        .filter_map(|l| {
            let (alias, name) = l.trim().split_once(':')?;
            Some((alias.trim().to_string(), name.trim().to_string()))
        })
        .collect()
}

/// Old nvidia-smi prints CPU affinity but no NUMA column: GPUs that share a CPU affinity share a
/// socket, numbered in order of appearance. Returns true when it inferred anything.
fn infer_numa(gpus: &mut [Gpu]) -> bool {
    if gpus.iter().any(|g| g.numa.is_some()) || gpus.iter().any(|g| g.cpus.is_empty()) {
        return false;
    }
    let mut seen: Vec<CpuSet> = Vec::new();
    for gpu in gpus.iter_mut() {
        let id = seen.iter().position(|s| *s == gpu.cpus).unwrap_or_else(|| {
            seen.push(gpu.cpus.clone());
            seen.len() - 1
        });
        gpu.numa = Some(id as u32);
    }
    true
}
