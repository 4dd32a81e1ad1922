//! The scheduling loop against a cluster: watch streams feed the cache and the pending queue; the
//! leader decides one pod (or one gang) at a time with the live policy set and binds
//! asynchronously; non-leaders keep their cache warm so a fail-over is instant.
//!
//! One task owns the cache and the queue (no locks on the hot path); binds run concurrently, at most
//! `bind_concurrency` at once, and report back on a channel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ahash::{AHashMap, AHashSet};
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Semaphore, mpsc, watch};
use wasmsched_api::{DeviceShare, Task};
use wasmsched_core::{GroupSpec, Placement, TopologyConstraint, place, place_group};
use wasmsched_events::EventSink;
use wasmsched_events::decisions;
use wasmsched_events::schema::{Payload, PolicySetRef};
use wasmsched_registry::{Decision, Registry};

use crate::bind::{EffectError, Effects};
use crate::cache::{Cache, PodPhase, pod_id};
use crate::convert::PodKey;
use crate::crd::PodGroup;
use crate::leader::{Elector, LeaseConfig};
use crate::metrics::{BindLabels, Metrics, QueueLabels};
use crate::queue::{PendingQueue, Popped, group_key};

/// How the scheduler runs.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Pods with this `spec.schedulerName` are ours.
    pub scheduler_name: String,
    /// Binds in flight at most.
    pub bind_concurrency: usize,
    /// Leader election; `None` runs as the only replica.
    pub lease: Option<LeaseConfig>,
    /// Longest a turn of the loop decides before it looks at the watch streams again.
    pub turn: Duration,
}

impl SchedulerConfig {
    /// Defaults for `scheduler_name`: 16 binds in flight, no election, 20 ms turns.
    pub fn new(scheduler_name: &str) -> SchedulerConfig {
        SchedulerConfig {
            scheduler_name: scheduler_name.into(),
            bind_concurrency: 16,
            lease: None,
            turn: Duration::from_millis(20),
        }
    }
}

struct BindDone {
    id: String,
    result: Result<(), EffectError>,
    took: Duration,
    decided_in: Duration,
}

/// A re-list in progress: what it has listed so far.
#[derive(Default)]
struct Relist {
    nodes: Option<AHashSet<String>>,
    pods: Option<AHashSet<String>>,
}

/// Group settings from `PodGroup` objects, by `namespace/name`.
#[derive(Clone, Debug)]
struct GroupInfo {
    min_member: usize,
    topology_key: Option<String>,
}

/// The scheduler: cache, queue, policy registry and the API effects.
pub struct Scheduler {
    config: SchedulerConfig,
    client: Client,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    effects: Effects,
    cache: Cache,
    queue: PendingQueue,
    groups: AHashMap<String, GroupInfo>,
    relist: Relist,
    synced: (bool, bool),
    leader: watch::Receiver<bool>,
    /// Holds leadership at `true` when there is no election.
    _always_leader: Option<watch::Sender<bool>>,
    binds: Arc<Semaphore>,
    done_tx: mpsc::UnboundedSender<BindDone>,
    done_rx: mpsc::UnboundedReceiver<BindDone>,
    /// Decisions made, for tests and the log.
    decided: u64,
    events: Option<EventSink>,
    /// `task-scheduled` events waiting for their bind to succeed.
    unconfirmed: AHashMap<String, Payload>,
}

impl Scheduler {
    /// A scheduler for `client`'s cluster, deciding with `registry`'s live policy set.
    pub fn new(client: Client, registry: Arc<Registry>, metrics: Arc<Metrics>, config: SchedulerConfig) -> Scheduler {
        let identity = config.lease.as_ref().map_or_else(|| config.scheduler_name.clone(), |l| l.identity.clone());
        let effects = Effects::new(client.clone(), &config.scheduler_name, &identity);
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (always, leader) = watch::channel(config.lease.is_none());
        metrics.observe_policies(registry.clone());
        Scheduler {
            binds: Arc::new(Semaphore::new(config.bind_concurrency.max(1))),
            config,
            client,
            registry,
            metrics,
            effects,
            cache: Cache::new(),
            queue: PendingQueue::new(),
            groups: AHashMap::new(),
            relist: Relist::default(),
            synced: (false, false),
            leader,
            _always_leader: Some(always),
            done_tx,
            done_rx,
            decided: 0,
            events: None,
            unconfirmed: AHashMap::new(),
        }
    }

    /// Publishes every decision (`task-scheduled` once bound, `task-unschedulable` with reasons,
    /// plugin faults) on `events`.
    pub fn with_events(mut self, events: EventSink) -> Scheduler {
        self.events = Some(events);
        self
    }

    /// Runs until `stop` changes (or its sender is dropped): starts the election if configured,
    /// watches, decides and binds; on stop, waits for binds in flight and releases the lease.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> anyhow::Result<()> {
        let (stop_election, election) = match self.config.lease.clone() {
            Some(lease) => {
                let (elector, leader) = Elector::new(self.client.clone(), lease);
                self.leader = leader;
                let (tx, rx) = watch::channel(false);
                (Some(tx), Some(tokio::spawn(elector.run(rx))))
            }
            None => (None, None),
        };
        let nodes = watch_stream(Api::<KubeNode>::all(self.client.clone()), watcher::Config::default());
        // Finished pods hold nothing; leaving them out of the list is most of a big cluster's pods.
        let pod_config = watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let pods = watch_stream(Api::<Pod>::all(self.client.clone()), pod_config);
        let groups = watch_stream(Api::<PodGroup>::all(self.client.clone()), watcher::Config::default());
        tokio::pin!(nodes, pods, groups);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.metrics.beat();
            let leading = *self.leader.borrow();
            self.metrics.leader.set(i64::from(leading));
            let ready = self.synced == (true, true);
            self.queue.promote(Instant::now());
            let runnable = leading && ready && self.queue.active_len() > 0 && self.binds.available_permits() > 0;
            let due = self.queue.next_due();
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                Some(done) = self.done_rx.recv() => self.bind_done(done),
                Some(event) = nodes.next() => self.node_event(event),
                Some(event) = pods.next() => self.pod_event(event),
                Some(event) = groups.next() => self.group_event(event),
                Ok(()) = self.leader.changed() => {}
                _ = std::future::ready(()), if runnable => self.turn(),
                _ = sleep_until(due), if leading && ready && due.is_some() => {}
                _ = tick.tick() => {}
            }
            self.metrics.set_ready(self.synced == (true, true));
            self.metrics.cache_nodes.set(self.cache.nodes().len() as i64);
            self.metrics.cache_pods.set(self.cache.holders() as i64);
            self.metrics.pending.get_or_create(&QueueLabels { queue: "active" }).set(self.queue.active_len() as i64);
            self.metrics.pending.get_or_create(&QueueLabels { queue: "backoff" }).set(self.queue.backoff_len() as i64);
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
                self.cache.retain_listed(listed.as_ref(), None);
                self.synced.0 = true;
                tracing::info!(nodes = self.cache.nodes().len(), "nodes listed");
            }
            Ok(Event::Apply(node)) => self.apply_node(&node),
            Ok(Event::Delete(node)) => self.cache.delete_node(&node.name_any()),
            Err(e) => tracing::warn!(error = %e, "node watch failed; retrying"),
        }
        if self.registry.wants_sample() {
            self.registry.offer_sample(self.cache.nodes());
        }
    }

    fn apply_node(&mut self, node: &KubeNode) {
        if let Err(e) = self.cache.apply_node(node) {
            tracing::warn!(node = %node.name_any(), error = %e, "ignoring a node that does not convert");
        }
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
                let listed = self.relist.pods.take();
                self.cache.retain_listed(None, listed.as_ref());
                if let Some(listed) = &listed {
                    self.queue.retain(|id| listed.contains(id));
                }
                self.synced.1 = true;
                tracing::info!(bound = self.cache.holders(), pending = self.queue.len(), "pods listed");
            }
            Ok(Event::Apply(pod)) => self.apply_pod(&pod),
            Ok(Event::Delete(pod)) => {
                if let Ok(id) = pod_id(&pod) {
                    self.queue.remove(&id);
                }
                self.cache.delete_pod(&pod);
            }
            Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
        }
    }

    fn apply_pod(&mut self, pod: &Pod) {
        match self.cache.apply_pod(pod, &self.config.scheduler_name) {
            Ok(PodPhase::Pending(task)) => self.queue.upsert(*task, pod.uid().unwrap_or_default()),
            Ok(PodPhase::Bound | PodPhase::Other) => {
                // Bound (or not ours) leaves the queue; an assumed pod still binding stays, its
                // bind reports back by itself.
                let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
                if let Ok(id) = pod_id(pod)
                    && (bound || !self.cache.holds(&id))
                {
                    self.queue.remove(&id);
                }
            }
            Err(e) => {
                // A pod we cannot understand is left alone (and said so), never guessed at.
                tracing::warn!(pod = %pod_id(pod).unwrap_or_default(), error = %e, "ignoring a pod that does not convert");
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
        if matches!(event, Ok(Event::Delete(_))) {
            self.groups.remove(&key);
        } else {
            let info =
                GroupInfo { min_member: g.spec.min_member.max(1) as usize, topology_key: g.spec.topology_key.clone() };
            self.groups.insert(key, info);
        }
    }

    /// Decides pods until the queue is empty, the bind limit is reached or the turn is over.
    fn turn(&mut self) {
        let started = Instant::now();
        while started.elapsed() < self.config.turn && self.binds.available_permits() > 0 {
            let Some(popped) = self.queue.pop(Instant::now()) else { break };
            match group_key(&popped.task) {
                Some(group) => self.decide_group(group, popped),
                None => self.decide_one(popped),
            }
        }
    }

    fn decide_one(&mut self, popped: Popped) {
        let started = Instant::now();
        let live = self.registry.current();
        let result = place(&live.set, self.cache.nodes(), &popped.task, 0);
        let latency = started.elapsed();
        self.registry
            .record(&live, Decision { task: &popped.task, nodes: self.cache.nodes(), result: &result, latency });
        self.decided += 1;
        match result {
            Ok(p) => {
                let node = self.cache.nodes().get(p.node).map(|n| n.name.clone()).unwrap_or_default();
                self.cache.assume(p.node, &popped.task, &p.devices);
                self.announce(&popped, &node, &p, &policy_ref(&live));
                self.start_bind(&popped, node, p.devices, latency);
            }
            Err(u) => {
                if let Some(sink) = &self.events {
                    let d = decisions::Decision {
                        task: &popped.task,
                        outcome: Err(&u.diagnosis),
                        evaluated: self.cache.nodes().len(),
                        attempt: popped.attempts + 1,
                    };
                    decisions::publish(Some(sink), None, d, &policy_ref(&live));
                }
                self.unschedulable(&popped, &u.diagnosis.to_string(), latency);
            }
        }
    }

    /// Prepares the `task-scheduled` event, published when the bind succeeds.
    fn announce(&mut self, popped: &Popped, node: &str, p: &Placement, policy: &PolicySetRef) {
        if self.events.is_some() {
            let event =
                decisions::scheduled(&popped.task, node, p, self.cache.nodes().len(), policy, popped.attempts + 1);
            self.unconfirmed.insert(popped.task.id.clone(), event);
        }
    }

    fn decide_group(&mut self, group: String, first: Popped) {
        let started = Instant::now();
        let mut members = vec![first];
        members.extend(self.queue.take_group(&group, &members[0].task.id));
        let Some(info) = self.groups.get(&group).cloned() else {
            let msg = format!("waiting for PodGroup {group}");
            for m in &members {
                self.unschedulable(m, &msg, started.elapsed());
            }
            return;
        };
        let bound = self.cache_members_bound(&group);
        let still_needed = info.min_member.saturating_sub(bound).max(1);
        if members.len() < still_needed {
            let msg = format!("pod group {group}: {} of {} members present", members.len() + bound, info.min_member);
            for m in &members {
                self.unschedulable(m, &msg, started.elapsed());
            }
            return;
        }
        let tasks: Vec<Task> = members.iter().map(|m| m.task.clone()).collect();
        let topology = info.topology_key.as_ref().map(|k| TopologyConstraint::single(k.clone(), true));
        let live = self.registry.current();
        let spec = GroupSpec {
            name: &group,
            members: &tasks,
            min_member: still_needed,
            topology: topology.as_ref(),
            nodes_to_find: None,
        };
        let result = place_group(&live.set, self.cache.nodes_mut(), &spec, 0);
        let latency = started.elapsed();
        self.decided += 1;
        match result {
            Ok(gang) => {
                let mut placed = AHashSet::new();
                for (i, p) in &gang.placed {
                    let m = &members[*i];
                    placed.insert(*i);
                    let node = self.cache.nodes().get(p.node).map(|n| n.name.clone()).unwrap_or_default();
                    self.cache.assumed_by_placement(p.node, &m.task, &p.devices);
                    self.announce(m, &node, p, &policy_ref(&live));
                    self.start_bind(m, node, p.devices.clone(), latency);
                }
                for (i, m) in members.iter().enumerate() {
                    if !placed.contains(&i) {
                        self.queue.back_off(&m.task.id, Instant::now());
                    }
                }
            }
            Err(e) => {
                let msg = e.to_string();
                for m in &members {
                    self.unschedulable(m, &msg, latency);
                }
            }
        }
    }

    /// Members of `group` holding resources (bound or assumed).
    fn cache_members_bound(&self, group: &str) -> usize {
        // Bound members have left the queue, so the cache counts them.
        let (ns, name) = group.split_once('/').unwrap_or(("", group));
        self.cache.count_group(ns, name)
    }

    fn unschedulable(&mut self, popped: &Popped, message: &str, latency: Duration) {
        self.metrics.attempt("unschedulable", latency);
        self.queue.back_off(&popped.task.id, Instant::now());
        tracing::debug!(pod = %popped.task.id, reason = message, "unschedulable");
        if !*self.leader.borrow() {
            return;
        }
        let effects = self.effects.clone();
        let key = key_of(&popped.task);
        let (uid, message) = (popped.uid.clone(), message.to_string());
        tokio::spawn(async move {
            if let Err(e) = effects.unschedulable(&key, &uid, &message).await {
                tracing::debug!(pod = %key, error = %e, "could not record PodScheduled=False");
            }
        });
    }

    fn start_bind(&mut self, popped: &Popped, node: String, devices: Vec<DeviceShare>, decided_in: Duration) {
        let Ok(permit) = self.binds.clone().try_acquire_owned() else {
            // turn() only decides while permits remain; a gang may need more than one at once.
            self.spawn_bind(popped, node, devices, decided_in, None);
            return;
        };
        self.spawn_bind(popped, node, devices, decided_in, Some(permit));
    }

    fn spawn_bind(
        &mut self,
        popped: &Popped,
        node: String,
        devices: Vec<DeviceShare>,
        decided_in: Duration,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) {
        let (effects, leader, done) = (self.effects.clone(), self.leader.clone(), self.done_tx.clone());
        let (key, uid, id) = (key_of(&popped.task), popped.uid.clone(), popped.task.id.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let started = Instant::now();
            // Checked at the last moment: a replica that lost the lease writes nothing more.
            let result = if *leader.borrow() {
                effects.bind(&key, &uid, &node, &devices).await
            } else {
                Err(EffectError::NotLeader)
            };
            let _ = done.send(BindDone { id, result, took: started.elapsed(), decided_in });
        });
    }

    fn bind_done(&mut self, done: BindDone) {
        self.metrics.bind_duration.observe(done.took.as_secs_f64());
        let (label, attempt) = match &done.result {
            Ok(()) => ("ok", "scheduled"),
            Err(EffectError::Conflict(_)) => ("conflict", "error"),
            Err(EffectError::NotFound(_)) => ("not_found", "error"),
            Err(EffectError::NotLeader) => ("not_leader", "error"),
            Err(EffectError::Retryable(_) | EffectError::TooManyRequests(_)) => ("retry", "error"),
        };
        self.metrics.binds.get_or_create(&BindLabels { result: label }).inc();
        self.metrics.attempt(attempt, done.decided_in + done.took);
        let event = self.unconfirmed.remove(&done.id);
        match done.result {
            Ok(()) => {
                self.queue.remove(&done.id);
                if let (Some(sink), Some(event)) = (&self.events, event) {
                    sink.emit(event);
                }
            }
            Err(EffectError::Conflict(msg) | EffectError::NotFound(msg)) => {
                // Bound elsewhere or gone: the watch stream says what is true; never retry.
                tracing::info!(pod = %done.id, reason = %msg, "bind refused; not retrying");
                self.cache.forget_assumed(&done.id);
                self.queue.remove(&done.id);
            }
            Err(e) => {
                tracing::warn!(pod = %done.id, error = %e, "bind failed; will retry after back-off");
                self.cache.forget_assumed(&done.id);
                self.queue.back_off(&done.id, Instant::now());
            }
        }
    }

    /// Pods decided so far.
    pub fn decided(&self) -> u64 {
        self.decided
    }
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

/// A watch stream that re-lists on `410 Gone` and backs off on errors (kube-runtime's watcher),
/// yielding errors so they are logged rather than ending the stream.
fn watch_stream<K>(api: Api<K>, config: watcher::Config) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, config).default_backoff()
}
