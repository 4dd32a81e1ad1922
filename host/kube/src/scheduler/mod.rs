//! The scheduling loop against a cluster. Watch streams ([`Watches`]) feed two views: the cluster
//! view (every pod's usage on every node plus binds in flight, our pods, the scheduling objects)
//! and the [`SchedulerCore`] (this scheduler's pods as workloads in their queues; each node as what
//! everyone else leaves free). The leader runs the core's cycle whenever something changed or one
//! of its timers is due, and carries out its decisions through an [`Executor`]: binds,
//! `PodScheduled=False` with the explanation, checkpoint requests, evictions through the Eviction
//! API. Non-leaders keep both views warm so a fail-over is instant.
//!
//! One task owns the views (no locks on the hot path); writes run concurrently, binds at most
//! `bind_concurrency` at once, and report back on a channel.
//!
//! The loop's parts, in the order data flows through them:
//! - `watches`: the inputs — one stream per kind, opened on the API server or handed in;
//! - `cluster`: the view the watch events update, with no I/O, each event returning what changed;
//! - `changes`: what a change means for the core, the runs and the pods' reported reasons;
//! - `grouping`: which gang each pod belongs to — its group's object or its owners (watched);
//! - `adopt`: taking over after a start or a fail-over (running pods of ours become the core's);
//! - `cycle`: one cycle — nodes refreshed, waiting pods submitted, victims offered, the core decides;
//! - `effects`: each decision carried out (bind, evict, ask for a checkpoint, nominate, report why);
//! - `runs`: each pod's run from its bind to its end, as `task-scheduled`/`task-ended` and in the
//!   usage counters (the leader's alone);
//! - `statuses`: `Queue` and `PodGroup` status and the gauges, every few seconds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ahash::{AHashMap, AHashSet};
use futures_util::StreamExt;
use kube::Client;
use tokio::sync::{Semaphore, mpsc, watch};
use wasmsched_api::{DeviceShare, Node, Task};
use wasmsched_core::{
    CoreConfig, Decision, EvictReason, Explanation, Phase, Placement, RunningPod, SchedulerCore, Unschedulable,
    flavored_amount, release,
};
use wasmsched_events::EventSink;
use wasmsched_events::decisions::{self, CycleFacts};
use wasmsched_events::schema::{Payload, PolicySetRef};
use wasmsched_registry::{Decision as Observed, PolicyVersion, Registry};

use crate::bind::{EffectError, Effects, EventType};
use crate::cache::Cache;
use crate::convert::{self, PodKey};
use crate::crd::{PodGroupPhase, QueueStatus};
use crate::executor::Executor;
use crate::leader::{Elector, LeaseConfig};
use crate::metrics::{BindLabels, Metrics, QueueLabels};
use crate::pod_status::PodStatusWriter;
use crate::queues::{Flavors, Queues};
use crate::status::{self, StatusWriter};
use crate::throttle::Clients;
use crate::workloads::{self, GroupInfo, PodFacts};
use cluster::{ClusterView, Objects};

mod adopt;
mod backoff;
mod changes;
mod cluster;
mod cycle;
mod dashboard;
mod described;
mod effects;
mod grouping;
mod ours;
mod runs;
mod statuses;
mod watches;

pub use watches::{TaggedWatches, Watch, Watches};

/// How the scheduler runs.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Pods with this `spec.schedulerName` are ours.
    pub scheduler_name: String,
    /// Binds in flight at most.
    pub bind_concurrency: usize,
    /// Leader election; `None` runs as the only replica.
    pub lease: Option<LeaseConfig>,
    /// The cycle's tunables (back-off, gang timeout, checkpoint grace, …).
    pub core: CoreConfig,
    /// How long pods that could not be submitted (unknown queue, a gang that timed out) wait before
    /// they are tried again.
    pub resubmit_after: Duration,
    /// The owner kinds whose pods are gangs without a PodGroup ([`crate::groups::owners`]).
    pub owner_kinds: Arc<crate::groups::owners::OwnerTable>,
    /// The cluster's topology levels and how long a gang preferring one waits for it
    /// ([`crate::workloads::TopologyRequest::constraint`]).
    pub topology: crate::workloads::ClusterTopology,
    /// The accelerator kinds nodes and pods are read with ([`crate::accelerators`]).
    pub accelerators: Arc<crate::accelerators::AcceleratorTable>,
}

/// A scheduler core for `config`: its settings, and the levels whose domains it keeps for policies
/// (`domains` import), innermost first.
pub(super) fn new_core(tree: wasmsched_core::QueueTree, config: &SchedulerConfig) -> SchedulerCore {
    let mut core = SchedulerCore::new(tree, config.core.clone());
    core.set_levels(config.topology.levels.iter().rev().cloned().collect());
    core.set_accelerator_kinds(config.accelerators.api_kinds());
    core
}

impl SchedulerConfig {
    /// Defaults for `scheduler_name`: 16 binds in flight, no election, the core's defaults.
    pub fn new(scheduler_name: &str) -> SchedulerConfig {
        SchedulerConfig {
            scheduler_name: scheduler_name.into(),
            bind_concurrency: 16,
            lease: None,
            // About 100–200 ms of Wasm placement on a 5,000-node cluster: binds start and the
            // watch streams are read while a large backlog is worked through.
            // An eviction is a graceful deletion: a victim holds its GPUs until its pod is gone.
            core: CoreConfig { max_attempts_per_cycle: Some(64), await_termination: true, ..CoreConfig::default() },
            resubmit_after: Duration::from_secs(10),
            owner_kinds: Arc::new(
                crate::groups::owners::OwnerTable::new(crate::groups::owners::builtin())
                    .expect("the built-in owner table compiles"),
            ),
            topology: crate::workloads::ClusterTopology::default(),
            accelerators: Arc::default(),
        }
    }
}

/// What API writes report back to the loop.
enum Done {
    Bind {
        id: String,
        /// What was to be written on its claims: taken back in the view when the bind failed.
        claims: Vec<crate::dra::ClaimWrite>,
        result: Result<(), EffectError>,
        took: Duration,
        decided_in: Duration,
        /// When the bind was sent: the run's start.
        at: wasmsched_events::Timestamp,
    },
    /// An eviction was refused until we gave up: the victim still runs and counts again.
    EvictionAbandoned { id: String },
    /// A pod of ours left the watch by reaching a terminal phase (read afterwards) at `at`.
    RunFinished { run: Box<runs::Run>, at: wasmsched_events::Timestamp, phase: Option<String> },
}

/// The scheduler: the two views, the policy registry and the API effects.
pub struct Scheduler {
    config: SchedulerConfig,
    api: ApiClients,
    shared: Shared,
    /// The cluster as the watches show it.
    view: ClusterView,
    core: SchedulerCore,
    /// When the running pods of ours were taken over by the core (the watches had listed).
    adopted: Option<Instant>,
    next: Next,
    timers: Timers,
    reports: Reports,
    in_flight: InFlight,
    leadership: Leadership,
}

/// How the scheduler reaches the API server.
struct ApiClients {
    /// Watches and status writes.
    client: Client,
    /// The Lease's own client: renewals never queue behind `client`'s writes.
    election: Client,
    /// Binds, evictions, checkpoint requests and Kubernetes events.
    effects: Arc<dyn Executor>,
    /// The `ComputeDomain`s our pods ask for (started by `run`, with the leadership it follows).
    compute_domains: Option<crate::compute_domains::ComputeDomains>,
}

/// What the scheduler shares with the rest of the process: the policy registry (which set is
/// live, what it decided) and the metrics the exporter serves.
struct Shared {
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
}

/// Whether this replica leads (writes to the API server) and, without an election, what keeps it
/// leading.
struct Leadership {
    leader: watch::Receiver<bool>,
    /// Holds leadership at `true` when there is no election.
    _always: Option<watch::Sender<bool>>,
}

/// What the next cycle must do before it decides.
struct Next {
    /// Something changed that may change a decision.
    dirty: bool,
    /// Nodes whose usage by others changed: the core sees them again before the next cycle.
    stale_nodes: AHashSet<String>,
    /// A pod of ours has pod (anti-)affinity terms of its own: the core needs every other pod's
    /// labels; until then only others' pods with anti-affinity (their terms apply to everyone).
    all_pod_labels: bool,
    /// Pods or groups not to submit before this core time (refused, or a gang that timed out).
    not_before: AHashMap<String, u64>,
    /// Pods or groups waiting on their DRA claims (no node can serve them): tried again as soon as
    /// devices are added or freed, not only after `not_before`.
    dra_waiting: AHashSet<String>,
    /// Workloads submitted for nodes whose devices could serve their claims only once freed:
    /// why no node can now (a taint, a selector, too few free), told beside the core's reason.
    dra_not_now: AHashMap<String, String>,
    /// Workloads submitted with the nodes their claims allowed then: submitted again with fresh
    /// nodes when devices are added or freed, while none of their members is placed.
    dra_submitted: AHashSet<String>,
    /// Gangs submitted, with the min-member they were submitted with: one still wholly pending
    /// whose group or owner now says another is withdrawn and submitted again.
    gang_min: AHashMap<String, usize>,
    /// A group object or owner changed: gangs' min-member is checked again.
    regroup: bool,
    /// Nodes where a workload's claims could not be allocated after the cycle placed it there:
    /// left out of its next placements until devices are added or freed.
    dra_avoid: AHashMap<String, BTreeSet<String>>,
    /// Pods of ours asking for an extended resource that device-plugin nodes offer and a
    /// DeviceClass serves on DRA nodes (KEP-5004), by pod: which kind of node they are tried on.
    mixed: AHashMap<String, MixedPath>,
}

/// Where a pod that device-plugin nodes and DRA nodes could both serve is tried. kube-scheduler
/// weighs both kinds in one cycle; the core asks one request of every node (a GPU count, or a
/// count of a class's devices), so such a pod is submitted for the device-plugin nodes first and,
/// when none has room, withdrawn and submitted for the DRA nodes; when those have no room either
/// it waits, with both reasons, and the round starts again after a back-off (1 s, doubling to 10 s,
/// kube-scheduler's).
#[derive(Clone, Debug, Default)]
struct MixedPath {
    /// The next submission is for the DRA nodes.
    dra: bool,
    /// The current submission is for the DRA nodes.
    submitted_dra: bool,
    /// Why the device-plugin nodes could not take it, in this round.
    plugin_reason: Option<String>,
    /// Seconds to wait after a round where neither kind had room.
    backoff: u64,
}

/// The loop's clocks.
struct Timers {
    /// Core time counts whole seconds from here.
    clock: Instant,
    last_cycle: Instant,
    gauges_at: Instant,
    /// [`SchedulerCore::next_wakeup`] as of `wakeup_at`.
    core_wakeup: Option<u64>,
    wakeup_at: Instant,
    status_at: Instant,
    dashboard_at: Instant,
}

/// What is written about the decisions: object status, why pods wait, decision events.
use wasmsched_dashboard::view::SharePoint;

struct Reports {
    status: StatusWriter,
    /// `PodScheduled=False` on pending pods: coalesced, ordered, retried (started by `run`, with
    /// the leadership it follows).
    pod_status: Option<PodStatusWriter>,
    /// Last reason written on each pending pod: the condition is patched only when it changes.
    reported: AHashMap<String, String>,
    /// Failed attempts per workload, for the `task-scheduled` event's attempt number.
    attempts: AHashMap<String, u32>,
    /// `task-scheduled` events waiting for their bind to succeed.
    unconfirmed: AHashMap<String, Vec<Payload>>,
    /// Runs of our pods going on, for their `task-ended` (a standby follows them too).
    runs: AHashMap<String, runs::Run>,
    /// `task-ended` of runs that ended while this replica stood by, the last few leases' worth: the
    /// leader may have died before publishing them.
    ended_standing_by: std::collections::VecDeque<(wasmsched_events::Timestamp, Payload)>,
    /// Deserved shares last published.
    shares: decisions::Shares,
    /// Nodes, queues and arrivals as last published.
    described: described::Described,
    events: Option<EventSink>,
    /// What follows the decisions in this process (the usage meter behind `/metrics`).
    observers: Vec<Arc<dyn wasmsched_events::Observer>>,
    /// Pods decided so far.
    decided: u64,
    /// The dashboard this scheduler is shown on (`run --dashboard`).
    dashboard: Option<wasmsched_dashboard::Publisher>,
    /// Each node's topology rendered for the dashboard, redone only when a node's changes.
    topology_text: Arc<std::collections::HashMap<String, Arc<str>>>,
    /// Each node's DRA devices as the dashboard shows them, brought up to date from the nodes
    /// whose devices or holds changed (a whole rebuild costs ~40 ms at 5,000 nodes of 8).
    dra_devices: Arc<AHashMap<String, Arc<[wasmsched_dashboard::view::DeviceView]>>>,
    /// Each queue's share over time for the dashboard, and when it was last sampled.
    queue_history: Arc<std::collections::HashMap<String, std::collections::VecDeque<SharePoint>>>,
    queue_sampled: Option<Instant>,
    /// The cluster's GPU allocation over time, sampled with the queues' shares (by the task that
    /// builds the view, which counts it).
    allocation: Arc<std::sync::Mutex<std::collections::VecDeque<wasmsched_dashboard::view::SeriesPoint>>>,
    /// The GPUs' rows of the metrics, and when they were computed (they walk every node).
    gpu_figures: Vec<crate::metrics::GpuFigures>,
    gpu_figures_at: Option<Instant>,
}

/// API writes under way.
struct InFlight {
    /// Binds in flight at most.
    binds: Arc<Semaphore>,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    /// DRA claim writes reserved for the cycle's binds, by pod, until each bind starts.
    claims: AHashMap<String, Vec<crate::dra::ClaimWrite>>,
}

/// How often the leader brings `Queue` and `PodGroup` status up to date.
const STATUS_EVERY: Duration = Duration::from_secs(2);

/// Adoption (and so the first cycle) waits this long for the Queue, PriorityClass,
/// PodDisruptionBudget and DRA lists: priorities, protected victims and the DeviceClasses that
/// serve GPU requests are known before anything is decided (a cluster without the CRD or the
/// DRA API never sends them; RBAC may deny the others).
const QUEUE_SYNC_GRACE: Duration = Duration::from_secs(5);

impl Scheduler {
    /// A scheduler for the cluster of `clients`, deciding with `registry`'s live policy set.
    pub fn new(clients: Clients, registry: Arc<Registry>, metrics: Arc<Metrics>, config: SchedulerConfig) -> Scheduler {
        let Clients { api: client, events, election: election_client } = clients;
        let identity = config.lease.as_ref().map_or_else(|| config.scheduler_name.clone(), |l| l.identity.clone());
        let mut effects =
            Effects::new(client.clone(), &config.scheduler_name, &identity).counting_lost_events(&metrics);
        if let Some(events) = events {
            effects = effects.with_event_client(events, &identity);
        }
        let status_client = client.clone();
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (always, leader) = watch::channel(config.lease.is_none());
        metrics.observe_policies(registry.clone());
        let queues = Queues::default();
        let tree = queues.tree(&Flavors::default()).0.expect("the implicit default queue alone is a valid tree");
        let now = Instant::now();
        let owners = crate::groups::owners::Owners::new(config.owner_kinds.clone());
        let cache = Cache::with_accelerators(Arc::clone(&config.accelerators));
        Scheduler {
            in_flight: InFlight {
                binds: Arc::new(Semaphore::new(config.bind_concurrency.max(1))),
                done_tx,
                done_rx,
                claims: AHashMap::new(),
            },
            core: new_core(tree, &config),
            view: ClusterView::new(&config.scheduler_name, cache, Objects { queues, owners, ..Objects::default() }),
            adopted: None,
            config,
            api: ApiClients { client, election: election_client, effects: Arc::new(effects), compute_domains: None },
            shared: Shared { registry, metrics },
            next: Next {
                dirty: true,
                stale_nodes: AHashSet::new(),
                all_pod_labels: false,
                not_before: AHashMap::new(),
                dra_waiting: AHashSet::new(),
                dra_not_now: AHashMap::new(),
                dra_submitted: AHashSet::new(),
                dra_avoid: AHashMap::new(),
                mixed: AHashMap::new(),
                gang_min: AHashMap::new(),
                regroup: false,
            },
            timers: Timers {
                clock: now,
                last_cycle: now,
                gauges_at: now,
                core_wakeup: None,
                wakeup_at: now,
                status_at: now,
                dashboard_at: now,
            },
            reports: Reports {
                status: StatusWriter::new(status_client),
                pod_status: None,
                reported: AHashMap::new(),
                attempts: AHashMap::new(),
                unconfirmed: AHashMap::new(),
                runs: AHashMap::new(),
                ended_standing_by: std::collections::VecDeque::new(),
                shares: decisions::Shares::default(),
                described: Default::default(),
                events: None,
                observers: Vec::new(),
                decided: 0,
                dashboard: None,
                topology_text: Arc::default(),
                dra_devices: Arc::default(),
                queue_history: Arc::default(),
                queue_sampled: None,
                gpu_figures: Vec::new(),
                gpu_figures_at: None,
                allocation: Default::default(),
            },
            leadership: Leadership { leader, _always: Some(always) },
        }
    }

    /// Carries the decisions' writes out through `executor` instead of the API server's
    /// [`Effects`] ([`crate::executor::Recording`]: in memory). The `Queue` and `PodGroup` status,
    /// `ComputeDomain`s and the Lease still go to the clients' API server.
    pub fn with_executor(mut self, executor: Arc<dyn Executor>) -> Scheduler {
        self.api.effects = executor;
        self
    }

    /// `observer` follows every decision and run this scheduler publishes (with or without an
    /// event sink): the usage meter behind `/metrics` (`wasmsched_usage::exporter`).
    pub fn with_observer(mut self, observer: Arc<dyn wasmsched_events::Observer>) -> Scheduler {
        self.reports.observers.push(observer);
        self
    }

    /// Publishes every decision (`task-scheduled` once bound, `task-unschedulable` with the
    /// reasons of every stage, `task-preempted`, `group-timed-out`, plugin faults) on `events`.
    pub fn with_events(mut self, events: EventSink) -> Scheduler {
        self.reports.events = Some(events);
        self
    }

    /// Runs until `stop` changes (or its sender is dropped): starts the election if configured,
    /// watches the API server, decides and binds; on stop, waits for binds in flight and releases
    /// the lease.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let watches = Watches::open(&self.api.client, &self.config).await;
        self.run_with(watches, stop).await
    }

    /// [`Scheduler::run`] over `watches` made elsewhere: the loop's whole input.
    pub async fn run_with(mut self, watches: Watches, mut stop: watch::Receiver<bool>) {
        self.stream_decisions();
        let (stop_election, election) = match self.config.lease.clone() {
            Some(lease) => {
                let (elector, leader) = Elector::new(self.api.election.clone(), lease);
                self.leadership.leader = leader;
                let (tx, rx) = watch::channel(false);
                (Some(tx), Some(tokio::spawn(elector.run(rx))))
            }
            None => (None, None),
        };
        self.reports.pod_status =
            Some(PodStatusWriter::start(self.api.effects.clone(), self.leadership.leader.clone()));
        self.api.compute_domains = Some(crate::compute_domains::ComputeDomains::start(
            self.api.client.clone(),
            self.leadership.leader.clone(),
        ));
        let Watches {
            mut nodes,
            mut pods,
            mut groups,
            mut queues,
            mut flavors,
            priority_classes: mut classes,
            mut budgets,
            mut slices,
            mut device_classes,
            mut claims,
            mut taint_rules,
            mut owners,
            pod_groups: mut foreign_groups,
            pod_group_apis,
        } = watches;
        self.view.objects.pod_groups = crate::groups::podgroups::PodGroups::new(pod_group_apis);
        let mut was_leading = false;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.shared.metrics.beat();
            let leading = *self.leadership.leader.borrow();
            self.shared.metrics.leader.set(i64::from(leading));
            if leading && !was_leading && self.adopted.is_some() {
                self.take_over_again();
            }
            if was_leading && !leading {
                self.runs_handed_over();
            }
            was_leading = leading;
            self.maybe_adopt();
            let ready = self.adopted.is_some();
            // The core's next timer walks every workload: asked at most every 200 ms (its
            // clock has whole seconds) and after each cycle, not on every watch event.
            if self.timers.wakeup_at.elapsed() >= Duration::from_millis(200)
                || self.timers.wakeup_at < self.timers.last_cycle
            {
                self.timers.core_wakeup = self.core.next_wakeup();
                self.timers.wakeup_at = Instant::now();
            }
            let resubmit = self.next.not_before.values().copied().min();
            let wakeup = match (self.timers.core_wakeup, resubmit) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            // Core time moves in whole seconds: a timer never runs the cycle twice in one (work
            // the fair-share plugin left unserved is due at once, every time).
            let wakeup = wakeup.map(|t| {
                (self.timers.clock + Duration::from_secs(t)).max(self.timers.last_cycle + Duration::from_secs(1))
            });
            let due = wakeup.is_some_and(|w| w <= Instant::now());
            let runnable = leading && ready && (self.next.dirty || due);
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                Some(done) = self.in_flight.done_rx.recv() => self.done(done),
                Some(event) = nodes.next() => {
                    self.watched(|view| view.node_event(event));
                    self.offer_sample();
                }
                Some(event) = pods.next() => self.watched(|view| view.pod_event(event)),
                Some(event) = groups.next() => self.watched(|view| view.group_event(event)),
                Some((kind, event)) = owners.next() => self.watched(|view| view.owner_event(kind, event)),
                Some((i, event)) = foreign_groups.next() => self.watched(|view| view.pod_group_event(i, event)),
                Some(event) = queues.next() => self.watched(|view| view.queue_event(event)),
                Some(event) = flavors.next() => self.watched(|view| view.flavor_event(event)),
                Some(event) = classes.next() => self.watched(|view| view.priority_class_event(event)),
                Some(event) = budgets.next() => self.watched(|view| view.budget_event(event)),
                Some(event) = slices.next() => self.watched(|view| view.dra_event(event, crate::dra::Dra::slice_event)),
                Some(event) = device_classes.next() => {
                    self.watched(|view| view.dra_event(event, crate::dra::Dra::class_event))
                }
                Some(event) = claims.next() => self.watched(|view| view.dra_event(event, crate::dra::Dra::claim_event)),
                Some(event) = taint_rules.next() => self.watched(|view| view.taint_rule_event(event)),
                Ok(()) = self.leadership.leader.changed() => self.next.dirty = true,
                _ = std::future::ready(()), if runnable => self.cycle(),
                _ = sleep_until(wakeup), if leading && ready && wakeup.is_some() => {}
                _ = tick.tick() => {}
            }
            self.shared.metrics.set_ready(self.view.synced.nodes && self.view.synced.pods);
            if self.timers.gauges_at.elapsed() >= Duration::from_millis(500) {
                self.update_gauges();
            }
            self.publish_dashboard();
            if leading && ready && self.timers.status_at.elapsed() >= STATUS_EVERY {
                self.want_compute_domains();
                self.write_statuses();
            } else if !leading {
                self.reports.status.reset();
            }
        }
        tracing::info!(decided = self.reports.decided, "stopping: waiting for binds in flight");
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            self.in_flight.binds.acquire_many(self.config.bind_concurrency.max(1) as u32),
        )
        .await;
        if let (Some(tx), Some(election)) = (stop_election, election) {
            let _ = tx.send(true);
            let _ = election.await;
        }
    }

    /// Core time: whole seconds since this scheduler started.
    fn now(&self) -> u64 {
        self.timers.clock.elapsed().as_secs()
    }

    /// Pods decided so far.
    pub fn decided(&self) -> u64 {
        self.reports.decided
    }
}

/// The condition's message: the explanation without its attempt count, so it changes only when
/// the reason does.
fn reason(e: &Explanation) -> String {
    Explanation { attempts: 0, retry_at: None, ..e.clone() }.to_string()
}

fn policy_ref(live: &wasmsched_registry::PolicyVersion) -> PolicySetRef {
    PolicySetRef { name: live.spec.name.clone(), version: live.version }
}

fn key_of(task: &Task) -> PodKey {
    let name = task.id.split_once('/').map_or(task.id.as_str(), |(_, n)| n);
    PodKey { namespace: task.namespace.clone(), name: name.to_string() }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

fn key_of_id(id: &str) -> PodKey {
    let (namespace, name) = id.split_once('/').unwrap_or(("default", id));
    PodKey { namespace: namespace.into(), name: name.into() }
}
