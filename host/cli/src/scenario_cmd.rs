//! `wasmsched scenario`: a team's own cluster as a replay scenario — from the event stream it
//! recorded, or as it is now — so candidate policies are compared on its real work before a
//! rollout (`docs/hot-reload.md`). Both go through one conversion ([`history`]): a live snapshot
//! is the stream a scheduler would have published, cut at this instant.

use std::collections::{HashMap, HashSet};
use std::io::BufRead as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use wasmsched_events::schema::Payload;
use wasmsched_events::{Event, Kind, Timestamp};

use crate::history::{self, Window};

/// What `scenario` builds a scenario from.
#[derive(clap::Subcommand)]
pub enum Command {
    /// A recorded event stream (JSONL files, or the NATS JetStream stream): the nodes and queues
    /// as last described before the window, each job with its arrival, request and the run time
    /// it needed. What the stream does not say is listed as assumed.
    FromEvents(FromEventsArgs),
    /// The cluster as it is now (kubeconfig or in-cluster credentials): its nodes and queues, the
    /// pods running (arriving at 0, running to the end of the replay) and those waiting for this
    /// scheduler (arriving at 0, oldest first) — what a policy would do with today's backlog.
    FromCluster(FromClusterArgs),
}

/// Arguments of `scenario from-cluster`.
#[derive(clap::Args)]
pub struct FromClusterArgs {
    /// The scheduler whose pending pods are the backlog (`spec.schedulerName`).
    #[arg(long, default_value = "wasmsched")]
    scheduler_name: String,
    /// Write the scenario here (YAML when the name ends in `.yaml`/`.yml`, else JSON); default:
    /// JSON on standard output.
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    topology: TopologyArgs,
    #[command(flatten)]
    accelerators: crate::run_cmd::AcceleratorArgs,
}

/// The cluster's topology as the scenario should describe it: the stream and a snapshot carry the
/// nodes' labels, not which of them are levels (the scheduler's setting) nor what spanning costs.
#[derive(clap::Args, Default)]
pub struct TopologyArgs {
    /// The cluster's topology levels, as node labels, outermost first (comma-separated), as
    /// `wasmsched run --topology-levels` names them: the scenario's `levels`.
    #[arg(long, value_name = "LABELS", value_delimiter = ',')]
    topology_levels: Vec<String>,
    /// The level gangs should not span (a node label): the scenario's `fabric`, reported by the
    /// replay.
    #[arg(long, value_name = "LABEL")]
    fabric: Option<String>,
    /// With `--fabric`: how many times its duration a gang spanning its domains runs.
    #[arg(long, value_name = "FACTOR", default_value_t = 1.0, requires = "fabric")]
    spanning_slowdown: f64,
}

impl TopologyArgs {
    /// `h`'s scenario with these levels and fabric (the run times of gangs the stream shows
    /// spanning its domains divided by the slowdown: it slowed them already); a fabric that makes
    /// no sense is an error.
    fn apply(&self, h: &mut history::History) -> anyhow::Result<()> {
        if !self.topology_levels.is_empty() {
            h.scenario.levels = self.topology_levels.iter().rev().map(|l| l.trim().to_string()).collect();
        }
        if let Some(level) = &self.fabric {
            anyhow::ensure!(
                (1.0..=10.0).contains(&self.spanning_slowdown),
                "--spanning-slowdown {} is not between 1 and 10",
                self.spanning_slowdown
            );
            let n = h.unslow_spanning(level, self.spanning_slowdown);
            if n > 0 {
                h.assumptions.push(format!(
                    "{n} gangs ran across {level} domains: their measured run times are divided by {}, which the \
                     fabric adds back where the replay splits them",
                    self.spanning_slowdown
                ));
            }
            h.scenario.fabric =
                Some(wasmsched_sim::timed::Fabric { level: level.clone(), spanning_slowdown: self.spanning_slowdown });
        }
        Ok(())
    }
}

/// Arguments of `scenario from-events`.
#[derive(clap::Args)]
pub struct FromEventsArgs {
    /// A JSONL event file (repeatable: rotated files, several schedulers; an event in two of them
    /// counts once).
    #[arg(long, value_name = "FILE")]
    file: Vec<PathBuf>,
    #[command(flatten)]
    nats: crate::events_cmd::Nats,
    /// Window start, RFC 3339 (default: when recording began, the first event written): jobs
    /// arrive from here; runs going on at it, and work waiting at it, arrive at 0.
    #[arg(long, value_parser = Timestamp::parse)]
    from: Option<Timestamp>,
    /// Window end, RFC 3339 (default: the last event).
    #[arg(long, value_parser = Timestamp::parse)]
    to: Option<Timestamp>,
    /// Write the scenario here (YAML when the name ends in `.yaml`/`.yml`, else JSON); default:
    /// JSON on standard output.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Skip lines of the files that are not events (each is reported) instead of stopping.
    #[arg(long)]
    lenient: bool,
    #[command(flatten)]
    topology: TopologyArgs,
}

pub fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::FromEvents(args) => from_events(args),
        Command::FromCluster(args) => from_cluster(args),
    }
}

fn from_cluster(args: FromClusterArgs) -> anyhow::Result<()> {
    let accelerators = args.accelerators.table()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("tokio runtime")?;
    let snapshot = runtime.block_on(async {
        let clients = wasmsched_kube::Clients::infer(wasmsched_kube::ClientRate::default())
            .await
            .context("connecting to the Kubernetes API (kubeconfig or in-cluster)")?;
        anyhow::Ok(wasmsched_kube::snapshot::take(clients.api, &args.scheduler_name, &accelerators).await?)
    })?;
    let read = snapshot.events.len();
    let events = snapshot.events.into_iter().map(|e| (e.time, e.payload)).collect();
    let mut h = history::scenario(events, Window { from: Some(snapshot.taken), to: Some(snapshot.taken) });
    args.topology.apply(&mut h)?;
    let mut notes = snapshot.notes;
    let dra = match (snapshot.dra, args.out.as_ref()) {
        (Some(dra), Some(out)) if !dra.slices.is_empty() => Some(with_dra(&mut h, dra, out)?),
        (Some(dra), None) if !dra.slices.is_empty() => {
            notes.push("DRA objects: they go to a file beside --out, and none was given".into());
            None
        }
        _ => None,
    };
    write(&h, args.out.as_ref())?;
    summarise(&h, read, 0, 0, 0);
    if let Some(dra) = dra {
        eprintln!("{dra}");
    }
    for note in &notes {
        eprintln!("left out: {note}");
    }
    Ok(())
}

/// The snapshot's DRA objects into a file beside `out` that `h`'s scenario names, and its
/// waiting jobs' claims into their jobs (the stream flags claims, a snapshot has them). What was
/// written, in a line.
fn with_dra(
    h: &mut history::History,
    dra: wasmsched_kube::snapshot::DraSnapshot,
    out: &Path,
) -> anyhow::Result<String> {
    let stem = out.file_stem().and_then(|s| s.to_str()).unwrap_or("scenario");
    let name = format!("{stem}.dra.yaml");
    let path = out.with_file_name(&name);
    let mut documents = Vec::new();
    for class in &dra.classes {
        documents.push(serde_yaml_ng::to_string(class)?);
    }
    for slice in &dra.slices {
        documents.push(serde_yaml_ng::to_string(slice)?);
    }
    for claim in &dra.allocated {
        documents.push(serde_yaml_ng::to_string(claim)?);
    }
    std::fs::write(&path, documents.join("---\n")).with_context(|| format!("writing {}", path.display()))?;
    let mut asking = 0;
    for job in &mut h.scenario.jobs {
        let members = h.members.get(&job.name).map(Vec::as_slice).unwrap_or_default();
        if let Some(specs) = members.iter().find_map(|id| dra.pending.get(id)) {
            job.claims = specs.clone();
            asking += 1;
        }
    }
    // What the stream could not carry, the snapshot has.
    h.assumptions.retain(|a| !a.ends_with(history::CLAIMS_NOT_CARRIED));
    h.scenario.dra = Some(wasmsched_sim::timed::DraConfig { objects: vec![name] });
    Ok(format!(
        "dra: {} DeviceClasses, {} ResourceSlices and {} allocated ResourceClaims (their devices held throughout) in {}; \
         {asking} waiting jobs ask for their pods' claims",
        dra.classes.len(),
        dra.slices.len(),
        dra.allocated.len(),
        path.display()
    ))
}

/// Write the scenario of `h` to `out` (YAML for `.yaml`/`.yml`, else JSON), or JSON to standard
/// output.
fn write(h: &history::History, out: Option<&PathBuf>) -> anyhow::Result<()> {
    let path = out.map(|p| p.display().to_string()).unwrap_or_default();
    let compact = history::compact(&h.scenario)?;
    let body = if path.ends_with(".yaml") || path.ends_with(".yml") {
        serde_yaml_ng::to_string(&compact)?
    } else {
        serde_json::to_string_pretty(&compact)? + "\n"
    };
    match out {
        Some(path) => std::fs::write(path, body).with_context(|| format!("writing {}", path.display()))?,
        None => print!("{body}"),
    }
    Ok(())
}

/// What was built, from how much, and what it assumed (standard error).
fn summarise(h: &history::History, read: usize, not_used: usize, unknown: usize, malformed: usize) {
    let s = &h.scenario;
    eprintln!(
        "{} nodes, {} queues, {} jobs from {read} events ({not_used} of other kinds not used)",
        s.nodes.len(),
        s.queues.len(),
        s.jobs.len(),
    );
    if malformed > 0 {
        eprintln!("skipped: {malformed} lines that are not events (WASMSCHED_LOG=warn names them)");
    }
    if unknown > 0 {
        eprintln!("skipped: {unknown} events of types this version does not know");
    }
    for a in &h.assumptions {
        eprintln!("assumed: {a}");
    }
}

fn from_events(args: FromEventsArgs) -> anyhow::Result<()> {
    if let (Some(from), Some(to)) = (args.from, args.to) {
        anyhow::ensure!(from <= to, "--from {from} is after --to {to}");
    }
    let read = read_events(&args)?;
    anyhow::ensure!(read.read > 0, "no events to build a scenario from");
    let mut h = history::scenario(read.events, Window { from: args.from.or(read.began), to: args.to });
    args.topology.apply(&mut h)?;
    write(&h, args.out.as_ref())?;
    summarise(&h, read.read, read.not_used, read.unknown, read.malformed);
    Ok(())
}

/// What a stream gave: the events the conversion uses (a task's later failed attempts dropped),
/// and counts of the rest.
#[derive(Default)]
struct Read {
    events: Vec<(Timestamp, Payload)>,
    /// Events read (each id once).
    read: usize,
    /// Of kinds the conversion does not use (policy, shares, alerts, …).
    not_used: usize,
    /// Of types this version does not know (a newer scheduler's).
    unknown: usize,
    /// With `--lenient`: lines that were not events.
    malformed: usize,
    /// Tasks whose first failed attempt was kept.
    attempted: HashSet<(String, String)>,
    /// When recording began: the earliest first event of a file (or of the NATS stream), in the
    /// order it was written. Not the earliest stamp: a scheduler that starts stamps the pods it
    /// finds with their creation, hours before it started recording.
    began: Option<Timestamp>,
}

impl Read {
    /// The first event of a file or stream was stamped `at`.
    fn first_at(&mut self, at: Timestamp) {
        self.began = Some(self.began.map_or(at, |b| b.min(at)));
    }

    /// Keep `event` if the conversion uses it.
    fn keep(&mut self, event: Event) {
        if self.read == 0 {
            self.first_at(event.time);
        }
        self.read += 1;
        if let Payload::TaskUnschedulable(u) = &event.payload
            && !self.attempted.insert((u.task.namespace.clone(), u.task.id.clone()))
        {
            return;
        }
        match history::slim(event.payload) {
            Some(payload) => self.events.push((event.time, payload)),
            None => self.not_used += 1,
        }
    }
}

/// The envelope's identity and type, read before the rest: most of a stream is of kinds the
/// conversion skips or keeps once per task.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
}

/// An event's stamp alone.
#[derive(serde::Deserialize)]
struct When {
    time: Timestamp,
}

/// What one line of a file is.
enum Line {
    /// An event the conversion uses.
    Used(Box<Event>),
    /// An event of a kind it does not use.
    NotUsed,
    /// An event of a type this version does not know.
    Unknown,
    /// An event read before (same id).
    Again,
}

/// Every event of the files (an id seen twice counts once), or of the NATS stream. A line of an
/// event type this version does not know is counted and skipped (a newer scheduler's stream);
/// a line that is not an event stops the command, or with `--lenient` is reported and skipped.
fn read_events(args: &FromEventsArgs) -> anyhow::Result<Read> {
    let mut read = Read::default();
    if let Some(config) = args.nats.config()? {
        anyhow::ensure!(args.file.is_empty(), "give --file or --nats, not both");
        let filter = wasmsched_events::Filter::default();
        let options = wasmsched_events::TailOptions { from_start: true, follow: false };
        wasmsched_events::tail(&config, &filter, &options, |e| {
            read.keep(e);
            true
        })?;
        return Ok(read);
    }
    anyhow::ensure!(!args.file.is_empty(), "give --file FILE (repeatable) or --nats URL");
    let kinds: HashMap<&str, Kind> = Kind::ALL.iter().map(|k| (k.event_type(), *k)).collect();
    let mut seen: HashSet<String> = HashSet::new();
    for path in &args.file {
        let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut first = true;
        for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line.with_context(|| format!("reading {}", path.display()))?;
            if line.trim().is_empty() {
                continue;
            }
            let bad = |e: &dyn std::fmt::Display| format!("{}:{}: not an event: {e}", path.display(), n + 1);
            if std::mem::take(&mut first)
                && let Ok(at) = serde_json::from_str::<When>(&line)
            {
                read.first_at(at.time);
            }
            let parsed = serde_json::from_str::<Head<'_>>(&line).map_err(|e| bad(&e)).and_then(|head| {
                match kinds.get(head.kind.as_ref()) {
                    None => Ok(Line::Unknown),
                    Some(_) if !seen.insert(head.id.into_owned()) => Ok(Line::Again),
                    // Checked as an event all the same: a malformed line is one.
                    Some(kind) if !history::USED.contains(kind) => {
                        serde_json::from_str::<Event>(&line).map(|_| Line::NotUsed).map_err(|e| bad(&e))
                    }
                    Some(_) => {
                        serde_json::from_str::<Event>(&line).map(|e| Line::Used(Box::new(e))).map_err(|e| bad(&e))
                    }
                }
            });
            match parsed {
                Ok(Line::Used(e)) => read.keep(*e),
                Ok(Line::NotUsed) => {
                    read.read += 1;
                    read.not_used += 1;
                }
                Ok(Line::Unknown) => read.unknown += 1,
                Ok(Line::Again) => {}
                Err(why) if args.lenient => {
                    read.malformed += 1;
                    tracing::warn!("skipped: {why}");
                }
                Err(why) => anyhow::bail!("{why} (--lenient skips such lines)"),
            }
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot's DRA objects go to a file beside the scenario, which names it; a waiting job
    /// gets its pod's claims; the scenario loads with them and holds what allocated claims hold.
    #[test]
    fn a_snapshot_s_dra_objects_and_pending_claims_make_a_scenario_that_loads_with_them() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut objects = wasmsched_dra::Objects::default();
        objects.read(&root.join("examples/dra/cluster.yaml")).unwrap();
        let allocated: Vec<_> = objects
            .claims
            .iter()
            .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
            .cloned()
            .collect();
        assert!(!allocated.is_empty(), "the example holds six GPUs with an allocated claim");
        let example = wasmsched_sim::timed::Scenario::parse(
            "dra.yaml",
            &std::fs::read_to_string(root.join("examples/scenarios/dra.yaml")).unwrap(),
        )
        .unwrap();
        let finetune = example.jobs.iter().find(|j| j.name == "finetune").unwrap();
        let dra = wasmsched_kube::snapshot::DraSnapshot {
            slices: objects.slices.clone(),
            classes: objects.classes.clone(),
            allocated: allocated.clone(),
            pending: [("ml/waits".to_string(), finetune.claims.clone())].into(),
        };
        let job = wasmsched_sim::timed::Job {
            name: "ml/waits".into(),
            queue: "research".into(),
            cpu_milli: 1000,
            ..Default::default()
        };
        let mut h = history::History {
            scenario: wasmsched_sim::timed::Scenario {
                nodes: example.nodes.clone(),
                flavors: Vec::new(),
                queues: example.queues.clone(),
                jobs: vec![job],
                dra: None,
                levels: Vec::new(),
                fabric: None,
            },
            assumptions: vec![format!("1 {}", history::CLAIMS_NOT_CARRIED)],
            members: [("ml/waits".to_string(), vec!["ml/waits".to_string()])].into(),
            started_on: Default::default(),
        };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("now.yaml");
        let said = with_dra(&mut h, dra, &out).unwrap();
        assert!(said.contains("1 allocated ResourceClaims") && said.contains("1 waiting jobs"), "{said}");
        assert!(h.assumptions.is_empty(), "the snapshot carries what the stream flags: {:?}", h.assumptions);
        write(&h, Some(&out)).unwrap();
        let loaded = wasmsched_sim::timed::Scenario::load_lenient(&out, false).unwrap();
        assert_eq!(loaded.scenario.dra.as_ref().map(|d| d.objects.clone()), Some(vec!["now.dra.yaml".to_string()]));
        assert_eq!(loaded.scenario.jobs[0].claims, finetune.claims);
        let read = loaded.dra.expect("the objects file is read with the scenario");
        assert_eq!((read.slices.len(), read.classes.len()), (objects.slices.len(), objects.classes.len()));
        assert_eq!(read.claims, allocated);
    }
}
