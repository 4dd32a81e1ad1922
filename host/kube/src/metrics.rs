//! Prometheus metrics under kube-scheduler's names where the meaning is the same, so existing
//! dashboards and alerts work, and the `/metrics`, `/healthz` and `/readyz` endpoints.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use wasmsched_api::Stage;

/// The profile label: kube-scheduler labels attempts by scheduling profile; ours is the scheduler
/// name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    /// `scheduled`, `unschedulable` or `error`.
    pub result: &'static str,
    /// The scheduler name.
    pub profile: String,
}

/// Which pending queue.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// `active`, `backoff` or `gated` (waiting for gang members).
    pub queue: &'static str,
}

/// A bind's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BindLabels {
    /// `ok`, `conflict`, `not_found`, `throttled` (429), `retry` (5xx, transport) or `not_leader`.
    pub result: &'static str,
}

/// `reason` of `wasmsched_kubernetes_events_lost_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LostLabels {
    /// `queue_full`, `refused` or `retries_exhausted`.
    pub reason: &'static str,
}

/// `state` of `wasmsched_dra_devices`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DraLabels {
    /// `usable`, `held` or `refused`.
    pub state: &'static str,
}

/// What a preemption was for (`reason` of `wasmsched_preemptions_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PreemptLabels {
    /// `priority`, `reclaim`, `elastic_shrink`, `gang_broken` or `node_lost`.
    pub reason: &'static str,
}

/// Figures the scheduling loop computes from its own state (at most twice a second) and a scrape
/// reads whole, under one lock: a queue, pool or reason that goes away leaves no stale series.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    /// One row per queue (leaves and parents; a parent counts its subtree).
    pub queues: Vec<QueueFigures>,
    /// Waiting workloads by leaf queue and why they wait ([`crate::scheduler`] names the reasons).
    pub waiting: Vec<(String, &'static str, u64)>,
    /// The nodes' GPUs by model and pool.
    pub gpus: Vec<GpuFigures>,
    /// The event sink's counters, where events go somewhere.
    pub events: Option<wasmsched_events::Stats>,
}

/// One queue's figures.
#[derive(Clone, Debug, Default)]
pub struct QueueFigures {
    /// The queue's name.
    pub queue: String,
    /// GPUs held by its placed tasks (shares as fractions).
    pub allocated_gpus: f64,
    /// Its deserved share of GPUs; `None` while no fair-share plugin computes one.
    pub deserved_gpus: Option<f64>,
    /// Pods placed and pods waiting.
    pub running_pods: u64,
    /// Pods waiting.
    pub pending_pods: u64,
    /// How long its longest-waiting workload has waited, in seconds (0: none waits).
    pub oldest_pending_seconds: u64,
}

/// The GPUs of one model in one pool.
#[derive(Clone, Debug, Default)]
pub struct GpuFigures {
    /// Accelerator kind (`nvidia`, `amd`, …: the accelerator table's names).
    pub kind: String,
    /// GPU model (the devices' own name).
    pub model: String,
    /// Node pool (`wasmsched.io/node-pool` or the platform's label); empty: none.
    pub pool: String,
    /// Devices.
    pub devices: u64,
    /// Devices marked unhealthy (XIDs, `wasmsched.io/gpu-out-of-service`).
    pub unhealthy: u64,
    /// GPUs held, shares as fractions.
    pub allocated: f64,
    /// GPUs' worth of idle share that none of the pods this scheduler has could use (the
    /// fragmentation measure of the dashboard); `None` without pods to measure against.
    pub fragmented: Option<f64>,
}

/// Every metric the scheduler exports, and its health.
pub struct Metrics {
    registry: Registry,
    profile: String,
    /// `scheduler_schedule_attempts_total`.
    pub attempts: Family<AttemptLabels, Counter>,
    /// `scheduler_scheduling_attempt_duration_seconds`.
    pub attempt_duration: Family<AttemptLabels, Histogram>,
    /// `scheduler_pending_pods`.
    pub pending: Family<QueueLabels, Gauge>,
    /// `wasmsched_binds_total`.
    pub binds: Family<BindLabels, Counter>,
    /// `wasmsched_bind_duration_seconds`.
    pub bind_duration: Histogram,
    /// `wasmsched_leader`: 1 while this replica holds the lease.
    pub leader: Gauge,
    /// `wasmsched_cache_nodes` and `wasmsched_cache_pods`.
    pub cache_nodes: Gauge,
    /// Pods holding resources in the cache.
    pub cache_pods: Gauge,
    /// `wasmsched_dra_devices{state}`: DRA devices in complete pools (`usable`), held by claims
    /// (`held`), and pools or devices left out of ResourceSlices that cannot be used (`refused`).
    pub dra_devices: Family<DraLabels, Gauge>,
    /// `wasmsched_preemptions_total{reason}`: pods evicted by a decision of the scheduler.
    pub preemptions: Family<PreemptLabels, Counter>,
    /// `wasmsched_evictions_total{result}`: Eviction API calls, `ok`, `refused` (a disruption
    /// budget or throttling: retried) or `abandoned` (refused for too long: the pod runs on).
    pub evictions: Family<BindLabels, Counter>,
    /// `wasmsched_kubernetes_events_lost_total{reason}`: Kubernetes events about pods not
    /// recorded — `queue_full` (already [`crate::bind::EVENTS_QUEUED`] waiting), `refused` (an
    /// answer a retry cannot change) or `retries_exhausted` (throttled or failing every try).
    pub events_lost: Family<LostLabels, Counter>,
    /// The loop's figures (queues, waiting work, GPUs, events), exported at scrape time.
    pub figures: Arc<std::sync::Mutex<Figures>>,
    policies: Arc<OnceLock<Arc<wasmsched_registry::Registry>>>,
    ready: AtomicBool,
    heartbeat_ms: AtomicU64,
}

/// Exports the live policy version's per-plugin metrics at scrape time:
/// `scheduler_plugin_execution_duration_seconds{plugin, extension_point}` (kube-scheduler's name;
/// it also has a `status` label, which the runtime's histogram does not split by) and
/// `wasmsched_plugin_faults_total{plugin, extension_point, kind}`. After a swap the new version's
/// plugins start from zero, which Prometheus reads as a counter reset.
struct PluginCollector(Arc<OnceLock<Arc<wasmsched_registry::Registry>>>);

impl std::fmt::Debug for PluginCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PluginCollector")
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabels {
    plugin: String,
    extension_point: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabels {
    plugin: String,
    extension_point: &'static str,
    kind: &'static str,
}

/// Exemplar labels: none.
type NoLabels = Vec<(String, String)>;

/// kube-scheduler's extension point names.
fn extension_point(stage: Stage) -> &'static str {
    match stage {
        Stage::Filter => "Filter",
        Stage::Score => "Score",
        Stage::SelectDevices => "SelectDevices",
        Stage::Preempt => "PostFilter",
        Stage::FairShare => "FairShare",
    }
}

/// The runtime's power-of-two nanosecond buckets as Prometheus buckets from 1 µs to ~17 s: the
/// finer ones fold into the first, the coarser into `+Inf`.
fn prometheus_buckets(raw: &[u64]) -> Vec<(f64, u64)> {
    const FIRST: usize = 9; // [.., 2^10 ns ≈ 1 µs)
    const LAST: usize = 33; // [2^33, 2^34 ns ≈ 17 s)
    let mut out = Vec::with_capacity(LAST - FIRST + 2);
    let below: u64 = raw.iter().take(FIRST + 1).sum();
    out.push(((1u64 << (FIRST + 1)) as f64 / 1e9, below));
    for (i, n) in raw.iter().enumerate().take(LAST + 1).skip(FIRST + 1) {
        out.push(((1u64 << (i + 1)) as f64 / 1e9, *n));
    }
    out.push((f64::INFINITY, raw.iter().skip(LAST + 1).sum()));
    out
}

impl Collector for PluginCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(policies) = self.0.get() else { return Ok(()) };
        let live = policies.current();
        let mut durations = encoder.encode_descriptor(
            "scheduler_plugin_execution_duration_seconds",
            "Duration of running a policy plugin at an extension point, in the live policy version.",
            None,
            prometheus_client::metrics::MetricType::Histogram,
        )?;
        for plugin in &live.plugins {
            for &stage in &plugin.stages {
                let latency = plugin.metrics.stage(stage).latency;
                let labels = PluginLabels { plugin: plugin.name.clone(), extension_point: extension_point(stage) };
                durations.encode_family(&labels)?.encode_histogram::<NoLabels>(
                    latency.sum.as_secs_f64(),
                    latency.count,
                    &prometheus_buckets(&latency.buckets),
                    None,
                )?;
            }
        }
        // Every kind from zero, so a plugin's first fault is an increase Prometheus sees (a series
        // that first appears at 1 has no increase to `rate` or `increase`).
        let faults = Family::<FaultLabels, Counter>::default();
        for plugin in &live.plugins {
            for &stage in &plugin.stages {
                let seen = plugin.metrics.stage(stage).faults;
                for kind in wasmsched_runtime::FAULT_KINDS {
                    let n = seen.iter().find(|(k, _)| *k == kind).map_or(0, |(_, n)| *n);
                    let labels = FaultLabels {
                        plugin: plugin.name.clone(),
                        extension_point: extension_point(stage),
                        kind: kind.as_str(),
                    };
                    faults.get_or_create(&labels).inc_by(n);
                }
            }
        }
        let faults_encoder = encoder.encode_descriptor(
            "wasmsched_plugin_faults",
            "Policy plugin faults (traps, deadlines, memory, bad output, ...) in the live policy version.",
            None,
            faults.metric_type(),
        )?;
        faults.encode(faults_encoder)?;
        encode_policy_state(&mut encoder, policies, live.version)
    }
}

/// The live version, whether it is on probation or has a candidate beside it, failing sources,
/// and how many versions reached each outcome (a rollback is `outcome="rolled-back"`).
fn encode_policy_state(
    encoder: &mut DescriptorEncoder,
    policies: &wasmsched_registry::Registry,
    live_version: u64,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::MetricType;
    let status = policies.status();
    let gauges: [(&str, &str, i64); 4] = [
        ("wasmsched_policy_live_version", "Version number of the live policy set.", live_version as i64),
        (
            "wasmsched_policy_on_probation",
            "1 while the live policy version is on probation (watched for rollback).",
            i64::from(status.on_probation),
        ),
        (
            "wasmsched_policy_candidate",
            "1 while a candidate policy version runs in shadow or waits for promotion.",
            i64::from(status.candidate.is_some()),
        ),
        ("wasmsched_policy_source_errors", "Policy sources whose last poll failed.", status.source_errors.len() as i64),
    ];
    for (name, help, value) in gauges {
        let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        metric.encode_gauge(&value)?;
    }
    let mut outcomes = encoder.encode_descriptor(
        "wasmsched_policy_outcomes",
        "Policy versions that reached each outcome since the scheduler started (live, rolled-back, rejected, ...).",
        None,
        MetricType::Counter,
    )?;
    for (outcome, n) in policies.outcome_counts() {
        outcomes.encode_family(&[("outcome", outcome.as_str())])?.encode_counter::<NoLabels, u64, f64>(&n, None)?;
    }
    Ok(())
}

/// Exports the loop's [`Figures`] at scrape time.
struct FiguresCollector(Arc<std::sync::Mutex<Figures>>);

impl std::fmt::Debug for FiguresCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FiguresCollector")
    }
}

impl Collector for FiguresCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType;
        let figures = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        type QueuePick = fn(&QueueFigures) -> Option<f64>;
        let per_queue: [(&str, &str, QueuePick); 5] = [
            (
                "wasmsched_queue_allocated_gpus",
                "GPUs held by a queue's placed pods (a parent counts its subtree).",
                |q| Some(q.allocated_gpus),
            ),
            ("wasmsched_queue_deserved_gpus", "A queue's deserved share of GPUs (fair share).", |q| q.deserved_gpus),
            ("wasmsched_queue_running_pods", "A queue's placed pods.", |q| Some(q.running_pods as f64)),
            ("wasmsched_queue_pending_pods", "A queue's pods waiting for a placement.", |q| {
                Some(q.pending_pods as f64)
            }),
            (
                "wasmsched_queue_oldest_pending_seconds",
                "How long a queue's longest-waiting workload has waited (0: none waits).",
                |q| Some(q.oldest_pending_seconds as f64),
            ),
        ];
        for (name, help, pick) in per_queue {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for q in &figures.queues {
                if let Some(v) = pick(q) {
                    family.encode_family(&[("queue", q.queue.as_str())])?.encode_gauge(&v)?;
                }
            }
        }
        let mut waiting = encoder.encode_descriptor(
            "wasmsched_pending_workloads",
            "Workloads waiting, by leaf queue and why: no_fit (no node has room), gang (too few members fit), queue (quota or queue order), affinity, gated (members or claims not there yet), not_tried.",
            None,
            MetricType::Gauge,
        )?;
        for (queue, reason, n) in &figures.waiting {
            waiting.encode_family(&[("queue", queue.as_str()), ("reason", reason)])?.encode_gauge(&(*n as i64))?;
        }
        type GpuPick = fn(&GpuFigures) -> Option<f64>;
        let per_pool: [(&str, &str, GpuPick); 4] = [
            ("wasmsched_gpus", "GPU devices on the nodes, by kind, model and pool.", |g| Some(g.devices as f64)),
            ("wasmsched_gpus_unhealthy", "GPU devices marked unhealthy, by kind, model and pool.", |g| {
                Some(g.unhealthy as f64)
            }),
            (
                "wasmsched_gpus_allocated",
                "GPUs held by placed pods (shares as fractions), by kind, model and pool.",
                |g| Some(g.allocated),
            ),
            (
                "wasmsched_gpus_fragmented",
                "GPUs' worth of idle share none of the scheduler's pods could use, by kind, model and pool.",
                |g| g.fragmented,
            ),
        ];
        for (name, help, pick) in per_pool {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for g in &figures.gpus {
                if let Some(v) = pick(g) {
                    family
                        .encode_family(&[
                            ("kind", g.kind.as_str()),
                            ("model", g.model.as_str()),
                            ("pool", g.pool.as_str()),
                        ])?
                        .encode_gauge(&v)?;
                }
            }
        }
        if let Some(e) = &figures.events {
            let counters: [(&str, &str, u64); 5] = [
                ("wasmsched_events_emitted", "Decision events handed to the event sink.", e.emitted),
                ("wasmsched_events_delivered", "Events written or acknowledged by JetStream.", e.delivered),
                ("wasmsched_events_dropped", "Events dropped: the outbox and its spill were full.", e.dropped),
                (
                    "wasmsched_events_spilled",
                    "Events written to the spill directory while the destination was away.",
                    e.spilled,
                ),
                ("wasmsched_events_lost_by_server", "Events JetStream acknowledged and then lost.", e.lost_by_server),
            ];
            for (name, help, value) in counters {
                let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                metric.encode_counter::<NoLabels, u64, f64>(&value, None)?;
            }
            let mut pending = encoder.encode_descriptor(
                "wasmsched_events_pending",
                "Events held (memory, in flight, spill) waiting for their destination.",
                None,
                MetricType::Gauge,
            )?;
            pending.encode_gauge(&(e.pending as i64))?;
        }
        Ok(())
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Metrics {
    /// Registers every metric, labelled with `profile` (the scheduler name).
    pub fn new(profile: &str) -> Arc<Metrics> {
        Metrics::with_collectors(profile, Vec::new())
    }

    /// [`Metrics::new`], exporting `collectors`' metrics too (the usage meter's, which follows the
    /// scheduler's decisions: `wasmsched_usage::exporter`).
    pub fn with_collectors(profile: &str, collectors: Vec<Box<dyn Collector>>) -> Arc<Metrics> {
        let mut registry = Registry::default();
        let attempts = Family::<AttemptLabels, Counter>::default();
        let attempt_duration = Family::<AttemptLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.0, 18))
        });
        let pending = Family::<QueueLabels, Gauge>::default();
        let binds = Family::<BindLabels, Counter>::default();
        let bind_duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let (leader, cache_nodes, cache_pods) = (Gauge::default(), Gauge::default(), Gauge::default());
        registry.register(
            "scheduler_schedule_attempts",
            "Number of attempts to schedule pods, by the result.",
            attempts.clone(),
        );
        registry.register(
            "scheduler_scheduling_attempt_duration_seconds",
            "Scheduling attempt latency in seconds (scheduling algorithm + binding).",
            attempt_duration.clone(),
        );
        registry.register("scheduler_pending_pods", "Number of pending pods, by the queue type.", pending.clone());
        registry.register("wasmsched_binds", "Binds issued, by outcome.", binds.clone());
        registry.register("wasmsched_bind_duration_seconds", "Latency of the binding API call.", bind_duration.clone());
        registry.register("wasmsched_leader", "1 while this replica holds the scheduler lease.", leader.clone());
        registry.register("wasmsched_cache_nodes", "Nodes in the scheduler cache.", cache_nodes.clone());
        registry.register("wasmsched_cache_pods", "Pods holding resources in the scheduler cache.", cache_pods.clone());
        let dra_devices = Family::<DraLabels, Gauge>::default();
        registry.register(
            "wasmsched_dra_devices",
            "DRA devices: usable (in complete pools), held by claims, and refused (pools or devices left out of ResourceSlices that cannot be used)",
            dra_devices.clone(),
        );
        let preemptions = Family::<PreemptLabels, Counter>::default();
        registry.register(
            "wasmsched_preemptions",
            "Pods evicted by the scheduler's decisions, by why: priority, reclaim (fair share), elastic_shrink, gang_broken, node_lost.",
            preemptions.clone(),
        );
        let evictions = Family::<BindLabels, Counter>::default();
        registry.register(
            "wasmsched_evictions",
            "Eviction API calls by outcome: ok, refused (retried), abandoned (the pod runs on).",
            evictions.clone(),
        );
        let events_lost = Family::<LostLabels, Counter>::default();
        registry.register(
            "wasmsched_kubernetes_events_lost",
            "Kubernetes events about pods (Scheduled, FailedScheduling, Preempted) not recorded, by why: queue_full, refused, retries_exhausted.",
            events_lost.clone(),
        );
        for reason in ["queue_full", "refused", "retries_exhausted"] {
            let _ = events_lost.get_or_create(&LostLabels { reason });
        }
        // Counters of rare events start at zero for every label value, so the first one is an
        // increase an alert sees.
        for result in ["ok", "conflict", "not_found", "throttled", "retry", "not_leader"] {
            let _ = binds.get_or_create(&BindLabels { result });
        }
        for result in ["ok", "refused", "abandoned"] {
            let _ = evictions.get_or_create(&BindLabels { result });
        }
        for reason in ["priority", "reclaim", "elastic_shrink", "gang_broken", "node_lost"] {
            let _ = preemptions.get_or_create(&PreemptLabels { reason });
        }
        let figures = Arc::new(std::sync::Mutex::new(Figures::default()));
        registry.register_collector(Box::new(FiguresCollector(figures.clone())));
        let policies = Arc::new(OnceLock::new());
        registry.register_collector(Box::new(PluginCollector(policies.clone())));
        for collector in collectors {
            registry.register_collector(collector);
        }
        Arc::new(Metrics {
            registry,
            policies,
            profile: profile.into(),
            attempts,
            attempt_duration,
            pending,
            binds,
            bind_duration,
            leader,
            cache_nodes,
            cache_pods,
            dra_devices,
            preemptions,
            evictions,
            events_lost,
            figures,
            ready: AtomicBool::new(false),
            heartbeat_ms: AtomicU64::new(now_ms()),
        })
    }

    /// Replaces the loop's figures (what the next scrape exports).
    pub fn set_figures(&self, figures: Figures) {
        *self.figures.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = figures;
    }

    /// Exports the plugin metrics of `policies`' live version from now on (the first call wins).
    pub fn observe_policies(&self, policies: Arc<wasmsched_registry::Registry>) {
        let _ = self.policies.set(policies);
    }

    /// Records one scheduling attempt.
    pub fn attempt(&self, result: &'static str, took: Duration) {
        let labels = AttemptLabels { result, profile: self.profile.clone() };
        self.attempts.get_or_create(&labels).inc();
        self.attempt_duration.get_or_create(&labels).observe(took.as_secs_f64());
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    /// Marks the scheduler ready (caches synced) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether the caches are synced.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Called by the scheduling loop on every turn; `/healthz` fails when it stops.
    pub fn beat(&self) {
        self.heartbeat_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Whether the loop beat within `max`.
    pub fn is_alive(&self, max: Duration) -> bool {
        now_ms().saturating_sub(self.heartbeat_ms.load(Ordering::Relaxed)) <= max.as_millis() as u64
    }
}

/// How long the scheduling loop may go without a heartbeat before `/healthz` fails (it beats at
/// least every second when idle).
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

fn respond(metrics: &Metrics, path: &str) -> Response<Full<Bytes>> {
    let (status, body, content_type) = match path {
        "/metrics" => (StatusCode::OK, metrics.render(), "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "/healthz" | "/livez" if metrics.is_alive(HEALTH_TIMEOUT) => (StatusCode::OK, "ok".into(), "text/plain"),
        "/healthz" | "/livez" => (StatusCode::SERVICE_UNAVAILABLE, "scheduling loop stalled".into(), "text/plain"),
        "/readyz" if metrics.is_ready() => (StatusCode::OK, "ok".into(), "text/plain"),
        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "caches not synced".into(), "text/plain"),
        _ => (StatusCode::NOT_FOUND, "not found".into(), "text/plain"),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    response
}

/// Serves `/metrics`, `/healthz` (alias `/livez`) and `/readyz` on `listener` until the task is
/// dropped. Returns the bound address first through `bound` for tests that listen on port 0.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let response = respond(&metrics, req.uri().path());
                async move { Ok::<_, Infallible>(response) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await {
                tracing::debug!(error = %e, "metrics connection ended");
            }
        });
    }
}

/// Binds the metrics address.
pub async fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
