//! The scheduling loop against a cluster. Watch streams feed two views: the [`Cache`] (every pod's
//! usage on every node, plus binds in flight) and the [`SchedulerCore`] (this scheduler's pods as
//! workloads in their queues; each node as what everyone else leaves free). The leader runs the
//! core's cycle whenever something changed or one of its timers is due, and carries out its
//! decisions: binds, `PodScheduled=False` with the explanation, checkpoint requests, evictions
//! through the Eviction API. Non-leaders keep both views warm so a fail-over is instant.
//!
//! One task owns the views (no locks on the hot path); API writes run concurrently, binds at most
//! `bind_concurrency` at once, and report back on a channel.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ahash::{AHashMap, AHashSet};
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
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
use crate::cache::{Cache, PodPhase, pod_id};
use crate::convert::{self, PodKey};
use crate::crd::{PodGroup, PodGroupPhase, Queue, QueueStatus, ResourceFlavor};
use crate::disruption::Budgets;
use crate::leader::{Elector, LeaseConfig};
use crate::metrics::{BindLabels, Metrics, QueueLabels};
use crate::pod_status::PodStatusWriter;
use crate::priorities::PriorityClasses;
use crate::queues::{Flavors, Queues};
use crate::status::{self, StatusWriter};
use crate::throttle::Clients;
use crate::workloads::{self, GroupInfo, PodFacts, group_key};

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
        }
    }
}

/// What API writes report back to the loop.
enum Done {
    Bind {
        id: String,
        result: Result<(), EffectError>,
        took: Duration,
        decided_in: Duration,
    },
    /// An eviction was refused until we gave up: the victim still runs and counts again.
    EvictionAbandoned {
        id: String,
    },
}

/// A re-list in progress: what it has listed so far.
#[derive(Default)]
struct Relist {
    nodes: Option<AHashSet<String>>,
    pods: Option<AHashSet<String>>,
    queues: Option<AHashSet<String>>,
    flavors: Option<AHashSet<String>>,
    priority_classes: Option<AHashSet<String>>,
    budgets: Option<AHashSet<String>>,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
struct Synced {
    nodes: bool,
    pods: bool,
    queues: bool,
    flavors: bool,
    priority_classes: bool,
    budgets: bool,
}

/// The scheduler: the two views, the policy registry and the API effects.
pub struct Scheduler {
    config: SchedulerConfig,
    client: Client,
    /// The Lease's own client: renewals never queue behind `client`'s writes.
    election_client: Client,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    effects: Effects,
    cache: Cache,
    core: SchedulerCore,
    /// Our pods (pending and bound), by `namespace/name`.
    ours: AHashMap<String, PodFacts>,
    groups: AHashMap<String, GroupInfo>,
    queues: Queues,
    flavors: Flavors,
    priority_classes: PriorityClasses,
    budgets: Budgets,
    /// Workloads withdrawn as victims: a disruption budget protects one of their pods.
    withdrawn: AHashSet<String>,
    relist: Relist,
    synced: Synced,
    /// Synced since then; bound pods of ours were taken over by the core at that moment.
    adopted: Option<Instant>,
    /// Nodes whose usage by others changed: the core sees them again before the next cycle.
    stale_nodes: AHashSet<String>,
    /// A pod of ours has pod (anti-)affinity terms of its own: the core needs every other pod's
    /// labels; until then only others' pods with anti-affinity (their terms apply to everyone).
    all_pod_labels: bool,
    /// Victims evicted and not gone yet: the core holds their room (as terminating) until their
    /// pod is deleted, so the node's background leaves them out.
    evicting: AHashSet<String>,
    /// Pods or groups not to submit before this core time (refused, or a gang that timed out).
    not_before: AHashMap<String, u64>,
    /// Last reason written on each pending pod: the condition is patched only when it changes.
    reported: AHashMap<String, String>,
    /// Failed attempts per workload, for the `task-scheduled` event's attempt number.
    attempts: AHashMap<String, u32>,
    /// Something changed that may change a decision.
    dirty: bool,
    clock: Instant,
    last_cycle: Instant,
    gauges_at: Instant,
    /// [`SchedulerCore::next_wakeup`] as of `wakeup_at`.
    core_wakeup: Option<u64>,
    wakeup_at: Instant,
    status: StatusWriter,
    status_at: Instant,
    /// `PodScheduled=False` on pending pods: coalesced, ordered, retried (started by `run`, with
    /// the leadership it follows).
    pod_status: Option<PodStatusWriter>,
    /// Why the last queue change was refused.
    queue_error: Option<String>,
    leader: watch::Receiver<bool>,
    /// Holds leadership at `true` when there is no election.
    _always_leader: Option<watch::Sender<bool>>,
    binds: Arc<Semaphore>,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    decided: u64,
    events: Option<EventSink>,
    /// `task-scheduled` events waiting for their bind to succeed.
    unconfirmed: AHashMap<String, Vec<Payload>>,
}

/// How often the leader brings `Queue` and `PodGroup` status up to date.
const STATUS_EVERY: Duration = Duration::from_secs(2);

/// Adoption (and so the first cycle) waits this long for the Queue, PriorityClass and
/// PodDisruptionBudget lists: priorities and protected victims are known before anything is
/// decided (a cluster without the CRD never sends the first; RBAC may deny the others).
const QUEUE_SYNC_GRACE: Duration = Duration::from_secs(5);

impl Scheduler {
    /// A scheduler for the cluster of `clients`, deciding with `registry`'s live policy set.
    pub fn new(clients: Clients, registry: Arc<Registry>, metrics: Arc<Metrics>, config: SchedulerConfig) -> Scheduler {
        let Clients { api: client, events, election: election_client } = clients;
        let identity = config.lease.as_ref().map_or_else(|| config.scheduler_name.clone(), |l| l.identity.clone());
        let mut effects = Effects::new(client.clone(), &config.scheduler_name, &identity);
        if let Some(events) = events {
            effects = effects.with_event_client(events, &identity);
        }
        let status_client = client.clone();
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (always, leader) = watch::channel(config.lease.is_none());
        metrics.observe_policies(registry.clone());
        let queues = Queues::default();
        let tree = queues.tree(&Flavors::default()).0.expect("the implicit default queue alone is a valid tree");
        Scheduler {
            binds: Arc::new(Semaphore::new(config.bind_concurrency.max(1))),
            core: SchedulerCore::new(tree, config.core.clone()),
            config,
            client,
            election_client,
            registry,
            metrics,
            effects,
            cache: Cache::new(),
            ours: AHashMap::new(),
            groups: AHashMap::new(),
            queues,
            flavors: Flavors::default(),
            priority_classes: PriorityClasses::default(),
            budgets: Budgets::default(),
            withdrawn: AHashSet::new(),
            relist: Relist::default(),
            synced: Synced::default(),
            adopted: None,
            stale_nodes: AHashSet::new(),
            all_pod_labels: false,
            evicting: AHashSet::new(),
            not_before: AHashMap::new(),
            reported: AHashMap::new(),
            attempts: AHashMap::new(),
            dirty: true,
            clock: Instant::now(),
            last_cycle: Instant::now(),
            gauges_at: Instant::now(),
            core_wakeup: None,
            wakeup_at: Instant::now(),
            status: StatusWriter::new(status_client),
            status_at: Instant::now(),
            pod_status: None,
            queue_error: None,
            leader,
            _always_leader: Some(always),
            done_tx,
            done_rx,
            decided: 0,
            events: None,
            unconfirmed: AHashMap::new(),
        }
    }

    /// Publishes every decision (`task-scheduled` once bound, `task-unschedulable` with the
    /// reasons of every stage, `task-preempted`, `group-timed-out`, plugin faults) on `events`.
    pub fn with_events(mut self, events: EventSink) -> Scheduler {
        self.events = Some(events);
        self
    }

    /// Runs until `stop` changes (or its sender is dropped): starts the election if configured,
    /// watches, decides and binds; on stop, waits for binds in flight and releases the lease.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> anyhow::Result<()> {
        let (stop_election, election) = match self.config.lease.clone() {
            Some(lease) => {
                let (elector, leader) = Elector::new(self.election_client.clone(), lease);
                self.leader = leader;
                let (tx, rx) = watch::channel(false);
                (Some(tx), Some(tokio::spawn(elector.run(rx))))
            }
            None => (None, None),
        };
        self.pod_status = Some(PodStatusWriter::start(self.effects.clone(), self.leader.clone()));
        let nodes = watch_stream(Api::<KubeNode>::all(self.client.clone()), watcher::Config::default());
        // Finished pods hold nothing; leaving them out of the list is most of a big cluster's pods.
        let pod_config = watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let pods = watch_stream(Api::<Pod>::all(self.client.clone()), pod_config);
        let groups = watch_stream(Api::<PodGroup>::all(self.client.clone()), watcher::Config::default());
        let queues = watch_stream(Api::<Queue>::all(self.client.clone()), watcher::Config::default());
        let flavors = watch_stream(Api::<ResourceFlavor>::all(self.client.clone()), watcher::Config::default());
        let classes = watch_stream(Api::<PriorityClass>::all(self.client.clone()), watcher::Config::default());
        let budgets = watch_stream(Api::<PodDisruptionBudget>::all(self.client.clone()), watcher::Config::default());
        tokio::pin!(nodes, pods, groups, queues, flavors, classes, budgets);
        let mut was_leading = false;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.metrics.beat();
            let leading = *self.leader.borrow();
            self.metrics.leader.set(i64::from(leading));
            if leading && !was_leading && self.adopted.is_some() {
                self.take_over_again();
            }
            was_leading = leading;
            self.maybe_adopt();
            let ready = self.adopted.is_some();
            // The core's next timer walks every workload: asked at most every 200 ms (its
            // clock has whole seconds) and after each cycle, not on every watch event.
            if self.wakeup_at.elapsed() >= Duration::from_millis(200) || self.wakeup_at < self.last_cycle {
                self.core_wakeup = self.core.next_wakeup();
                self.wakeup_at = Instant::now();
            }
            let resubmit = self.not_before.values().copied().min();
            let wakeup = match (self.core_wakeup, resubmit) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            // Core time moves in whole seconds: a timer never runs the cycle twice in one (work
            // the fair-share plugin left unserved is due at once, every time).
            let wakeup =
                wakeup.map(|t| (self.clock + Duration::from_secs(t)).max(self.last_cycle + Duration::from_secs(1)));
            let due = wakeup.is_some_and(|w| w <= Instant::now());
            let runnable = leading && ready && (self.dirty || due);
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                Some(done) = self.done_rx.recv() => self.done(done),
                Some(event) = nodes.next() => self.node_event(event),
                Some(event) = pods.next() => self.pod_event(event),
                Some(event) = groups.next() => self.group_event(event),
                Some(event) = queues.next() => self.queue_event(event),
                Some(event) = flavors.next() => self.flavor_event(event),
                Some(event) = classes.next() => self.priority_class_event(event),
                Some(event) = budgets.next() => self.budget_event(event),
                Ok(()) = self.leader.changed() => self.dirty = true,
                _ = std::future::ready(()), if runnable => self.cycle(),
                _ = sleep_until(wakeup), if leading && ready && wakeup.is_some() => {}
                _ = tick.tick() => {}
            }
            self.metrics.set_ready(self.synced.nodes && self.synced.pods);
            if self.gauges_at.elapsed() >= Duration::from_millis(500) {
                self.update_gauges();
            }
            if leading && ready && self.status_at.elapsed() >= STATUS_EVERY {
                self.write_statuses();
            } else if !leading {
                self.status.reset();
            }
        }
        tracing::info!(decided = self.decided, "stopping: waiting for binds in flight");
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            self.binds.acquire_many(self.config.bind_concurrency.max(1) as u32),
        )
        .await;
        if let (Some(tx), Some(election)) = (stop_election, election) {
            let _ = tx.send(true);
            let _ = election.await;
        }
        Ok(())
    }

    /// `Queue` and `PodGroup` status: allocation, counts, phase and the reason (leader only).
    fn write_statuses(&mut self) {
        self.status_at = Instant::now();
        let shares = self.core.queue_shares();
        let counts = self.core.queue_tasks();
        let (_, errors) = self.queues.tree(&self.flavors);
        let names: Vec<String> = self.queues.names().map(String::from).collect();
        for name in names {
            let status = match shares.iter().position(|s| s.name == name) {
                Some(i) => QueueStatus {
                    conditions: vec![status::condition("Ready", true, "Accepted", "in the queue tree")],
                    allocated: status::resource_list(&shares[i].allocated),
                    flavors: self
                        .core
                        .queues()
                        .flavors()
                        .iter()
                        .map(|f| {
                            (f.name.clone(), status::resource_list(&flavored_amount(&shares[i].allocated, &f.name)))
                        })
                        .filter(|(_, list)| !list.is_empty())
                        .collect(),
                    pending: counts[i].0 as u32,
                    running: counts[i].1 as u32,
                },
                None => {
                    let message = errors
                        .get(&name)
                        .or(self.queue_error.as_ref())
                        .map_or("not in the queue tree", String::as_str)
                        .to_string();
                    QueueStatus {
                        conditions: vec![status::condition("Ready", false, "Rejected", &message)],
                        ..QueueStatus::default()
                    }
                }
            };
            self.status.queue(&name, status);
        }
        // Pods of each group the core does not have yet: (waiting, bound).
        let mut outside: AHashMap<String, (u32, u32)> = AHashMap::new();
        for (id, f) in &self.ours {
            if let Some(g) = group_key(&f.task)
                && self.core.owner_of(id).is_none()
            {
                let c = outside.entry(g).or_default();
                if f.bound { c.1 += 1 } else { c.0 += 1 }
            }
        }
        let keys: Vec<(String, usize)> = self.groups.iter().map(|(k, i)| (k.clone(), i.min_member)).collect();
        for (key, min) in keys {
            let status = match self.core.status(&key) {
                Some(s) => {
                    let pending = self.core.members_of(&key).map_or(0, |m| m.filter(|(_, placed)| !placed).count());
                    let phase = match s.phase {
                        Phase::Running => PodGroupPhase::Running,
                        Phase::TimedOut => PodGroupPhase::TimedOut,
                        Phase::Pending | Phase::Preempting => PodGroupPhase::Pending,
                    };
                    let message = match phase {
                        PodGroupPhase::Running => format!("{} members running (min {min})", s.running),
                        _ => reason(&s.explanation),
                    };
                    status::group_status(phase, s.running as u32, pending as u32, &message)
                }
                None => {
                    let (waiting, bound) = outside.get(&key).copied().unwrap_or_default();
                    let message = format!("{} of {min} members present", waiting + bound);
                    let phase = if bound as usize >= min { PodGroupPhase::Running } else { PodGroupPhase::Pending };
                    status::group_status(phase, bound, waiting, &message)
                }
            };
            self.status.group(&key, status);
        }
    }

    /// Gauges that walk every pod: at most twice a second, never per event.
    fn update_gauges(&mut self) {
        self.gauges_at = Instant::now();
        self.metrics.cache_nodes.set(self.cache.nodes().len() as i64);
        self.metrics.cache_pods.set(self.cache.holders() as i64);
        let (active, backoff, parked) = self.core.pending_tasks(self.now());
        let waiting = self.ours.iter().filter(|(id, f)| !f.bound && self.core.owner_of(id).is_none()).count();
        for (queue, n) in [("active", active), ("backoff", backoff), ("unschedulable", parked), ("gated", waiting)] {
            self.metrics.pending.get_or_create(&QueueLabels { queue }).set(n as i64);
        }
    }

    /// Core time: whole seconds since this scheduler started.
    fn now(&self) -> u64 {
        self.clock.elapsed().as_secs()
    }

    fn node_event(&mut self, event: watcher::Result<Event<KubeNode>>) {
        match event {
            Ok(Event::Init) => self.relist.nodes = Some(AHashSet::new()),
            Ok(Event::InitApply(node)) => {
                if let Some(listed) = self.relist.nodes.as_mut() {
                    listed.insert(node.name_any());
                }
                self.apply_node(&node);
            }
            Ok(Event::InitDone) => {
                let listed = self.relist.nodes.take();
                if let Some(listed) = &listed {
                    let gone: Vec<String> =
                        self.cache.node_names().filter(|n| !listed.contains(*n)).map(String::from).collect();
                    self.stale_nodes.extend(gone);
                }
                self.cache.retain_listed(listed.as_ref(), None);
                self.synced.nodes = true;
                tracing::info!(nodes = self.cache.nodes().len(), "nodes listed");
            }
            Ok(Event::Apply(node)) => self.apply_node(&node),
            Ok(Event::Delete(node)) => {
                self.cache.delete_node(&node.name_any());
                self.stale(node.name_any());
            }
            Err(e) => tracing::warn!(error = %e, "node watch failed; retrying"),
        }
        // Until the core has nodes (before the first cycle), the cache's are the sample.
        if self.registry.wants_sample() && self.core.nodes().is_empty() {
            self.registry.offer_sample(self.cache.nodes());
        }
    }

    fn apply_node(&mut self, node: &KubeNode) {
        let before = self.cache.nodes().slot_of(&node.name_any()).and_then(|s| self.cache.nodes().get(s)).cloned();
        if let Err(e) = self.cache.apply_node(node) {
            tracing::warn!(node = %node.name_any(), error = %e, "ignoring a node that does not convert");
            return;
        }
        let after = self.cache.nodes().slot_of(&node.name_any()).and_then(|s| self.cache.nodes().get(s));
        if before.as_ref() != after {
            self.stale(node.name_any());
        }
    }

    fn stale(&mut self, node: String) {
        self.stale_nodes.insert(node);
        self.dirty = true;
    }

    fn pod_event(&mut self, event: watcher::Result<Event<Pod>>) {
        match event {
            Ok(Event::Init) => self.relist.pods = Some(AHashSet::new()),
            Ok(Event::InitApply(pod)) => {
                if let (Some(listed), Ok(id)) = (self.relist.pods.as_mut(), pod_id(&pod)) {
                    listed.insert(id);
                }
                self.apply_pod(&pod);
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = self.relist.pods.take() {
                    let gone: Vec<String> = self.ours.keys().filter(|id| !listed.contains(*id)).cloned().collect();
                    for id in gone {
                        self.pod_gone(&id);
                    }
                    let before: Vec<(String, String)> = self
                        .cache
                        .node_names()
                        .flat_map(|n| self.cache.holders_on(n).map(move |(id, _, _)| (id.to_string(), n.to_string())))
                        .filter(|(id, _)| !listed.contains(id))
                        .collect();
                    self.cache.retain_listed(None, Some(&listed));
                    for (_, node) in before {
                        self.stale(node);
                    }
                }
                self.synced.pods = true;
                tracing::info!(bound = self.cache.holders(), ours = self.ours.len(), "pods listed");
            }
            Ok(Event::Apply(pod)) => self.apply_pod(&pod),
            Ok(Event::Delete(pod)) => {
                if let Ok(id) = pod_id(&pod) {
                    if let Some(node) = self.cache.node_of(&id).map(String::from) {
                        self.stale(node);
                    }
                    self.cache.delete_pod(&pod);
                    self.pod_gone(&id);
                }
            }
            Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
        }
    }

    /// One of our pods finished or was deleted: it leaves the core (its gang keeps running).
    fn pod_gone(&mut self, id: &str) {
        self.ours.remove(id);
        self.unreport(id);
        if self.evicting.remove(id) && self.core.terminated(id) {
            self.dirty = true;
        }
        if self.core.remove_task(id).is_ok() {
            self.dirty = true;
        }
    }

    fn apply_pod(&mut self, pod: &Pod) {
        let Ok(id) = pod_id(pod) else { return };
        let before = self.cache.node_of(&id).map(String::from);
        let ours =
            pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()) == Some(self.config.scheduler_name.as_str());
        let phase = match self.cache.apply_pod(pod, &self.config.scheduler_name) {
            Ok(phase) => phase,
            Err(e) => {
                // A pod we cannot understand is left alone, never guessed at; if it is ours and
                // waits for a node, its owner is told why on the pod itself.
                tracing::warn!(pod = %id, error = %e, "ignoring a pod that does not convert");
                let pending = pod.spec.as_ref().is_some_and(|s| s.node_name.is_none());
                if ours && pending {
                    // An earlier, readable version of it must not be placed either.
                    if self.ours.contains_key(&id) {
                        self.pod_gone(&id);
                    }
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    self.report_one(&id, &uid, &format!("wasmsched cannot schedule this pod: {e}"));
                }
                return;
            }
        };
        let after = self.cache.node_of(&id).map(String::from);
        if ours && pod.metadata.deletion_timestamp.is_some() && matches!(phase, PodPhase::Bound | PodPhase::Relabelled)
        {
            // Terminating: it holds its room until it is gone, like anyone's pod, and is never
            // taken over or chosen as a victim again (a victim of ours is the core's already).
            self.ours.remove(&id);
            self.unreport(&id);
            if self.core.owner_of(&id).is_some() {
                let _ = self.core.remove_task(&id);
                if let Some(node) = after {
                    self.stale(node);
                }
            }
            return;
        }
        if matches!(phase, PodPhase::Relabelled) {
            if self.core.owner_of(&id).is_some() {
                // Ours: the core holds the labels inter-pod affinity reads of its members.
                if let Ok(task) = crate::convert::bound_task(pod)
                    && self.core.relabel_task(&id, task.labels).unwrap_or(false)
                {
                    self.dirty = true;
                }
            } else if let Some(node) = after.clone() {
                // Others' pods' labels are what inter-pod affinity of ours matches.
                self.stale(node);
            }
        }
        match phase {
            PodPhase::Pending(task) => {
                let facts = PodFacts::new(pod, *task);
                let changed = self.ours.get(&id).is_none_or(|f| f.task != facts.task || f.uid != facts.uid);
                self.ours.insert(id, facts);
                self.dirty |= changed;
            }
            PodPhase::Bound | PodPhase::Relabelled => {
                if ours && let Ok(task) = crate::convert::bound_task(pod) {
                    self.ours.insert(id.clone(), PodFacts::new(pod, task));
                    self.unreport(&id);
                }
                match self.core.placement_of(&id) {
                    Some(node) if Some(node) == after.as_deref() => {
                        if self.ours.get(&id).is_some_and(|f| f.checkpointed) {
                            let now = self.now();
                            if let Ok(decisions) = self.core.checkpoint_done(&id, now) {
                                let live = self.registry.current();
                                self.carry_out(decisions, &live, Duration::ZERO);
                            }
                        }
                    }
                    // Before the take-over every node is shown to the core afresh anyway.
                    _ if self.adopted.is_none() => {}
                    placed => {
                        // Bound where the core did not put it (another scheduler won a race), or a
                        // pod the core never had: a fact the core sees as others' usage.
                        // A running pod's status updates change nothing the core sees.
                        let owned = placed.is_some() || self.core.owner_of(&id).is_some();
                        if owned {
                            let _ = self.core.remove_task(&id);
                        }
                        if owned || before != after {
                            self.stale_nodes.extend(before.into_iter().chain(after));
                            self.dirty = true;
                        }
                    }
                }
            }
            PodPhase::Other => {
                if (self.ours.contains_key(&id) || self.evicting.contains(&id)) && !self.cache.holds(&id) {
                    self.pod_gone(&id);
                }
                if let Some(node) = before.filter(|_| !self.cache.holds(&id)) {
                    self.stale(node);
                }
            }
        }
    }

    fn group_event(&mut self, event: watcher::Result<Event<PodGroup>>) {
        let (Ok(Event::Apply(g) | Event::InitApply(g)) | Ok(Event::Delete(g))) = &event else {
            if let Err(e) = event {
                tracing::warn!(error = %e, "pod group watch failed; retrying");
            }
            return;
        };
        let key = format!("{}/{}", g.namespace().unwrap_or_default(), g.name_any());
        let changed = if matches!(event, Ok(Event::Delete(_))) {
            self.groups.remove(&key).is_some()
        } else {
            let info = GroupInfo::new(g);
            self.groups.insert(key, info.clone()) != Some(info) // a status write changes nothing
        };
        self.dirty |= changed;
    }

    fn queue_event(&mut self, event: watcher::Result<Event<Queue>>) {
        if self.queues.on_event(event, &mut self.relist.queues, &mut self.synced.queues) {
            self.rebuild_queues();
        }
    }

    /// Flavors change what queues' per-flavor quotas mean: the tree is rebuilt (a pod keeps the
    /// flavor it was placed with until it leaves).
    fn flavor_event(&mut self, event: watcher::Result<Event<ResourceFlavor>>) {
        if self.flavors.on_event(event, &mut self.relist.flavors, &mut self.synced.flavors) {
            self.rebuild_queues();
        }
    }

    /// Classes only give workloads submitted from now on their priority (a class's value is
    /// immutable): nothing already submitted changes.
    fn priority_class_event(&mut self, event: watcher::Result<Event<PriorityClass>>) {
        match event {
            Ok(Event::Init) => self.relist.priority_classes = Some(AHashSet::new()),
            Ok(Event::InitApply(pc)) => {
                if let Some(listed) = self.relist.priority_classes.as_mut() {
                    listed.insert(pc.name_any());
                }
                self.priority_classes.apply(&pc);
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = self.relist.priority_classes.take() {
                    self.priority_classes.retain(&listed);
                }
                self.synced.priority_classes = true;
            }
            Ok(Event::Apply(pc)) => {
                self.priority_classes.apply(&pc);
            }
            Ok(Event::Delete(pc)) => self.priority_classes.delete(&pc.name_any()),
            Err(e) => tracing::warn!(error = %e, "priority class watch failed; retrying"),
        }
    }

    /// A budget that changes may protect or release victims: the next cycle looks again.
    fn budget_event(&mut self, event: watcher::Result<Event<PodDisruptionBudget>>) {
        let key = |b: &PodDisruptionBudget| format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any());
        let changed = match event {
            Ok(Event::Init) => {
                self.relist.budgets = Some(AHashSet::new());
                false
            }
            Ok(Event::InitApply(b)) => {
                if let Some(listed) = self.relist.budgets.as_mut() {
                    listed.insert(key(&b));
                }
                self.budgets.apply(&b)
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = self.relist.budgets.take() {
                    self.budgets.retain(&listed);
                }
                self.synced.budgets = true;
                true
            }
            Ok(Event::Apply(b)) => self.budgets.apply(&b),
            Ok(Event::Delete(b)) => self.budgets.delete(&b),
            Err(e) => {
                tracing::warn!(error = %e, "disruption budget watch failed; retrying");
                false
            }
        };
        self.dirty |= changed;
    }

    /// Workloads whose eviction the disruption budgets would refuse (more of a budget's pods than
    /// it allows now, lowest priority offered first) are not offered as victims; the others are
    /// offered again.
    fn offer_victims(&mut self) {
        if self.budgets.is_empty() && self.withdrawn.is_empty() {
            return;
        }
        // One hash lookup per pod outside the namespaces that have a budget.
        let namespaces = self.budgets.namespaces();
        let candidates = self.ours.iter().filter(|(_, f)| f.bound && namespaces.contains(f.task.namespace.as_str()));
        let candidates = candidates.filter_map(|(id, f)| {
            Some(crate::disruption::Candidate {
                workload: self.core.owner_of(id)?,
                namespace: &f.task.namespace,
                labels: &f.labels,
                priority: f.task.priority,
            })
        });
        let withheld = self.budgets.withheld(candidates);
        // Every cycle, not only on change: a workload submitted again starts preemptible.
        for w in &withheld {
            let _ = self.core.set_preemptible(w, false);
        }
        for w in self.withdrawn.difference(&withheld) {
            let _ = self.core.set_preemptible(w, true);
        }
        self.withdrawn = withheld;
    }

    /// The core takes the queue tree the objects describe, unless that would orphan work.
    fn rebuild_queues(&mut self) {
        let (tree, errors) = self.queues.tree(&self.flavors);
        for (queue, error) in errors {
            tracing::warn!(%queue, %error, "leaving out a queue that does not convert");
        }
        match tree.map_err(|e| e.to_string()).and_then(|t| self.core.set_queues(t).map_err(|e| e.to_string())) {
            Ok(()) => {
                self.queue_error = None;
                self.not_before.clear();
                self.dirty = true;
            }
            Err(error) => {
                tracing::warn!(%error, "keeping the previous queue tree");
                self.queue_error = Some(error);
            }
        }
    }

    /// Once nodes and pods are listed (and queues, or the grace for them passed): the core sees
    /// every node and takes over the pods of ours that already run — placed before a restart.
    fn maybe_adopt(&mut self) {
        if self.adopted.is_some() || !(self.synced.nodes && self.synced.pods) {
            return;
        }
        let listed = self.synced.queues && self.synced.flavors && self.synced.priority_classes && self.synced.budgets;
        if !listed && self.clock.elapsed() < QUEUE_SYNC_GRACE {
            return;
        }
        let now = self.now();
        let running: AHashSet<String> = self.ours.iter().filter(|(_, f)| f.bound).map(|(id, _)| id.clone()).collect();
        self.stale_nodes.clear();
        let names: Vec<String> = self.cache.node_names().map(String::from).collect();
        for name in names {
            if let Some(node) = self.background(&name, &running) {
                self.observe(node, now);
            }
        }
        let mut singles = Vec::new();
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for id in &running {
            match group_key(&self.ours[id].task) {
                Some(g) => groups.entry(g).or_default().push(id.clone()),
                None => singles.push(id.clone()),
            }
        }
        let mut refused = Vec::new();
        for id in singles {
            let w = workloads::single(&self.ours[&id], &self.priority_classes);
            let placed: Vec<_> = self.placed(std::slice::from_ref(&id));
            if let Err(e) = self.core.adopt(w, &placed, now) {
                refused.push((id, e.to_string()));
            }
        }
        for (key, bound) in groups {
            // Its pending members join it; they are placed as capacity allows.
            let pending: Vec<String> = self
                .ours
                .iter()
                .filter(|(_, f)| !f.bound && group_key(&f.task).as_deref() == Some(key.as_str()))
                .map(|(id, _)| id.clone())
                .collect();
            let info = self.groups.get(&key).cloned().unwrap_or(GroupInfo {
                min_member: bound.len(),
                topology_key: None,
                queue: None,
                priority: None,
                priority_class: None,
                timeout_seconds: None,
            });
            let members: Vec<&PodFacts> = bound.iter().chain(&pending).map(|id| &self.ours[id]).collect();
            let w = workloads::gang(&key, &info, &members, &self.priority_classes);
            let placed = self.placed(&bound);
            if let Err(e) = self.core.adopt(w, &placed, now) {
                refused.extend(bound.into_iter().map(|id| (id, e.to_string())));
            }
        }
        for (id, error) in refused {
            // Not taken over: it still runs, and counts as others' usage.
            tracing::warn!(pod = %id, %error, "a running pod of ours was not taken over");
            if let Some(node) = self.cache.node_of(&id).map(String::from) {
                self.stale_nodes.insert(node);
            }
        }
        let (adopted, pending) = (running.len(), self.ours.len() - running.len());
        if *self.leader.borrow() {
            tracing::info!(adopted, pending, "leading: took over the running pods of ours");
        } else {
            // A standby only keeps its view current; it takes over when it gets the lease.
            tracing::info!(adopted, pending, "standing by: running pods of ours known");
        }
        self.adopted = Some(Instant::now());
        self.dirty = true;
    }

    /// A follower that becomes the leader starts its core afresh: the pods the previous leader
    /// bound meanwhile are taken over like after a restart, so they count in their queues.
    fn take_over_again(&mut self) {
        tracing::info!("leading: taking over the pods bound meanwhile");
        let tree = match self.queues.tree(&self.flavors).0 {
            Ok(tree) => tree,
            Err(_) => {
                Queues::default().tree(&Flavors::default()).0.expect("the implicit default queue alone is a valid tree")
            }
        };
        self.core = SchedulerCore::new(tree, self.config.core.clone());
        self.adopted = None;
        self.not_before.clear();
        self.reported.clear();
        self.attempts.clear();
        self.evicting.clear();
        self.stale_nodes.clear();
        self.withdrawn.clear();
        self.dirty = true;
    }

    fn placed(&self, ids: &[String]) -> Vec<(String, String, Vec<DeviceShare>)> {
        ids.iter()
            .filter_map(|id| {
                let (node, devices) = self.cache.holding(id)?;
                Some((id.clone(), node.to_string(), devices.to_vec()))
            })
            .collect()
    }

    /// Node `name` as the core sees it: what pods the core does not manage hold. Members of the
    /// core (and `also`, pods about to be taken over) and victims being evicted are left out.
    fn background(&self, name: &str, also: &AHashSet<String>) -> Option<Node> {
        let slot = self.cache.nodes().slot_of(name)?;
        let mut node = self.cache.nodes().get(slot)?.clone();
        for (id, task, devices) in self.cache.holders_on(name) {
            if self.core.owner_of(id).is_some() || self.evicting.contains(id) || also.contains(id) {
                release(&mut node, task, devices);
            }
        }
        Some(node)
    }

    fn observe(&mut self, node: Node, now: u64) -> Vec<Decision> {
        let name = node.name.clone();
        let topology = self.cache.nodes().topologies().get(&name).cloned();
        self.core.set_topology(&name, topology);
        let others = self.others_on(&name);
        self.core.observe_pods(&name, others);
        self.core.observe_node(node, now)
    }

    /// Others' pods on `node` as inter-pod affinity needs them (ours are the core's own members).
    fn others_on(&self, node: &str) -> Vec<RunningPod> {
        self.cache
            .holders_on(node)
            .filter(|(id, _, _)| !self.ours.contains_key(*id) && self.core.owner_of(id).is_none())
            .filter(|(_, t, _)| self.all_pod_labels || !t.pod_terms().anti_affinity.is_empty())
            .map(|(_, t, _)| RunningPod {
                namespace: t.namespace.clone(),
                labels: t.labels.clone(),
                anti_affinity: t.pod_terms().anti_affinity.clone(),
            })
            .collect()
    }

    /// The core sees again the nodes whose usage by others changed (or that left).
    fn refresh_nodes(&mut self, now: u64) -> Vec<Decision> {
        let mut out = Vec::new();
        let none = AHashSet::new();
        for name in std::mem::take(&mut self.stale_nodes) {
            match self.background(&name, &none) {
                Some(node) => out.extend(self.observe(node, now)),
                None if self.core.nodes().slot_of(&name).is_some() => out.extend(self.core.remove_node(&name, now)),
                None => {}
            }
        }
        out
    }

    /// Our pending pods the core does not have yet become workloads: lone pods at once, groups
    /// once their `PodGroup` is known and min-member of them exist (later members join).
    fn submit_pending(&mut self, now: u64) {
        self.not_before.retain(|_, t| *t > now);
        // The first pod of ours with pod affinity of its own: from now on the core sees every
        // other pod's labels (before this pod is tried).
        if !self.all_pod_labels && self.ours.values().any(|f| !f.bound && !f.task.pod_terms().is_empty()) {
            self.all_pod_labels = true;
            let names: Vec<String> = self.cache.node_names().map(String::from).collect();
            for name in names {
                let others = self.others_on(&name);
                self.core.observe_pods(&name, others);
            }
        }
        let mut singles = Vec::new();
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (id, f) in &self.ours {
            if f.bound || self.core.owner_of(id).is_some() {
                continue;
            }
            let key = group_key(&f.task);
            let wait_key = key.as_deref().unwrap_or(id);
            if self.not_before.get(wait_key).is_some_and(|t| *t > now) {
                continue;
            }
            match key {
                Some(g) => groups.entry(g).or_default().push(id.clone()),
                None => singles.push(id.clone()),
            }
        }
        // Oldest first (then by name): the core serves a queue's equal priorities in submission
        // order, so that order must be the pods', not a hash map's.
        let age = |id: &String| (self.ours[id].created, id.clone());
        singles.sort_by_key(age);
        let mut groups: Vec<(String, Vec<String>)> = groups.into_iter().collect();
        groups.sort_by_key(|(_, ids)| ids.iter().map(age).min());
        let retry = now + self.config.resubmit_after.as_secs().max(1);
        for id in singles {
            if let Err(e) = self.core.submit(workloads::single(&self.ours[&id], &self.priority_classes), now) {
                self.not_before.insert(id.clone(), retry);
                self.report(&[id], &e.to_string());
            }
        }
        for (key, mut ids) in groups {
            ids.sort();
            if self.core.status(&key).is_some() {
                let tasks = ids.iter().map(|id| self.ours[id].task_with_priority(&self.priority_classes)).collect();
                if let Err(e) = self.core.add_members(&key, tasks) {
                    self.not_before.insert(key, retry);
                    self.report(&ids, &e.to_string());
                }
                continue;
            }
            let Some(info) = self.groups.get(&key).cloned() else {
                self.report(&ids, &format!("waiting for PodGroup {key}"));
                continue;
            };
            if ids.len() < info.min_member {
                // The same words on every member however many have arrived (one write each); the
                // count is on the PodGroup's status, written at most every few seconds.
                let msg = format!(
                    "pod group {key}: waiting for its {} members to exist (the PodGroup's status counts them)",
                    info.min_member
                );
                self.report(&ids, &msg);
                continue;
            }
            let members: Vec<&PodFacts> = ids.iter().map(|id| &self.ours[id]).collect();
            if let Err(e) = self.core.submit(workloads::gang(&key, &info, &members, &self.priority_classes), now) {
                self.not_before.insert(key, retry);
                self.report(&ids, &e.to_string());
            }
        }
    }

    /// One cycle: the core sees what changed, new pods are submitted, the core decides.
    fn cycle(&mut self) {
        self.dirty = false;
        self.last_cycle = Instant::now();
        let now = self.now();
        // With warm-up, a staged version catches up a step on the table the last cycle decided
        // on, and goes live here, between cycles, once it has (a no-op otherwise).
        self.registry.warm(self.core.nodes());
        let live = self.registry.current();
        let refreshed = self.refresh_nodes(now);
        self.carry_out(refreshed, &live, Duration::ZERO);
        // The table the cycle decides on: a version prepared on it needs only its later deltas.
        if self.registry.wants_sample() {
            self.registry.offer_sample(self.core.nodes());
        }
        self.submit_pending(now);
        self.offer_victims();
        let started = Instant::now();
        let decisions = self.core.schedule(&live.set, now);
        let each = started.elapsed() / decisions.len().max(1) as u32;
        self.carry_out(decisions, &live, each);
        self.dirty |= self.core.more_ready();
    }

    /// Carries out the core's decisions, in order.
    fn carry_out(&mut self, decisions: Vec<Decision>, live: &Arc<PolicyVersion>, each: Duration) {
        let policy = policy_ref(live);
        let mut nominated = AHashSet::new();
        for d in decisions {
            match &d {
                Decision::Bound { workload, task, node, devices, score, feasible, faults } => {
                    let Some(facts) = self.ours.get(task).cloned() else {
                        tracing::warn!(pod = %task, "bound a pod that is gone; the bind will fail");
                        continue;
                    };
                    let attempt = self.attempts.remove(workload).unwrap_or(0) + 1;
                    if let Some(slot) = self.cache.nodes().slot_of(node) {
                        let placement = Placement {
                            node: slot,
                            devices: devices.clone(),
                            score: *score,
                            feasible: *feasible,
                            skipped_faults: faults.clone(),
                        };
                        let observed = Observed {
                            task: &facts.task,
                            nodes: self.cache.nodes(),
                            result: &Ok(placement),
                            latency: each,
                        };
                        self.registry.record(live, observed);
                        self.cache.assume(slot, &facts.task, devices);
                    }
                    if self.events.is_some() {
                        let cycle_facts = self.facts(&facts.task, attempt);
                        let payloads = decisions::cycle(&d, &cycle_facts, self.cache.nodes(), &policy);
                        self.unconfirmed.insert(task.clone(), payloads);
                    }
                    self.decided += 1;
                    self.start_bind(&facts, node.clone(), devices.clone(), each);
                }
                Decision::Unschedulable { workload, explanation } => {
                    let Some(waiting): Option<Vec<Task>> = self
                        .core
                        .members_of(workload)
                        .map(|m| m.filter(|(_, placed)| !placed).map(|(t, _)| t.clone()).collect())
                    else {
                        continue;
                    };
                    self.attempts.insert(workload.clone(), explanation.attempts);
                    for _ in &waiting {
                        self.metrics.attempt("unschedulable", each);
                    }
                    if let (Some(first), Some(diagnosis)) = (waiting.first(), &explanation.nodes) {
                        let result = Err(Unschedulable { diagnosis: diagnosis.clone() });
                        let observed =
                            Observed { task: first, nodes: self.cache.nodes(), result: &result, latency: each };
                        self.registry.record(live, observed);
                    }
                    if let (Some(sink), Some(first)) = (&self.events, waiting.first()) {
                        for p in
                            decisions::cycle(&d, &self.facts(first, explanation.attempts), self.cache.nodes(), &policy)
                        {
                            sink.emit(p);
                        }
                    }
                    let ids: Vec<String> = waiting.iter().map(|t| t.id.clone()).collect();
                    self.report(&ids, &reason(explanation));
                }
                Decision::PreemptionRequested { task, preemptor, deadline, .. } => {
                    let wall =
                        k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(deadline.saturating_sub(self.now()));
                    let (effects, key, preemptor) = (self.effects.clone(), key_of_id(task), preemptor.clone());
                    if *self.leader.borrow() {
                        tokio::spawn(async move {
                            if let Err(e) = effects.request_checkpoint(&key, &preemptor, &wall.to_string()).await {
                                tracing::warn!(pod = %key, error = %e, "could not ask for a checkpoint; evicted at the deadline");
                            }
                        });
                    }
                }
                Decision::Evicted { workload, task, reason, .. } => {
                    if let Some(sink) = &self.events
                        && let Some(victim) = self.ours.get(task)
                    {
                        let preemptor = match reason {
                            EvictReason::Preempted { preemptor, .. } => {
                                self.core.members_of(preemptor).and_then(|mut m| m.next().map(|(t, _)| t.clone()))
                            }
                            _ => None,
                        };
                        let grace = victim.checkpoint.map(|g| g.unwrap_or(self.config.core.checkpoint_grace_seconds));
                        let facts = CycleFacts {
                            preemptor: preemptor.as_ref(),
                            grace_seconds: grace,
                            ..self.facts(&victim.task, 0)
                        };
                        for p in decisions::cycle(&d, &facts, self.cache.nodes(), &policy) {
                            sink.emit(p);
                        }
                    }
                    let _ = workload;
                    // Evicted pods do not come back (their controller makes new ones): the core
                    // forgets the task now and holds its room as terminating until the pod is gone.
                    let _ = self.core.remove_task(task);
                    if !matches!(reason, EvictReason::NodeLost) {
                        self.evicting.insert(task.clone());
                        self.start_eviction(task, reason);
                    }
                    if let EvictReason::Preempted { preemptor, .. } = reason {
                        nominated.insert(preemptor.clone());
                    }
                }
                Decision::TimedOut { workload } => {
                    let members: Vec<Task> =
                        self.core.members_of(workload).map(|m| m.map(|(t, _)| t.clone()).collect()).unwrap_or_default();
                    if let (Some(sink), Some(first)) = (&self.events, members.first()) {
                        let status = self.core.status(workload);
                        let facts = CycleFacts {
                            min_member: members.len() as u32,
                            placed: status.map_or(0, |s| s.explanation.gang.map_or(0, |g| g.0 as u32)),
                            ..self.facts(first, 0)
                        };
                        for p in decisions::cycle(&d, &facts, self.cache.nodes(), &policy) {
                            sink.emit(p);
                        }
                    }
                    // Given up for a while, not for good: pods in Kubernetes wait as long as they exist.
                    let _ = self.core.finish(workload);
                    let retry = self.now() + self.config.resubmit_after.as_secs().max(1);
                    self.not_before.insert(workload.clone(), retry);
                    let ids: Vec<String> = members.iter().map(|t| t.id.clone()).collect();
                    self.report(&ids, &format!("pod group {workload} timed out waiting to be placed; retrying"));
                }
                Decision::Fault(f) => {
                    tracing::warn!(fault = %f, "plugin fault");
                    if let Some(sink) = &self.events {
                        let any = Task::default();
                        for p in decisions::cycle(&d, &self.facts(&any, 0), self.cache.nodes(), &policy) {
                            sink.emit(p);
                        }
                    }
                }
            }
        }
        for workload in nominated {
            self.nominate(&workload);
        }
    }

    /// A preemptor waits for its victims to go: its pods say so, and name the node(s) kept for
    /// them in `status.nominatedNodeName`, as kube-scheduler's do.
    fn nominate(&mut self, workload: &str) {
        let Some(nodes) = self.core.nomination(workload) else { return };
        let Some(waiting): Option<Vec<Task>> =
            self.core.members_of(workload).map(|m| m.filter(|(_, placed)| !placed).map(|(t, _)| t.clone()).collect())
        else {
            return;
        };
        let message = self.core.explain(workload).map(reason).unwrap_or_default();
        tracing::info!(workload, nodes = ?nodes, "nominated: waiting for its victims to go");
        for (i, task) in waiting.iter().enumerate() {
            let Some(uid) = self.ours.get(&task.id).map(|f| f.uid.clone()) else { continue };
            self.report_one(&task.id, &uid, &message);
            if let (Some(node), true) = (nodes.get(i % nodes.len().max(1)), *self.leader.borrow()) {
                let (effects, key, node) = (self.effects.clone(), key_of(task), node.clone());
                tokio::spawn(async move {
                    if let Err(e) = effects.nominate(&key, &node).await {
                        tracing::debug!(pod = %key, error = %e, "could not record the nominated node");
                    }
                });
            }
        }
    }

    fn facts<'a>(&self, task: &'a Task, attempt: u32) -> CycleFacts<'a> {
        CycleFacts { task, preemptor: None, grace_seconds: None, attempt, min_member: 1, placed: 0, waited_seconds: 0 }
    }

    /// `PodScheduled=False` with `message` on each pod, when it says something new.
    fn report(&mut self, ids: &[String], message: &str) {
        for id in ids {
            let Some(uid) = self.ours.get(id).map(|f| f.uid.clone()) else { continue };
            self.report_one(id, &uid, message);
        }
    }

    fn report_one(&mut self, id: &str, uid: &str, message: &str) {
        if self.reported.get(id).is_some_and(|m| m == message) {
            return;
        }
        tracing::debug!(pod = %id, reason = message, "unschedulable");
        if !*self.leader.borrow() {
            return;
        }
        self.reported.insert(id.to_string(), message.to_string());
        if let Some(writer) = &self.pod_status {
            writer.unschedulable(id, key_of_id(id), uid, message);
        }
    }

    /// Pod `id` no longer waits (bound, gone): nothing more is written about why it did.
    fn unreport(&mut self, id: &str) {
        if self.reported.remove(id).is_some()
            && let Some(writer) = &self.pod_status
        {
            writer.forget(id);
        }
    }

    fn start_bind(&mut self, pod: &PodFacts, node: String, devices: Vec<DeviceShare>, decided_in: Duration) {
        let (effects, leader, done) = (self.effects.clone(), self.leader.clone(), self.done_tx.clone());
        let nodes = self.cache.nodes();
        let numa = nodes.slot_of(&node).and_then(|s| nodes.get(s)).and_then(|n| convert::numa_of(n, &devices));
        let (key, uid, id) = (key_of(&pod.task), pod.uid.clone(), pod.task.id.clone());
        let binds = self.binds.clone();
        tokio::spawn(async move {
            let permit = binds.acquire_owned().await;
            let started = Instant::now();
            // Checked at the last moment: a replica that lost the lease writes nothing more.
            let result = if *leader.borrow() {
                effects.bind(&key, &uid, &node, &devices, numa).await
            } else {
                Err(EffectError::NotLeader)
            };
            let took = started.elapsed();
            let bound = result.is_ok();
            let _ = done.send(Done::Bind { id, result, took, decided_in });
            // The next bind may start: the event below waits for its own client's rate.
            drop(permit);
            if bound {
                tracing::info!(pod = %key, node = %node, gpus = devices.len(), "bound");
                // What `kubectl describe pod` users look for, as kube-scheduler writes it; after
                // the bind is reported, so it never delays the next decision.
                let note = format!("Successfully assigned {}/{} to {node}", key.namespace, key.name);
                effects.event(&key, Some(&uid), EventType::Normal, "Scheduled", &note).await;
            }
        });
    }

    /// Evicts a victim through the Eviction API, retrying refusals (a disruption budget) with
    /// back-off for a while; if it never goes, it counts again as running.
    fn start_eviction(&mut self, id: &str, reason: &EvictReason) {
        let (effects, leader, done) = (self.effects.clone(), self.leader.clone(), self.done_tx.clone());
        let (key, id) = (key_of_id(id), id.to_string());
        let note = match reason {
            EvictReason::Preempted { preemptor, .. } => format!("preempted by {preemptor}"),
            EvictReason::GangBroken => "its pod group fell below min-member".to_string(),
            EvictReason::NodeLost => "its node is gone".to_string(),
        };
        tokio::spawn(async move {
            let mut wait = Duration::from_secs(1);
            for attempt in 0..20 {
                if !*leader.borrow() {
                    break;
                }
                match effects.evict(&key).await {
                    Ok(()) => {
                        tracing::info!(pod = %key, reason = %note, "evicted");
                        effects.event(&key, None, EventType::Normal, "Preempted", &note).await;
                        return;
                    }
                    Err(EffectError::NotFound(_)) => return,
                    Err(e) => {
                        if attempt == 0 {
                            tracing::warn!(pod = %key, error = %e, "eviction refused; retrying with back-off");
                        }
                    }
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(10));
            }
            let _ = done.send(Done::EvictionAbandoned { id });
        });
    }

    fn done(&mut self, done: Done) {
        match done {
            Done::Bind { id, result, took, decided_in } => self.bind_done(id, result, took, decided_in),
            Done::EvictionAbandoned { id } => {
                tracing::warn!(pod = %id, "gave up evicting; it counts as running again");
                // The core stops holding its room as terminating; the node shows it as anyone's
                // pod, and a preemptor waiting for it tries again (elsewhere, or other victims).
                self.evicting.remove(&id);
                self.core.terminated(&id);
                if let Some(node) = self.cache.node_of(&id).map(String::from) {
                    self.stale(node);
                }
            }
        }
    }

    fn bind_done(&mut self, id: String, result: Result<(), EffectError>, took: Duration, decided_in: Duration) {
        self.metrics.bind_duration.observe(took.as_secs_f64());
        let (label, attempt) = match &result {
            Ok(()) => ("ok", "scheduled"),
            Err(EffectError::Conflict(_)) => ("conflict", "error"),
            Err(EffectError::NotFound(_)) => ("not_found", "error"),
            Err(EffectError::NotLeader) => ("not_leader", "error"),
            Err(EffectError::Retryable(_) | EffectError::TooManyRequests(..)) => ("retry", "error"),
        };
        self.metrics.binds.get_or_create(&BindLabels { result: label }).inc();
        self.metrics.attempt(attempt, decided_in + took);
        let events = self.unconfirmed.remove(&id);
        match result {
            Ok(()) => {
                if let (Some(sink), Some(events)) = (&self.events, events) {
                    for e in events {
                        sink.emit(e);
                    }
                }
            }
            Err(e) => {
                // Bound elsewhere or gone (409/404): the watch stream says what is true, never
                // retried. Otherwise the pod waits a back-off and is submitted again.
                let retry = !matches!(e, EffectError::Conflict(_) | EffectError::NotFound(_));
                tracing::info!(pod = %id, error = %e, retry, "bind failed");
                self.cache.forget_assumed(&id);
                if self.core.placement_of(&id).is_some() {
                    let _ = self.core.remove_task(&id);
                }
                // The watch may already have shown it bound (by another scheduler, possibly to the
                // very node we chose): it runs there as others' usage, which the core sees only
                // once that node is shown to it again.
                if let Some(node) = self.cache.node_of(&id).map(String::from) {
                    self.stale(node);
                }
                if retry {
                    let wait = e.retry_after().map_or(0, |d| d.as_secs());
                    let at = self.now() + self.config.core.backoff_initial_seconds.max(1).max(wait);
                    let wait_key = self.ours.get(&id).and_then(|f| group_key(&f.task)).unwrap_or_else(|| id.clone());
                    self.not_before.insert(wait_key, at);
                }
                self.dirty = true;
            }
        }
    }

    /// Pods decided so far.
    pub fn decided(&self) -> u64 {
        self.decided
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

/// A watch stream that re-lists on `410 Gone` and backs off on errors (kube-runtime's watcher),
/// yielding errors so they are logged rather than ending the stream.
fn watch_stream<K>(api: Api<K>, config: watcher::Config) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, config).default_backoff()
}
