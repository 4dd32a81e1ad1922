//! `wasmsched cluster-bench`: how fast a scheduler places pods through a real API server, next to
//! what the server itself can bind.
//!
//! A run makes fake GPU nodes (Ready, GPUs in their status, no kubelet), creates pods for one
//! `schedulerName` — a batch waiting before the scheduler starts, a burst, or a fixed rate — and
//! watches them until each is bound: pods/s, creation → bound latency (client clocks), the API
//! server's requests per pod by verb (its own `/metrics`, less this tool's requests), its CPU, and
//! the scheduler's CPU and memory when it runs on this machine. With [`BinderConfig`] the tool
//! itself binds the pods, round-robin and without scheduling, as many in flight as a scheduler
//! would: the API server's ceiling for that load.
//!
//! The steps of a run, in order: [`setup`] (namespace, nodes, priority classes, gangs), [`watch`]
//! (bound times; finishes terminations as a kubelet would), [`under_test`] (the scheduler, started
//! by the run or already running, or the [`binder`]), [`create`] (the measured pods), then the
//! report and the clean-up.

pub mod binder;
pub mod create;
pub mod measure;
pub mod objects;
pub mod report;
pub mod setup;
pub mod under_test;
pub mod watch;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use kube::Client;

pub use binder::BinderConfig;
pub use objects::{Mix, Workload};
pub use report::Report;
pub use under_test::UnderTest;

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// The `schedulerName` of every pod (with a binder: a name no scheduler serves).
    pub scheduler_name: String,
    /// Who binds them.
    pub under_test: UnderTest,
    /// Where the pods go (created if missing, kept after the run).
    pub namespace: String,
    /// Fake nodes (kept between runs unless asked; extra ones from a larger run are removed).
    pub nodes: usize,
    /// GPUs on each fake node.
    pub gpus_per_node: u32,
    /// Measured pods.
    pub pods: usize,
    /// Whole GPUs each pod asks.
    pub gpus_per_pod: u32,
    /// How the measured pods arrive.
    pub arrival: Arrival,
    /// The measured pods' shapes.
    pub workload: Mix,
    /// Requests in flight while creating nodes and pods.
    pub create_in_flight: usize,
    /// How long a scheduler the run starts gets before pods arrive (its lists and watches);
    /// none for a batch, whose clock starts with the scheduler.
    pub warm_up: Duration,
    /// The longest wait for every measured pod to be bound.
    pub timeout: Duration,
    /// A wait after the last bind before the API server's counters are read (events and status
    /// writes that trail the binds are part of a pod's cost).
    pub settle: Duration,
    /// Delete the fake nodes at the end.
    pub delete_nodes: bool,
    /// Each measured pod ends (is deleted) this long after it was seen bound: with a rate, a
    /// steady churn of arrivals and departures (a soak).
    pub lifetime: Option<Duration>,
    /// Sample the scheduler's memory, open files and CPU, and the pods bound, this often.
    pub sample_every: Option<Duration>,
}

/// How the measured pods arrive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrival {
    /// All created before the scheduler starts (it must be one the run starts); the clock
    /// starts with it, as for a scheduler restarted in front of a backlog.
    Batch,
    /// All created at once while the scheduler runs (as many in flight as `create_in_flight`).
    Burst,
    /// This many per second, while the scheduler runs.
    Rate(f64),
}

impl std::fmt::Display for Arrival {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arrival::Batch => f.write_str("batch"),
            Arrival::Burst => f.write_str("burst"),
            Arrival::Rate(r) => write!(f, "{r}/s"),
        }
    }
}

/// Why a run could not be made or measured.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request the run needs.
    #[error("{what}: {source}")]
    Api {
        /// What the run was doing.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The settings cannot make a run.
    #[error("invalid settings: {0}")]
    Settings(String),
    /// The scheduler's command could not be started.
    #[error("starting the scheduler ({line}): {source}")]
    Start {
        /// The command line.
        line: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The scheduler the run started exited before the run's end.
    #[error("the scheduler exited ({status}) before its pods were bound; see its log")]
    SchedulerExited {
        /// Its exit status.
        status: std::process::ExitStatus,
    },
    /// The scheduler's process could not be read.
    #[error("scheduler process {pid}: {source}")]
    Process {
        /// The scheduler's PID.
        pid: u32,
        /// What reading `/proc` said.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Api { what, source }
    }
}

/// This tool's own requests during the measured window, by `"VERB resource"` as the API server
/// counts them, so the scheduler's share is what the server counted less these.
#[derive(Clone, Debug, Default)]
pub struct OwnRequests(Arc<Mutex<BTreeMap<String, f64>>>);

impl OwnRequests {
    /// Counts one request.
    pub fn count(&self, kind: &str) {
        *self.0.lock().unwrap().entry(kind.to_string()).or_default() += 1.0;
    }

    /// Everything counted so far.
    pub fn snapshot(&self) -> BTreeMap<String, f64> {
        self.0.lock().unwrap().clone()
    }
}

/// Runs the benchmark `config` describes against the cluster `client` reaches.
pub async fn run(client: Client, config: &Config) -> Result<Report, Error> {
    validate(config)?;
    let run_id = run_id();
    let shape = objects::PodShape {
        run: &run_id,
        scheduler: &config.scheduler_name,
        gpus: config.gpus_per_pod,
        workload: &config.workload,
        nodes: config.nodes,
    };
    tracing::info!(run = %run_id, nodes = config.nodes, pods = config.pods, workload = %config.workload.name(),
                   scheduler = %config.scheduler_name, "cluster-bench run starting");
    setup::namespace(&client, &config.namespace).await?;
    // A DRA run's GPUs are its nodes' ResourceSlices only: none as an extended resource too.
    let extended_gpus = if config.workload.has_dra() { 0 } else { config.gpus_per_node };
    setup::nodes(&client, config.nodes, extended_gpus, config.create_in_flight).await?;
    setup::workload(&client, config, &shape).await?;

    let own = OwnRequests::default();
    let duties = watch::Duties {
        gpus_per_node: config.gpus_per_node,
        lifetime: config.lifetime,
        // Under churn a preempted filler is replaced, as its ReplicaSet would, so the cluster
        // stays full and every arrival keeps preempting.
        refill: (config.workload.preempts() && config.lifetime.is_some()).then(|| shape.filler(0)),
    };
    let watch = watch::Watch::start(client.clone(), &config.namespace, &run_id, own.clone(), duties);
    watch.wait_listed().await;
    let mut scheduler = None;
    let outcome = measured(&client, config, &shape, &watch, &own, &mut scheduler).await;
    watch.stop();
    if let Some(s) = scheduler {
        s.stop();
    }
    if let Err(e) = setup::clean_up(&client, config, &run_id).await {
        tracing::warn!(error = %e, "clean-up after the run failed; delete the run's pods by label {}={run_id}", objects::RUN_LABEL);
    }
    outcome
}

/// The measured part: the scheduler started (after the pods for a batch), fillers first for a
/// preemption run, then the samples, the pods, the wait.
async fn measured(
    client: &Client,
    config: &Config,
    shape: &objects::PodShape<'_>,
    watch: &watch::Watch,
    own: &OwnRequests,
    scheduler: &mut Option<under_test::Started>,
) -> Result<Report, Error> {
    if config.arrival != Arrival::Batch {
        *scheduler = Some(under_test::Started::start(client, config)?);
        if config.under_test.started_by_the_run() {
            tokio::time::sleep(config.warm_up).await;
        }
    }
    if config.workload.preempts() {
        let fillers = setup::fillers_to_fill(config);
        create::all(client, config, fillers, Arrival::Burst, |i| shape.filler(i), &OwnRequests::default()).await?;
        let filled = watch.wait_fillers(fillers, config.timeout).await;
        if filled < fillers {
            return Err(Error::Settings(format!(
                "only {filled} of {fillers} filler pods were bound within the timeout: is a scheduler serving {:?}?",
                config.scheduler_name
            )));
        }
    }
    let tool_before = measure::ProcessSample::read(std::process::id()).ok();
    let server_before = report::server_sample(client).await;
    let mut process_before = process_sample(scheduler.as_ref())?;
    let mut started = Instant::now();
    let pid = scheduler.as_ref().and_then(under_test::Started::pid);
    // A batch's clock (and its samples) start with the scheduler, after the pods.
    let mut sampler = config
        .sample_every
        .filter(|_| config.arrival != Arrival::Batch)
        .map(|every| Sampler::start(every, pid, watch.counts()));
    let created = create::all(client, config, config.pods, config.arrival, |i| shape.measured(i), own).await?;
    if config.arrival == Arrival::Batch {
        let s = scheduler.insert(under_test::Started::start(client, config)?);
        started = Instant::now();
        process_before = process_sample(Some(s))?;
        sampler = config.sample_every.map(|every| Sampler::start(every, s.pid(), watch.counts()));
    }
    let deadline = started + config.timeout;
    // Woken at least once a second to notice a started scheduler that exited.
    loop {
        let bound = watch.wait_measured(config.pods, deadline.min(Instant::now() + Duration::from_secs(1))).await;
        if let Some(status) = scheduler.as_mut().and_then(under_test::Started::exited) {
            return Err(Error::SchedulerExited { status });
        }
        if bound >= config.pods || Instant::now() >= deadline {
            break;
        }
    }
    let bound = watch.bound_times();
    tokio::time::sleep(config.settle).await;
    let devices_allocated_twice = match config.workload.has_dra() {
        true => setup::devices_allocated_twice(client, config, shape.run).await?,
        false => 0,
    };
    let series = sampler.map(Sampler::stop).unwrap_or_default();
    let server_after = report::server_sample(client).await;
    let process_after = process_sample(scheduler.as_ref())?;
    let tool_after = measure::ProcessSample::read(std::process::id()).ok();
    Ok(Report::new(
        config,
        report::Samples {
            started,
            created: &created,
            bound: &bound,
            names: &|i| shape.name(i),
            server: server_before.zip(server_after),
            process: process_before.zip(process_after),
            tool: tool_before.zip(tool_after),
            own: own.snapshot(),
            evicted: watch.finished_terminations(),
            overcommit: watch.overcommit(),
            devices_allocated_twice,
            ended: watch.counts().now().1,
            refilled: watch.refilled(),
            history: watch.history(),
            series,
        },
    ))
}

/// Samples the scheduler's process and the run's pods on a timer, beside the run.
struct Sampler {
    task: tokio::task::JoinHandle<()>,
    series: Arc<Mutex<Vec<report::Sample>>>,
}

impl Sampler {
    fn start(every: Duration, pid: Option<u32>, counts: watch::Counts) -> Sampler {
        let series = Arc::new(Mutex::new(Vec::new()));
        let out = series.clone();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            loop {
                ticks.tick().await;
                let process = pid.and_then(|p| measure::ProcessSample::read(p).ok());
                let (alive, ended) = counts.now();
                out.lock().unwrap().push(report::Sample {
                    seconds: started.elapsed().as_secs_f64(),
                    rss_mib: process.map(|p| p.rss_bytes as f64 / (1024.0 * 1024.0)),
                    open_fds: pid.and_then(|p| measure::open_fds(p).ok()),
                    cpu_seconds: process.map(|p| p.cpu_seconds),
                    alive,
                    ended,
                });
            }
        });
        Sampler { task, series }
    }

    fn stop(self) -> Vec<report::Sample> {
        self.task.abort();
        std::mem::take(&mut self.series.lock().unwrap())
    }
}

fn process_sample(scheduler: Option<&under_test::Started>) -> Result<Option<measure::ProcessSample>, Error> {
    scheduler
        .and_then(under_test::Started::pid)
        .map(|pid| measure::ProcessSample::read(pid).map_err(|source| Error::Process { pid, source }))
        .transpose()
}

fn validate(config: &Config) -> Result<(), Error> {
    let bad = |why: &str| Err(Error::Settings(why.to_string()));
    if config.nodes == 0 || config.pods == 0 {
        return bad("at least one node and one pod");
    }
    if config.gpus_per_pod > config.gpus_per_node {
        return bad("a pod asks more GPUs than a node has");
    }
    if let Arrival::Rate(rate) = config.arrival
        && !(rate.is_finite() && rate > 0.0)
    {
        return bad("the rate is a positive number of pods per second");
    }
    if config.arrival == Arrival::Batch && !config.under_test.started_by_the_run() {
        return bad("a batch waits for a scheduler the run starts: give its command line, or use the binder");
    }
    if config.arrival == Arrival::Batch && config.workload.preempts() {
        return bad("a preemption run fills the cluster with the scheduler running: a burst or a rate");
    }
    if config.create_in_flight == 0 {
        return bad("at least one creation in flight");
    }
    if config.workload.has_gangs() && !config.pods.is_multiple_of(config.workload.round()) {
        return bad("the pods are a whole number of gangs (of rounds of the mix, with gangs in it)");
    }
    if config.workload.has_dra() && config.workload.workloads().len() > 1 {
        return bad("dra does not mix: its nodes publish their GPUs as ResourceSlices only");
    }
    if config.workload.has_dra() && config.lifetime.is_some() {
        return bad("dra runs without churn: no controller here releases an ended pod's claim");
    }
    if config.workload.preempts() && config.gpus_per_pod == 0 {
        return bad("a preemption run's pods ask GPUs");
    }
    if let UnderTest::Binder(b) = &config.under_test
        && b.in_flight == 0
    {
        return bad("the binder needs at least one bind in flight");
    }
    Ok(())
}

/// A name for this run's objects, distinct between runs (milliseconds since the epoch, base 36).
fn run_id() -> String {
    let mut ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
    let mut id = Vec::new();
    while ms > 0 {
        id.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(ms % 36) as usize]);
        ms /= 36;
    }
    id.reverse();
    format!("b{}", String::from_utf8(id).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config {
            scheduler_name: "wasmsched".into(),
            namespace: "bench".into(),
            nodes: 4,
            gpus_per_node: 8,
            pods: 16,
            gpus_per_pod: 1,
            under_test: UnderTest::Running { pid: None },
            arrival: Arrival::Burst,
            workload: Workload::Plain.into(),
            create_in_flight: 8,
            warm_up: Duration::ZERO,
            timeout: Duration::from_secs(5),
            settle: Duration::ZERO,
            delete_nodes: false,
            lifetime: None,
            sample_every: None,
        }
    }

    #[test]
    fn settings_that_cannot_make_a_run_are_refused_with_the_reason() {
        assert!(validate(&config()).is_ok());
        let why = |c: Config| validate(&c).unwrap_err().to_string();
        assert!(why(Config { pods: 0, ..config() }).contains("one pod"));
        assert!(why(Config { gpus_per_pod: 9, ..config() }).contains("more GPUs than a node"));
        assert!(why(Config { arrival: Arrival::Rate(0.0), ..config() }).contains("positive"));
        assert!(why(Config { arrival: Arrival::Rate(f64::NAN), ..config() }).contains("positive"));
        assert!(why(Config { arrival: Arrival::Batch, ..config() }).contains("a scheduler the run starts"));
        let binder = UnderTest::Binder(BinderConfig { in_flight: 1, events: false });
        let batch_preempt =
            Config { arrival: Arrival::Batch, workload: Workload::Preempt.into(), under_test: binder, ..config() };
        assert!(why(batch_preempt).contains("a burst or a rate"));
        assert!(why(Config { workload: Workload::Gang(5).into(), ..config() }).contains("whole number of gangs"));
        let mix = Mix::parse("plain,gang:4").unwrap();
        assert!(why(Config { workload: mix.clone(), pods: 16, ..config() }).contains("rounds of the mix"));
        assert!(validate(&Config { workload: mix, pods: 15, ..config() }).is_ok());
        assert!(why(Config { workload: Workload::Preempt.into(), gpus_per_pod: 0, ..config() }).contains("ask GPUs"));
        assert!(why(Config { workload: Mix::parse("dra,plain").unwrap(), ..config() }).contains("does not mix"));
        let churn = Some(Duration::from_secs(1));
        assert!(why(Config { workload: Workload::Dra.into(), lifetime: churn, ..config() }).contains("without churn"));
        let under_test = UnderTest::Binder(BinderConfig { in_flight: 0, events: false });
        assert!(why(Config { under_test, ..config() }).contains("one bind in flight"));
    }

    #[test]
    fn run_ids_are_dns_labels() {
        let id = run_id();
        assert!(id.len() > 4 && id.len() < 20, "{id}");
        assert!(id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()), "{id}");
    }
}
