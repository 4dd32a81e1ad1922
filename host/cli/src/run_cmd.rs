//! `wasmsched run`: schedule a Kubernetes cluster's pods that name this scheduler; `wasmsched extender`:
//! the same policy set behind kube-scheduler's extender protocol.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use wasmsched_kube::extender::Extender;
use wasmsched_kube::leader::LeaseConfig;
use wasmsched_kube::metrics::{self, Metrics};
use wasmsched_kube::policy_source::PolicyObjectSource;
use wasmsched_kube::{ClientRate, Clients, Scheduler, SchedulerConfig, policy};
use wasmsched_registry::{DirSource, Fetched, ObjectStoreSource, Preparer, Source, Watcher};
use wasmsched_runtime::Runtime;

/// `wasmsched run` arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Pods whose `spec.schedulerName` is this are scheduled.
    #[arg(long, default_value = "wasmsched", env = "WASMSCHED_SCHEDULER_NAME")]
    scheduler_name: String,
    /// A policy set directory (`policy.yaml` and components; a mounted ConfigMap), watched for new
    /// versions. Without it the built-in default set runs.
    #[arg(long, env = "WASMSCHED_POLICY_DIR")]
    policy: Option<PathBuf>,
    /// Follow this cluster-scoped `SchedulingPolicy` object too: a new version applied to it goes
    /// through the same gates, and the outcome is written to its status. Its components come from
    /// ConfigMaps in the scheduler's namespace (`--lease-namespace`).
    #[arg(long, env = "WASMSCHED_POLICY_OBJECT")]
    policy_object: Option<String>,
    /// Follow this NATS object store bucket too (on the `--nats` server): its spec object and the
    /// components it names as `object:NAME`, stored there with `wasmsched policy push`. For
    /// components past a ConfigMap's 1 MiB: Python and JavaScript policies carry their
    /// interpreter (13–20 MB). A poll reads a component again only after it is pushed again.
    #[arg(long, env = "WASMSCHED_POLICY_BUCKET")]
    policy_bucket: Option<String>,
    /// The spec's object name in `--policy-bucket`.
    #[arg(long, default_value = "policy.yaml")]
    policy_spec_object: String,
    /// How often the policy directory, object and bucket are checked.
    #[arg(long, default_value_t = 2.0)]
    policy_poll_seconds: f64,
    /// Stage each new policy version until its plugins' node mirrors caught up with the cluster,
    /// at most this many changes per plugin instance before each cycle, so no decision pays a
    /// whole catch-up; 0 (the default) swaps at once (new versions are caught up off the loop
    /// anyway, and unchanged plugins are kept).
    #[arg(long, default_value_t = 0, env = "WASMSCHED_POLICY_WARM_UP")]
    policy_warm_up: usize,
    /// Run for leader on a Lease so several replicas run with one active.
    #[arg(long)]
    leader_elect: bool,
    /// The scheduler's namespace (the pod's in a cluster): the Lease's and the policy ConfigMaps'.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    lease_namespace: String,
    /// The Lease's name.
    #[arg(long, default_value = "wasmsched")]
    lease_name: String,
    /// This replica's identity in the Lease (the pod name in a cluster).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(long, default_value = "0.0.0.0:10259", env = "WASMSCHED_METRICS_ADDR")]
    metrics_addr: SocketAddr,
    /// Binds in flight at most.
    #[arg(long, default_value_t = 16)]
    bind_concurrency: usize,
    /// A run another queue reclaims must have run this long (s), so a placement just made is never
    /// taken back and queues cannot trade capacity back and forth; 0 reclaims any run. A Queue's
    /// `reclaimMinRuntimeSeconds` overrides it for its runs.
    #[arg(long, value_name = "SECONDS", default_value_t = wasmsched_core::CoreConfig::default().reclaim_min_runtime_seconds, env = "WASMSCHED_RECLAIM_MIN_RUNTIME")]
    reclaim_min_runtime: u64,
    /// A reclaim may throw away at most K times the GPU-time its queue has been short of its
    /// deserved share while it waited since it last had its share (docs/scheduling.md). The flag
    /// alone is K = 1; 0: no such limit.
    #[arg(long, value_name = "K", num_args = 0..=1, default_value_t = 0, default_missing_value = "1", env = "WASMSCHED_RECLAIM_WITHIN_DEFICIT")]
    reclaim_within_deficit: u32,
    /// A run that has gone on longer than this (s) is never reclaimed: the work it would throw
    /// away grows with its age, the room it frees does not; a queue reclaiming within its guarantee is not
    /// limited (docs/scheduling.md). A Queue's `reclaimMaxRuntimeSeconds` overrides it; 0: no limit.
    #[arg(long, value_name = "SECONDS", default_value_t = wasmsched_core::CoreConfig::default().reclaim_max_runtime_seconds, env = "WASMSCHED_RECLAIM_MAX_RUNTIME")]
    reclaim_max_runtime: u64,
    /// Requests per second to the API server (kube-scheduler's `clientConnection.qps`); 0: no
    /// limit. The Lease has a client of its own, outside this limit.
    #[arg(long, default_value_t = 50.0)]
    kube_api_qps: f64,
    /// Requests that may go at once after a quiet spell (`clientConnection.burst`).
    #[arg(long, default_value_t = 100)]
    kube_api_burst: u32,
    /// Serve the read-only dashboard on this address (e.g. `127.0.0.1:8080`; loopback unless you
    /// mean it): the cluster, queues, waiting work and the live policy set, refreshed every second.
    #[arg(long, value_name = "ADDR", env = "WASMSCHED_DASHBOARD_ADDR")]
    dashboard: Option<SocketAddr>,
    /// Owner kinds whose pods are gangs without a PodGroup, added to (or replacing, by group and
    /// kind) the built-in Job, JobSet, training-job, RayCluster and LeaderWorkerSet entries: a
    /// YAML list as in docs/kubernetes.md. An entry with `disabled: true` removes a built-in one.
    #[arg(long, value_name = "FILE", env = "WASMSCHED_OWNER_KINDS")]
    owner_kinds: Option<PathBuf>,
    /// The cluster's topology levels, as node labels, outermost first (comma-separated): where a
    /// gang preferring one level (Kueue's `podset-preferred-topology`) falls back to, one level up
    /// at a time. Default: zone, `wasmsched.io/spine`, `wasmsched.io/rack`, `nvidia.com/gpu.clique`.
    #[arg(long, value_name = "LABELS", value_delimiter = ',', env = "WASMSCHED_TOPOLOGY_LEVELS")]
    topology_levels: Vec<String>,
    /// How long (s) a gang that only prefers a level waits for one domain of it before it falls
    /// back, unless its pods set `scheduling.wasmsched.io/topology-wait-seconds` (0: at once, as
    /// Kueue does).
    #[arg(long, value_name = "SECONDS", default_value_t = 0, env = "WASMSCHED_TOPOLOGY_WAIT")]
    topology_wait: u64,
    #[command(flatten)]
    accelerators: AcceleratorArgs,
    #[command(flatten)]
    sink: wasmsched_events::cli::Sink,
}

/// Which device-plugin resources are accelerators, shared by every command that reads a cluster.
#[derive(clap::Args)]
pub struct AcceleratorArgs {
    /// Accelerator kinds added to (or replacing, by name) the built-in NVIDIA, AMD, Gaudi, Ascend
    /// and Neuron entries: a YAML list as in docs/accelerators/README.md. An entry with
    /// `disabled: true` removes a built-in one.
    #[arg(long, value_name = "FILE", env = "WASMSCHED_ACCELERATOR_KINDS")]
    accelerator_kinds: Option<PathBuf>,
}

impl AcceleratorArgs {
    /// The table: the built-in entries with the file's applied.
    pub fn table(&self) -> anyhow::Result<Arc<wasmsched_kube::accelerators::AcceleratorTable>> {
        use wasmsched_kube::accelerators;
        let mut kinds = accelerators::builtin();
        if let Some(path) = &self.accelerator_kinds {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let extra = accelerators::parse(&text).with_context(|| format!("in {}", path.display()))?;
            kinds = accelerators::merged(kinds, extra);
        }
        Ok(Arc::new(accelerators::AcceleratorTable::new(kinds).context("the accelerator kinds")?))
    }
}

/// The owner table: the built-in entries with the file's applied.
fn owner_table(file: Option<&std::path::Path>) -> anyhow::Result<Arc<wasmsched_kube::groups::owners::OwnerTable>> {
    use wasmsched_kube::groups::owners;
    let mut kinds = owners::builtin();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let extra = owners::parse(&text).with_context(|| format!("in {}", path.display()))?;
        kinds = owners::merged(kinds, extra);
    }
    let table = owners::OwnerTable::new(kinds).context("the owner kinds")?;
    Ok(Arc::new(table))
}

/// Runs until SIGTERM or Ctrl-C, then finishes binds in flight and gives the lease up.
pub fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
    let owner_kinds = owner_table(args.owner_kinds.as_deref())?;
    let accelerators = args.accelerators.table()?;
    let events = args.sink.open("scheduler")?;
    let grace = args.sink.grace();
    let preparer = Preparer::new(
        Arc::new(Runtime::new(crate::policy::runtime_config()).context("Wasm runtime")?),
        crate::policy::builtins(),
    );
    let (initial, mut sources) = initial_policy(args.policy.as_deref())?;
    if let Some(bucket) = &args.policy_bucket {
        let nats = args.sink.nats.config()?.context("--policy-bucket needs the NATS server it is on (--nats)")?;
        sources.push(Box::new(ObjectStoreSource::new(nats, bucket, &args.policy_spec_object)?));
    }
    let registry = policy::registry(&preparer, &initial, events.clone(), args.policy_warm_up)
        .context("preparing the first policy set")?;
    tracing::info!(policy = %registry.current().label(), "policy set live");
    let rate = ClientRate { qps: args.kube_api_qps, burst: args.kube_api_burst };
    let clients = runtime
        .block_on(Clients::infer(rate))
        .context("connecting to the Kubernetes API (kubeconfig or in-cluster)")?;
    let client = clients.api.clone();
    if let Some(name) = &args.policy_object {
        let handle = runtime.handle().clone();
        let source = PolicyObjectSource::new(client.clone(), name, &args.lease_namespace, handle, registry.clone());
        sources.push(Box::new(source));
    }
    let watcher = watch_sources(&registry, preparer, sources, args.policy_poll_seconds)?;
    let control = match args.sink.nats.config()? {
        Some(nats) => Some(wasmsched_registry::control::ControlServer::start(&nats, registry.clone())?),
        None => None,
    };
    let result = runtime.block_on(async {
        // Usage from the decisions as they are made, on `/metrics` (`wasmsched usage` computes the
        // same from the event stream).
        let (meter, usage) = wasmsched_usage::exporter::metered();
        let metrics = Metrics::with_collectors(&args.scheduler_name, vec![usage]);
        let listener =
            metrics::listen(args.metrics_addr).await.with_context(|| format!("listening on {}", args.metrics_addr))?;
        tokio::spawn(metrics::serve(listener, metrics.clone()));
        let mut config = SchedulerConfig::new(&args.scheduler_name);
        config.bind_concurrency = args.bind_concurrency;
        config.core.reclaim_min_runtime_seconds = args.reclaim_min_runtime;
        config.core.reclaim_within_deficit = args.reclaim_within_deficit;
        config.core.reclaim_max_runtime_seconds = args.reclaim_max_runtime;
        config.owner_kinds = owner_kinds;
        config.accelerators = accelerators;
        if !args.topology_levels.is_empty() {
            config.topology.levels = args.topology_levels.iter().map(|l| l.trim().to_string()).collect();
        }
        config.topology.wait_seconds = args.topology_wait;
        if args.leader_elect {
            let identity = match &args.identity {
                Some(id) => id.clone(),
                None => hostname().context("give --identity (or POD_NAME) for leader election")?,
            };
            config.lease = Some(LeaseConfig::new(&args.lease_name, &args.lease_namespace, &identity));
        }
        let mut scheduler = Scheduler::new(clients, registry.clone(), metrics, config).with_observer(meter);
        if let Some(events) = events.clone() {
            scheduler = scheduler.with_events(events);
        }
        let _dashboard = match args.dashboard {
            Some(addr) => {
                let publisher = wasmsched_dashboard::Publisher::new();
                let server = wasmsched_dashboard::Server::start(addr, publisher.clone()).await?;
                scheduler = scheduler.with_dashboard(publisher);
                Some(server)
            }
            None => None,
        };
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutting down");
            let _ = stop.send(true);
        });
        scheduler.run(stopped).await;
        anyhow::Ok(())
    });
    if let Some(w) = watcher {
        w.stop();
    }
    drop(control);
    drop(registry);
    let stats = wasmsched_events::cli::finish(events, grace);
    result?;
    crate::events_cmd::delivered(stats.as_ref())
}

/// Watches `sources` for new versions every `poll_seconds`, when there are any.
fn watch_sources(
    registry: &Arc<wasmsched_registry::Registry>,
    preparer: Preparer,
    sources: Vec<Box<dyn Source>>,
    poll_seconds: f64,
) -> anyhow::Result<Option<Watcher>> {
    (!sources.is_empty())
        .then(|| Watcher::spawn(registry.clone(), preparer, sources, Duration::from_secs_f64(poll_seconds.max(0.1))))
        .transpose()
        .context("policy watcher")
}

/// The policy set to start with: the directory's (then watched) or the built-in default.
fn initial_policy(dir: Option<&Path>) -> anyhow::Result<(Fetched, Vec<Box<dyn Source>>)> {
    Ok(match dir {
        Some(dir) => {
            // Polled, not fetched: the source then knows this content, and the watcher's first
            // poll does not offer the same set again as version 2.
            let mut source = DirSource::new(dir);
            let fetched = source
                .poll()
                .with_context(|| format!("policy set in {}", dir.display()))?
                .context("a first poll returns the content")?;
            (fetched, vec![Box::new(source)])
        }
        None => (policy::default_policy(), vec![]),
    })
}

/// `wasmsched extender` arguments.
#[derive(clap::Args)]
pub struct ExtenderArgs {
    /// Where kube-scheduler reaches the extender (its `urlPrefix` is `http://ADDR`).
    #[arg(long, default_value = "0.0.0.0:8888", env = "WASMSCHED_EXTENDER_ADDR")]
    listen: SocketAddr,
    /// A policy set directory, watched for new versions. Without it the built-in default set runs.
    #[arg(long, env = "WASMSCHED_POLICY_DIR")]
    policy: Option<PathBuf>,
    /// How often the policy directory is checked.
    #[arg(long, default_value_t = 2.0)]
    policy_poll_seconds: f64,
    /// Who bindings and events are attributed to.
    #[arg(long, default_value = "wasmsched-extender")]
    name: String,
    #[command(flatten)]
    accelerators: AcceleratorArgs,
}

/// Serves kube-scheduler's extender verbs until SIGTERM or Ctrl-C.
pub fn extender(args: ExtenderArgs) -> anyhow::Result<()> {
    let accelerators = args.accelerators.table()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
    let preparer = Preparer::new(
        Arc::new(Runtime::new(crate::policy::runtime_config()).context("Wasm runtime")?),
        crate::policy::builtins(),
    );
    let (initial, sources) = initial_policy(args.policy.as_deref())?;
    // The extender decides per request, with no loop to warm a staged version: swaps at once.
    let registry = policy::registry(&preparer, &initial, None, 0).context("preparing the first policy set")?;
    tracing::info!(policy = %registry.current().label(), "policy set live");
    let watcher = watch_sources(&registry, preparer, sources, args.policy_poll_seconds)?;
    let client =
        runtime.block_on(Extender::connect()).context("connecting to the Kubernetes API (kubeconfig or in-cluster)")?;
    let result = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        tracing::info!(addr = %args.listen, "serving the extender verbs filter, prioritize and bind");
        let extender = Extender::new(client, registry.clone(), &args.name, accelerators);
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutting down");
            let _ = stop.send(true);
        });
        let watching = tokio::spawn(extender.clone().watch(stopped.clone()));
        extender.serve(listener, stopped).await;
        let _ = watching.await;
        anyhow::Ok(())
    });
    if let Some(w) = watcher {
        w.stop();
    }
    result
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return ctrl_c.await.unwrap_or(()),
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.unwrap_or(());
}

fn hostname() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").context("reading the hostname")?;
    Ok(name.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The set loaded at start is the watcher's baseline: nothing changed, nothing offered.
    #[test]
    fn the_policy_loaded_at_start_is_not_offered_again_by_the_watcher() {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/policies/packing"));
        let (fetched, mut sources) = initial_policy(Some(dir)).unwrap();
        assert_eq!(fetched.spec.name, "packing");
        assert!(sources[0].poll().unwrap().is_none(), "the unchanged set came back as a new version");
    }
}
