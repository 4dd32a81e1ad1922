//! openb trace loaders. Every malformed value is an error naming the file, line and column;
//! nothing is skipped silently.

use std::path::Path;

use wasmsched_api::{GPU_MILLI, GpuDevice, GpuRequest, Node, Qos, Resources, Task};

/// A trace that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file cannot be read. The cause is part of the message, not a chained source, so a
    /// report of the whole chain says it once.
    #[error("{file}: {cause}")]
    Io {
        /// File.
        file: String,
        /// Cause.
        cause: std::io::Error,
    },
    /// A malformed value or row.
    #[error("{file}:{line}:{column}: {message}")]
    Malformed {
        /// File.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column (field number).
        column: usize,
        /// What is wrong.
        message: String,
    },
}

/// One pod of an openb trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracePod {
    /// Name.
    pub name: String,
    /// CPU request in milli-cores.
    pub cpu_milli: u64,
    /// Memory request in MiB.
    pub memory_mib: u64,
    /// Whole GPUs (0..=8), or 1 for a shared GPU.
    pub num_gpu: u32,
    /// Share of each GPU in milli-GPUs (1000 for whole GPUs).
    pub gpu_milli: u32,
    /// Allowed GPU models (empty = any).
    pub gpu_spec: Vec<String>,
    /// QoS class as in the trace (`LS`, `Burstable`, `BE`).
    pub qos: String,
    /// Creation time in seconds, when present.
    pub creation_time: Option<u64>,
    /// Deletion time in seconds, when present.
    pub deletion_time: Option<u64>,
}

impl TracePod {
    /// Milli-GPUs requested in total.
    pub fn gpu_total_milli(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    /// The task the scheduler sees.
    pub fn to_task(&self) -> Task {
        Task {
            id: self.name.clone(),
            namespace: "openb".into(),
            queue: "default".into(),
            qos: match self.qos.as_str() {
                "LS" => Qos::Guaranteed,
                "BE" => Qos::BestEffort,
                _ => Qos::Burstable,
            },
            request: Resources { cpu_milli: self.cpu_milli, memory_bytes: self.memory_mib << 20, ..Default::default() },
            gpu: if self.num_gpu == 0 {
                GpuRequest::default()
            } else {
                GpuRequest {
                    count: self.num_gpu,
                    milli_per_gpu: self.gpu_milli,
                    models: self.gpu_spec.clone(),
                    ..Default::default()
                }
            },
            ..Default::default()
        }
    }
}

/// Where and why a row has the wrong number of fields: (column, reason).
type RowShape = (usize, String);

struct Csv<'a> {
    file: &'a str,
    header: Vec<&'a str>,
    /// Line number and fields, or the column and reason the line has the wrong shape.
    rows: Vec<(usize, Result<Vec<&'a str>, RowShape>)>,
}

impl<'a> Csv<'a> {
    fn parse(file: &'a str, text: &'a str) -> Result<Self, TraceError> {
        let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
        let Some((_, header)) = lines.next() else {
            return Err(malformed(file, 1, 1, "empty file: expected a header row"));
        };
        let header: Vec<&str> = header.split(',').map(str::trim).collect();
        let mut rows = Vec::new();
        for (i, line) in lines {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let row = if fields.len() == header.len() {
                Ok(fields)
            } else {
                Err((
                    fields.len().min(header.len()) + 1,
                    format!("{} fields, header has {}", fields.len(), header.len()),
                ))
            };
            rows.push((i + 1, row));
        }
        Ok(Csv { file, header, rows })
    }

    fn column(&self, name: &str) -> Result<usize, TraceError> {
        self.header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| malformed(self.file, 1, self.header.len() + 1, format!("missing column {name:?}")))
    }

    fn optional(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| *h == name)
    }

    fn number(&self, line: usize, fields: &[&str], col: usize) -> Result<u64, TraceError> {
        fields[col].parse::<u64>().map_err(|_| {
            malformed(
                self.file,
                line,
                col + 1,
                format!("{}: {:?} is not a non-negative integer", self.header[col], fields[col]),
            )
        })
    }
}

fn malformed(file: &str, line: usize, column: usize, message: impl Into<String>) -> TraceError {
    TraceError::Malformed { file: file.to_string(), line, column, message: message.into() }
}

fn read(path: &Path) -> Result<String, TraceError> {
    std::fs::read_to_string(path).map_err(|cause| TraceError::Io { file: path.display().to_string(), cause })
}

/// Parse an openb node list (`sn,cpu_milli,memory_mib,gpu,model`). `file` names it in errors.
pub fn parse_nodes(file: &str, text: &str) -> Result<Vec<Node>, TraceError> {
    let csv = Csv::parse(file, text)?;
    let (sn, cpu, mem, gpu, model) = (
        csv.column("sn")?,
        csv.column("cpu_milli")?,
        csv.column("memory_mib")?,
        csv.column("gpu")?,
        csv.column("model")?,
    );
    let mut nodes = Vec::with_capacity(csv.rows.len());
    for (line, f) in &csv.rows {
        let f = f.as_ref().map_err(|(col, why)| malformed(file, *line, *col, why.clone()))?;
        let gpus = csv.number(*line, f, gpu)?;
        if gpus > 64 {
            return Err(malformed(file, *line, gpu + 1, format!("{gpus} GPUs on one node is not plausible")));
        }
        if gpus > 0 && f[model].is_empty() {
            return Err(malformed(file, *line, model + 1, "GPU node without a model"));
        }
        let cpu_milli = csv.number(*line, f, cpu)?;
        let memory_mib = csv.number(*line, f, mem)?;
        let memory_bytes =
            memory_mib.checked_mul(1 << 20).ok_or_else(|| malformed(file, *line, mem + 1, "memory overflows"))?;
        nodes.push(gpu_node(f[sn], cpu_milli, memory_bytes, gpus as u32, f[model]));
    }
    Ok(nodes)
}

/// An idle node with `gpus` whole GPUs of `model`, labelled `gpu-model` (as openb nodes and
/// scenario nodes are).
pub fn gpu_node(name: &str, cpu_milli: u64, memory_bytes: u64, gpus: u32, model: &str) -> Node {
    Node {
        name: name.to_string(),
        labels: vec![("gpu-model".into(), model.to_string())],
        allocatable: Resources {
            cpu_milli,
            memory_bytes,
            gpu_milli: u64::from(gpus) * u64::from(GPU_MILLI),
            extended: Default::default(),
        },
        gpus: (0..gpus)
            .map(|index| GpuDevice { index, model: model.to_string(), free_milli: GPU_MILLI, ..Default::default() })
            .collect(),
        ..Default::default()
    }
}

/// Parse an openb pod list, in either column shape (the `multigpuNN` files carry only the first
/// five columns). Any malformed row is an error.
pub fn parse_pods(file: &str, text: &str) -> Result<Vec<TracePod>, TraceError> {
    parse_pods_lenient(file, text, false).map(|(pods, _)| pods)
}

/// Like [`parse_pods`], but with `lenient` a malformed row is skipped and returned with its error
/// instead of failing the file (a malformed header still fails it).
pub fn parse_pods_lenient(
    file: &str,
    text: &str,
    lenient: bool,
) -> Result<(Vec<TracePod>, Vec<TraceError>), TraceError> {
    let csv = Csv::parse(file, text)?;
    let (name, cpu, mem, num, milli) = (
        csv.column("name")?,
        csv.column("cpu_milli")?,
        csv.column("memory_mib")?,
        csv.column("num_gpu")?,
        csv.column("gpu_milli")?,
    );
    let (spec, qos, created, deleted) =
        (csv.optional("gpu_spec"), csv.optional("qos"), csv.optional("creation_time"), csv.optional("deletion_time"));
    let mut pods = Vec::with_capacity(csv.rows.len());
    let mut skipped = Vec::new();
    for (line, f) in &csv.rows {
        let row = || -> Result<TracePod, TraceError> {
            let f = f.as_ref().map_err(|(col, why)| malformed(file, *line, *col, why.clone()))?;
            let num_gpu = csv.number(*line, f, num)?;
            let gpu_milli = csv.number(*line, f, milli)?;
            if num_gpu > 64 {
                return Err(malformed(file, *line, num + 1, format!("{num_gpu} GPUs for one pod is not plausible")));
            }
            if gpu_milli > u64::from(GPU_MILLI) || (num_gpu > 1 && gpu_milli != u64::from(GPU_MILLI)) {
                return Err(malformed(
                    file,
                    *line,
                    milli + 1,
                    format!(
                        "gpu_milli {gpu_milli} with num_gpu {num_gpu}: shares are for single-GPU pods, at most 1000"
                    ),
                ));
            }
            if num_gpu > 0 && gpu_milli == 0 {
                return Err(malformed(file, *line, milli + 1, "GPU pod with gpu_milli 0"));
            }
            let time = |col: Option<usize>| -> Result<Option<u64>, TraceError> {
                match col {
                    Some(c) if !f[c].is_empty() => csv.number(*line, f, c).map(Some),
                    _ => Ok(None),
                }
            };
            Ok(TracePod {
                name: f[name].to_string(),
                cpu_milli: csv.number(*line, f, cpu)?,
                memory_mib: csv.number(*line, f, mem)?,
                num_gpu: num_gpu as u32,
                gpu_milli: gpu_milli as u32,
                gpu_spec: spec
                    .map(|c| f[c].split('|').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect())
                    .unwrap_or_default(),
                qos: qos.map(|c| f[c].to_string()).unwrap_or_default(),
                creation_time: time(created)?,
                deletion_time: time(deleted)?,
            })
        };
        match row() {
            Ok(pod) => pods.push(pod),
            Err(e) if lenient => skipped.push(e),
            Err(e) => return Err(e),
        }
    }
    Ok((pods, skipped))
}

/// Read and parse a node list.
pub fn load_nodes(path: &Path) -> Result<Vec<Node>, TraceError> {
    parse_nodes(&path.display().to_string(), &read(path)?)
}

/// Read and parse a pod list.
pub fn load_pods(path: &Path) -> Result<Vec<TracePod>, TraceError> {
    parse_pods(&path.display().to_string(), &read(path)?)
}

/// Read and parse a pod list, skipping malformed rows when `lenient` (see [`parse_pods_lenient`]).
pub fn load_pods_lenient(path: &Path, lenient: bool) -> Result<(Vec<TracePod>, Vec<TraceError>), TraceError> {
    parse_pods_lenient(&path.display().to_string(), &read(path)?, lenient)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_values_name_file_line_and_column() {
        let e =
            parse_pods("p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,500\nb,1,x,1,500\n").unwrap_err();
        assert_eq!(e.to_string(), "p.csv:3:3: memory_mib: \"x\" is not a non-negative integer");
        let e = parse_pods("p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,2,500\n").unwrap_err();
        assert!(e.to_string().starts_with("p.csv:2:5: gpu_milli 500 with num_gpu 2"), "{e}");
        let e = parse_pods("p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1\n").unwrap_err();
        assert!(e.to_string().starts_with("p.csv:2:4: 3 fields"), "{e}");
        let e = parse_nodes("n.csv", "sn,cpu_milli,gpu,model\nn,1,1,T4\n").unwrap_err();
        assert!(e.to_string().contains("missing column \"memory_mib\""), "{e}");
        assert!(parse_nodes("n.csv", "").is_err());
    }

    #[test]
    fn lenient_parsing_skips_and_reports_bad_rows() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,500\nb,1,x,1,500\nc,1\nd,2,2,0,0\n";
        assert!(parse_pods("p.csv", text).is_err());
        let (pods, skipped) = parse_pods_lenient("p.csv", text, true).unwrap();
        assert_eq!(pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["a", "d"]);
        let why: Vec<String> = skipped.iter().map(ToString::to_string).collect();
        assert_eq!(why.len(), 2);
        assert!(why[0].starts_with("p.csv:3:3:") && why[1].starts_with("p.csv:4:3: 2 fields"), "{why:?}");
        assert!(parse_pods_lenient("p.csv", "", true).is_err(), "a missing header is never skipped");
    }

    #[test]
    fn both_column_shapes_parse() {
        let full = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
                    p,1000,2048,1,460,V100M16|V100M32,LS,Running,5,,5\n";
        let p = &parse_pods("f.csv", full).unwrap()[0];
        assert_eq!(p.gpu_spec, vec!["V100M16", "V100M32"]);
        assert_eq!((p.creation_time, p.deletion_time), (Some(5), None));
        let t = p.to_task();
        assert_eq!((t.gpu.count, t.gpu.milli_per_gpu, t.request.memory_bytes), (1, 460, 2048 << 20));
        let short = parse_pods("s.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,0,0,8,1000\n").unwrap();
        assert_eq!(short[0].gpu_total_milli(), 8000);
    }
}
