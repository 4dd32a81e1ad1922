//! A recorded event stream turned back into a scenario (`wasmsched scenario from-events`): the
//! nodes and queues as the stream last described them before the window, each job with its
//! arrival, its request and the run time it needed, and a list of what had to be assumed where
//! the stream says nothing.
//!
//! A job's run time is what the replay's semantics need to end it at the same instant: the time
//! it ran with at least its minimum of replicas, from its last start that lost no work (a
//! checkpointed preemption keeps what ran before) to its completion.

use std::collections::BTreeMap;

use wasmsched_events::schema::{
    EndReason, NodeCapacityChanged, Payload, Quantity, QueueConfigured, ResourceQuota, TaskRef, TaskSubmitted,
    TaskUnschedulable,
};
use wasmsched_events::{Kind, Timestamp};
use wasmsched_sim::timed::{AdmissionConfig, Amount, Job, QueueConfig, Scenario, ScenarioNode};

/// `payload` as the conversion keeps it, or `None` for a kind it does not use: a failed
/// attempt keeps only its task (a stream is mostly attempts: 85 % of the openb replay's), and the
/// caller keeps only the first attempt of each task (`first_attempt`).
pub fn slim(payload: Payload) -> Option<Payload> {
    match payload {
        Payload::TaskUnschedulable(u) => Some(Payload::TaskUnschedulable(TaskUnschedulable {
            task: u.task,
            policy_set: Default::default(),
            reasons: Vec::new(),
            attempt: u.attempt,
        })),
        p if USED.contains(&p.kind()) => Some(p),
        _ => None,
    }
}

/// The kinds the conversion reads.
pub const USED: [Kind; 9] = [
    Kind::TaskSubmitted,
    Kind::TaskScheduled,
    Kind::TaskUnschedulable,
    Kind::TaskPreempted,
    Kind::TaskEvicted,
    Kind::TaskEnded,
    Kind::NodeCapacityChanged,
    Kind::QueueConfigured,
    Kind::TaskWithdrawn,
];

/// The window of the stream the scenario covers, in milliseconds since the epoch; `None`: from the
/// first event, to the last.
#[derive(Clone, Copy, Debug, Default)]
pub struct Window {
    /// Start: arrivals before it are left out, runs going at it arrive at 0.
    pub from: Option<Timestamp>,
    /// End: arrivals after it are left out, runs going at it run to the end of the replay.
    pub to: Option<Timestamp>,
}

/// A scenario rebuilt from events, and what it rests on.
#[derive(Debug)]
pub struct History {
    /// The scenario.
    pub scenario: Scenario,
    /// What the stream did not say and the scenario assumes, one line each.
    pub assumptions: Vec<String>,
    /// Each job's tasks (their ids in the stream), by job name: what a caller that knows more of
    /// them than the stream (a live snapshot's DRA claims) adds to the job.
    pub members: BTreeMap<String, Vec<String>>,
    /// The nodes each job whose run time was measured first started on (its minimum of members),
    /// by job name: what says whether a measured run was slowed by spanning domains.
    pub started_on: BTreeMap<String, Vec<String>>,
}

impl History {
    /// Run times measured on gangs that started across more than one domain of `level` were
    /// `slowdown` times what they would be inside one: divided back, so a replay with that fabric
    /// slows only the gangs it splits. How many were.
    pub fn unslow_spanning(&mut self, level: &str, slowdown: f64) -> usize {
        let domain: BTreeMap<&str, &str> = self
            .scenario
            .nodes
            .iter()
            .filter_map(|n| n.labels.get(level).map(|v| (n.name.as_str(), v.as_str())))
            .collect();
        let mut n = 0;
        for job in &mut self.scenario.jobs {
            let Some(nodes) = self.started_on.get(&job.name) else { continue };
            let mut domains: Vec<Option<&&str>> = nodes.iter().map(|node| domain.get(node.as_str())).collect();
            domains.sort_unstable();
            domains.dedup();
            if job.replicas > 1
                && domains.len() > 1
                && let Some(d) = job.duration
            {
                job.duration = Some(((d as f64 / slowdown).round() as u64).max(1));
                n += 1;
            }
        }
        n
    }
}

/// One run of a task: placed at `start`, no longer counted as placed at `placed_until` (an
/// eviction is decided before the pod has stopped), ended for `reason`.
#[derive(Clone, Debug)]
struct Run {
    start: u64,
    /// Where it ran, when the stream says.
    node: Option<String>,
    placed_until: Option<u64>,
    end: Option<(u64, EndReason, bool)>,
}

/// What the stream says of one task.
#[derive(Debug, Default)]
struct TaskHistory {
    /// Position of its first event in the (time-sorted) stream: jobs that arrive at one instant
    /// keep the stream's order, which the replay's queues follow.
    first_seq: usize,
    submitted: Option<(u64, TaskSubmitted)>,
    /// Its `TaskRef` as other events give it (for tasks whose submission the stream lacks).
    seen_as: Option<TaskRef>,
    /// Its request as its placements show it.
    placed_request: Option<(Quantity, u32)>,
    runs: Vec<Run>,
    /// When it was withdrawn while it waited (its pod deleted before it ran).
    withdrawn: Option<u64>,
}

/// Build the scenario of `events` (in any order: they are sorted by time, stably) over `window`.
pub fn scenario(mut events: Vec<(Timestamp, Payload)>, window: Window) -> History {
    events.sort_by_key(|(time, _)| *time);
    let from = window.from.or(events.first().map(|e| e.0)).map_or(0, Timestamp::millis);
    let to = window.to.or(events.last().map(|e| e.0)).map_or(u64::MAX, Timestamp::millis);
    let mut assumptions = Vec::new();
    let mut nodes: BTreeMap<String, NodeCapacityChanged> = BTreeMap::new();
    let mut queues: BTreeMap<String, QueueConfigured> = BTreeMap::new();
    let mut queue_order: Vec<String> = Vec::new();
    let mut tasks: BTreeMap<(String, String), TaskHistory> = BTreeMap::new();
    let (mut nodes_joined_late, mut nodes_left) = (0usize, 0usize);
    let mut queues_changed = std::collections::BTreeSet::new();
    let mut nodes_changed = 0usize;
    // A scheduler describes the cluster as it starts, before any work: nodes described before
    // the window's first arrival or placement were there from its start.
    let first_work = events
        .iter()
        .filter(|(_, p)| matches!(p, Payload::TaskSubmitted(_) | Payload::TaskScheduled(_)))
        .map(|(time, _)| time.millis())
        .find(|&t| t >= from)
        .unwrap_or(u64::MAX);
    for (seq, (time, payload)) in events.iter().enumerate().filter(|(_, (time, _))| time.millis() <= to) {
        let at = time.millis();
        match payload {
            Payload::NodeCapacityChanged(n) if n.removed => {
                // Gone before the work began: not in it. Gone later: there until then, kept.
                if at <= first_work {
                    nodes.remove(&n.node);
                } else {
                    nodes_left += usize::from(nodes.contains_key(&n.node));
                }
            }
            Payload::NodeCapacityChanged(n) => {
                // Its state when the work began, or when it joined after.
                let known = nodes.contains_key(&n.node);
                if at <= first_work || !known {
                    nodes_joined_late += usize::from(at > first_work);
                    nodes.insert(n.node.clone(), n.clone());
                } else {
                    nodes_changed += 1;
                }
            }
            Payload::QueueConfigured(q) => {
                if q.removed {
                    // Gone before the work began: not in it. Gone later: kept, like a node.
                    if at <= first_work {
                        queues.remove(&q.queue);
                    }
                } else if at > first_work && queues.contains_key(&q.queue) {
                    queues_changed.insert(q.queue.clone());
                } else if at <= first_work || !queues.contains_key(&q.queue) {
                    if !queue_order.contains(&q.queue) {
                        queue_order.push(q.queue.clone());
                    }
                    queues.insert(q.queue.clone(), q.clone());
                }
            }
            Payload::TaskSubmitted(s) => {
                let t = task_entry(&mut tasks, &s.task, seq);
                t.submitted.get_or_insert((at, s.clone()));
                // Found running (taken over, or a snapshot's bound pod): its run began then.
                if let Some(r) = &s.running {
                    let since = r.since.millis();
                    if !t.runs.iter().any(|run| run.start == since) {
                        t.runs.push(Run { start: since, node: Some(r.node.clone()), placed_until: None, end: None });
                    }
                }
            }
            Payload::TaskScheduled(s) => {
                let t = task_entry(&mut tasks, &s.task, seq);
                t.seen_as.get_or_insert_with(|| s.task.clone());
                t.placed_request.get_or_insert((s.allocated, s.gpus.len() as u32));
                // A new leader publishes again the starts the old one may have died before
                // sending: one run per start.
                if !t.runs.iter().any(|run| run.start == at) {
                    t.runs.push(Run { start: at, node: Some(s.node.clone()), placed_until: None, end: None });
                }
            }
            Payload::TaskPreempted(p) => placed_until(&mut tasks, &p.victim, at),
            Payload::TaskEvicted(p) => placed_until(&mut tasks, &p.task, at),
            Payload::TaskEnded(end) => {
                let t = task_entry(&mut tasks, &end.task, seq);
                t.seen_as.get_or_insert_with(|| end.task.clone());
                t.placed_request.get_or_insert((end.allocated, end.gpus.len() as u32));
                let started = end.started.millis();
                match t.runs.iter_mut().rev().find(|r| r.start == started) {
                    // Ended twice (a new leader's copy, after a fail-over): the first stands,
                    // unless it says only "deleted" (what a standby saw) and this one knows why.
                    Some(run) if run.end.is_some() => {
                        if matches!(run.end, Some((_, EndReason::Deleted, _))) && end.reason != EndReason::Deleted {
                            run.end = Some((at, end.reason, end.work_kept));
                        }
                    }
                    Some(run) => run.end = Some((at, end.reason, end.work_kept)),
                    // Its start was before the stream's first event.
                    None => t.runs.push(Run {
                        start: started,
                        node: Some(end.node.clone()),
                        placed_until: None,
                        end: Some((at, end.reason, end.work_kept)),
                    }),
                }
            }
            Payload::TaskUnschedulable(u) => {
                task_entry(&mut tasks, &u.task, seq).seen_as.get_or_insert_with(|| u.task.clone());
            }
            Payload::TaskWithdrawn(w) => {
                let t = task_entry(&mut tasks, &w.task, seq);
                t.seen_as.get_or_insert_with(|| w.task.clone());
                t.withdrawn = Some(at);
            }
            _ => {}
        }
    }
    if nodes_joined_late > 0 {
        assumptions.push(format!(
            "{nodes_joined_late} nodes joined inside the window: they are in the scenario from its start"
        ));
    }
    if nodes_changed > 0 {
        assumptions.push(format!(
            "{nodes_changed} changes of nodes inside the window (capacity, labels): the scenario keeps them as they were"
        ));
    }
    if nodes_left > 0 {
        assumptions.push(format!("{nodes_left} nodes left inside the window: they stay to the end of the replay"));
    }
    if !queues_changed.is_empty() {
        let names: Vec<&str> = queues_changed.iter().map(String::as_str).collect();
        assumptions.push(format!(
            "queues {} changed inside the window: the scenario keeps their configuration at its start",
            names.join(", ")
        ));
    }
    let scenario_nodes = scenario_nodes(nodes.into_values(), &mut assumptions);
    let (mut members, mut started_on) = (BTreeMap::new(), BTreeMap::new());
    let jobs = jobs(&tasks, from, to, &mut assumptions, &mut members, &mut started_on);
    let queues = scenario_queues(&queue_order, &queues, &jobs, &mut assumptions);
    let scenario = Scenario {
        nodes: scenario_nodes,
        flavors: Vec::new(),
        queues,
        jobs,
        dra: None,
        levels: Vec::new(),
        fabric: None,
    };
    History { scenario, assumptions, members, started_on }
}

fn key(task: &TaskRef) -> (String, String) {
    (task.namespace.clone(), task.id.clone())
}

/// The history of `task`, made if this (the `seq`-th event) is the first to name it.
fn task_entry<'a>(
    tasks: &'a mut BTreeMap<(String, String), TaskHistory>,
    task: &TaskRef,
    seq: usize,
) -> &'a mut TaskHistory {
    tasks.entry(key(task)).or_insert_with(|| TaskHistory { first_seq: seq, ..TaskHistory::default() })
}

/// The eviction of `task` decided at `at`: its open run no longer counts as placed.
fn placed_until(tasks: &mut BTreeMap<(String, String), TaskHistory>, task: &TaskRef, at: u64) {
    if let Some(run) = tasks.get_mut(&key(task)).and_then(|t| t.runs.iter_mut().rev().find(|r| r.end.is_none())) {
        run.placed_until.get_or_insert(at);
    }
}

/// Seconds from `from` to `at` (both ms), rounded to the replay's tick.
fn seconds(at: u64, from: u64) -> u64 {
    (at.saturating_sub(from) + 500) / 1000
}

fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

/// What a node's GPUs are called when its labels do not say (a scenario names a model for every
/// node with GPUs).
const UNKNOWN_MODEL: &str = "unknown";

fn scenario_nodes(
    nodes: impl Iterator<Item = NodeCapacityChanged>,
    assumptions: &mut Vec<String>,
) -> Vec<ScenarioNode> {
    let (mut topologies, mut unnamed) = (0, 0);
    let out: Vec<ScenarioNode> = nodes
        .inspect(|n| topologies += usize::from(n.topology))
        .map(|n| ScenarioNode {
            cpu_milli: n.cpu_milli,
            memory_mib: n.memory_bytes >> 20,
            gpus: n.gpus,
            model: match n.gpu_model.as_deref() {
                Some(m) if !m.is_empty() => m.to_string(),
                _ if n.gpus > 0 => {
                    unnamed += 1;
                    UNKNOWN_MODEL.to_string()
                }
                _ => String::new(),
            },
            topology: None,
            accelerator: n.accelerator.as_ref().map(accelerator),
            labels: n.labels.into_iter().filter(|(k, _)| k != "gpu-model" && k != "kubernetes.io/hostname").collect(),
            name: n.node,
        })
        .collect();
    if unnamed > 0 {
        assumptions.push(format!(
            "{unnamed} nodes do not say their GPU model (no feature-discovery labels): model `{UNKNOWN_MODEL}`"
        ));
    }
    if topologies > 0 {
        assumptions.push(format!(
            "{topologies} nodes have a GPU topology, which the scenario leaves out (add `topology` files to place by \
             link bandwidth)"
        ));
    }
    if out.is_empty() {
        assumptions.push("the stream describes no node (no node-capacity-changed event): the scenario has none".into());
    }
    out
}

/// An accelerator kind as a scenario writes it.
fn accelerator(a: &wasmsched_events::schema::Accelerator) -> wasmsched_sim::timed::Accelerator {
    wasmsched_sim::timed::Accelerator { kind: a.kind.clone(), resource: a.resource.clone() }
}

/// A queue's amounts as a scenario writes them: unbounded dimensions (`u64::MAX / 4` and above,
/// as the frontends write "no bound") left out, as are zeros of a guarantee.
fn amount(q: &Quantity, zero_is_unset: bool) -> Amount {
    let keep = |v: u64| (v < u64::MAX / 4 && !(zero_is_unset && v == 0)).then_some(v);
    Amount {
        cpu_milli: keep(q.cpu_milli),
        memory_mib: keep(q.memory_bytes).map(|b| b >> 20),
        gpus: keep(q.gpu_milli).map(|m| m as f64 / 1000.0),
        resources: Default::default(),
    }
}

/// `a` with the extended resources `pick` finds in `quotas`.
fn with_resources(
    mut a: Amount,
    quotas: &BTreeMap<String, ResourceQuota>,
    pick: fn(&ResourceQuota) -> Option<u64>,
) -> Amount {
    a.resources = quotas.iter().filter_map(|(name, q)| Some((name.clone(), pick(q)?))).collect();
    a
}

/// A bound as a scenario writes it, extended resources' included: none when no dimension is
/// bounded.
fn bounded(
    q: Option<&Quantity>,
    quotas: &BTreeMap<String, ResourceQuota>,
    pick: fn(&ResourceQuota) -> Option<u64>,
) -> Option<Amount> {
    // An extended bound alone comes with CPU, memory and GPUs unbounded.
    let unbounded = Quantity { cpu_milli: u64::MAX, memory_bytes: u64::MAX, gpu_milli: u64::MAX };
    let a = with_resources(amount(q.unwrap_or(&unbounded), false), quotas, pick);
    (a != Amount::default()).then_some(a)
}

fn scenario_queues(
    order: &[String],
    configured: &BTreeMap<String, QueueConfigured>,
    jobs: &[Job],
    assumptions: &mut Vec<String>,
) -> Vec<QueueConfig> {
    let mut out: Vec<QueueConfig> = Vec::new();
    let mut flavored = 0;
    for name in order {
        let Some(q) = configured.get(name) else { continue };
        flavored += usize::from(q.flavor_quotas || !q.flavors.is_empty());
        out.push(QueueConfig {
            name: q.queue.clone(),
            parent: q.parent.clone(),
            weight: q.weight.max(1),
            guarantee: with_resources(amount(&q.guarantee, true), &q.resources, |r| {
                Some(r.guarantee).filter(|&g| g > 0)
            }),
            capability: bounded(q.capability.as_ref(), &q.resources, |r| r.capability),
            borrowing_limit: bounded(q.borrowing_limit.as_ref(), &q.resources, |r| r.borrowing_limit),
            lending_limit: bounded(q.lending_limit.as_ref(), &q.resources, |r| r.lending_limit),
            reclaimable: q.reclaimable,
            reclaim_min_runtime: q.reclaim_min_runtime_seconds,
            reclaim_max_runtime: q.reclaim_max_runtime_seconds,
            admission: AdmissionConfig {
                max_jobs: q.admission.max_jobs,
                max_gpus_per_job: q.admission.max_gpus_per_job,
                priority_range: q.admission.priority_range,
            },
            flavors: Vec::new(),
        });
    }
    if flavored > 0 {
        assumptions.push(format!(
            "{flavored} queues use resource flavors, which the stream does not describe: their quotas apply to all nodes"
        ));
    }
    // Parents a configured queue names but the stream never described, then queues only jobs name.
    let mut missing: Vec<String> = Vec::new();
    for q in &out {
        if let Some(p) = &q.parent
            && !configured.contains_key(p)
            && !missing.contains(p)
        {
            missing.push(p.clone());
        }
    }
    for j in jobs {
        if !configured.contains_key(&j.queue) && !missing.contains(&j.queue) {
            missing.push(j.queue.clone());
        }
    }
    if !missing.is_empty() {
        assumptions.push(format!(
            "queues {} are named but never configured in the stream: weight 1, no guarantee, no limit",
            missing.join(", ")
        ));
        // Parents go first.
        let mut all: Vec<QueueConfig> = missing.iter().map(|n| QueueConfig::named(n)).collect();
        all.append(&mut out);
        out = all;
    }
    out
}

/// A job being assembled from its tasks.
struct JobParts<'a> {
    name: String,
    tasks: Vec<&'a TaskHistory>,
}

fn jobs(
    tasks: &BTreeMap<(String, String), TaskHistory>,
    from: u64,
    to: u64,
    assumptions: &mut Vec<String>,
    members: &mut BTreeMap<String, Vec<String>>,
    started_on: &mut BTreeMap<String, Vec<String>>,
) -> Vec<Job> {
    let namespaces: std::collections::BTreeSet<&str> = tasks.keys().map(|(ns, _)| ns.as_str()).collect();
    let qualify = namespaces.len() > 1;
    // Tasks grouped into jobs: a gang's members together, in the order the stream saw them first.
    let mut parts: BTreeMap<(String, String), JobParts<'_>> = BTreeMap::new();
    let mut order: Vec<(String, String)> = Vec::new();
    let mut unsubmitted = 0;
    let mut by_seq: Vec<(&(String, String), &TaskHistory)> = tasks.iter().collect();
    by_seq.sort_by_key(|(_, t)| t.first_seq);
    for ((ns, id), t) in by_seq {
        let group = t.submitted.as_ref().and_then(|(_, s)| s.gang.as_ref().map(|g| g.name.clone()));
        let group = group.or_else(|| t.seen_as.as_ref().and_then(|r| r.group.clone()));
        let name = group.unwrap_or_else(|| id.clone());
        let job_key = (ns.clone(), name.clone());
        if t.submitted.is_none() {
            unsubmitted += 1;
        }
        parts
            .entry(job_key.clone())
            .or_insert_with(|| {
                order.push(job_key.clone());
                // Kubernetes task ids carry their namespace already (`ml/train-0`).
                let qualified = qualify && !name.starts_with(&format!("{ns}/"));
                JobParts { name: if qualified { format!("{ns}/{name}") } else { name }, tasks: Vec::new() }
            })
            .tasks
            .push(t);
    }
    if unsubmitted > 0 {
        assumptions.push(format!(
            "{unsubmitted} tasks have no task-submitted event (recorded before it existed, or before the stream's \
             start): their request is what they were given, their arrival their first placement or attempt"
        ));
    }
    let mut out = Vec::new();
    let (mut before_window, mut going_at_start, mut unfinished, mut deleted) = (0, 0, 0, 0);
    let (mut waited_at_start, mut withdrawn, mut partly_withdrawn) = (0, 0, 0);
    let (mut affinity, mut constrained, mut claims, mut checkpoint_unknown) = (0, 0, 0, 0);
    for k in &order {
        let p = &parts[k];
        let Some(mut job) = job_of(p) else { continue };
        let arrival_ms = p.tasks.iter().filter_map(|t| first_seen(t)).min().unwrap_or(from);
        let running_at_start =
            p.tasks.iter().any(|t| t.runs.iter().any(|r| r.start < from && r.end.is_none_or(|(end, _, _)| end > from)));
        let finished_before = p.tasks.iter().any(|t| {
            t.runs.iter().any(|r| {
                r.end.is_some_and(|(end, reason, _)| {
                    end <= from && matches!(reason, EndReason::Completed | EndReason::Deleted | EndReason::Failed)
                })
            })
        });
        // Withdrawn: when its last member that had not run went (a gang's pods are deleted together).
        let waiting_members: Vec<&&TaskHistory> = p.tasks.iter().filter(|t| t.runs.is_empty()).collect();
        let withdrawn_at = waiting_members
            .iter()
            .map(|t| t.withdrawn)
            .collect::<Option<Vec<u64>>>()
            .and_then(|at| at.into_iter().max());
        partly_withdrawn +=
            usize::from(withdrawn_at.is_none() && waiting_members.iter().any(|t| t.withdrawn.is_some()));
        if arrival_ms < from && (finished_before || withdrawn_at.is_some_and(|at| at <= from)) {
            before_window += 1;
            continue;
        }
        // Arrived before the window and neither finished nor running at its start: it waited.
        let waiting_at_start = arrival_ms < from && !running_at_start;
        waited_at_start += usize::from(waiting_at_start);
        if arrival_ms > to {
            continue;
        }
        let runs = member_runs(p);
        let declared = p.tasks.iter().find_map(|t| t.submitted.as_ref().and_then(|(_, s)| s.duration_seconds));
        let min = job.min_replicas.unwrap_or(job.replicas).max(1);
        match run_time(&runs, min) {
            RunTime::Completed { seconds, deleted_or_failed } => {
                job.duration = Some(seconds.max(1));
                deleted += usize::from(deleted_or_failed);
                // Each member's first run, in order: the nodes of those that started with the
                // minimum.
                let mut firsts: Vec<(u64, &str)> = p
                    .tasks
                    .iter()
                    .filter_map(|t| t.runs.first().and_then(|r| Some((r.start, r.node.as_deref()?))))
                    .collect();
                firsts.sort_unstable();
                if let Some(&(at, _)) = firsts.get(min as usize - 1) {
                    let nodes = firsts.iter().take_while(|(s, _)| *s <= at).map(|(_, n)| n.to_string()).collect();
                    started_on.insert(job.name.clone(), nodes);
                }
            }
            // A run time the job declared (the simulator's jobs) stands where none was measured.
            RunTime::Unknown { started } => {
                job.duration = declared;
                unfinished += usize::from(started && declared.is_none());
            }
        }
        if waiting_at_start {
            job.arrival = 0;
        } else if running_at_start {
            going_at_start += 1;
            job.arrival = 0;
            // Taken over where its members ran when the window opened.
            job.running_on = p
                .tasks
                .iter()
                .filter_map(|t| {
                    let open = |r: &&Run| r.start < from && r.end.is_none_or(|(end, _, _)| end > from);
                    t.runs.iter().rfind(open).and_then(|r| r.node.clone())
                })
                .take(job.replicas as usize)
                .collect();
            // What it still had to run when the window opened.
            if let Some(d) = job.duration {
                let ran = runs.iter().map(|r| r.start).min().map_or(0, |s| seconds(from, s));
                job.duration = Some(d.saturating_sub(ran).max(1));
            }
        } else {
            job.arrival = seconds(arrival_ms, from);
        }
        if let Some(at) = withdrawn_at.filter(|_| !running_at_start) {
            job.withdraw_at = Some(seconds(at, from).max(job.arrival));
            withdrawn += 1;
        }
        let submitted = p.tasks.iter().find_map(|t| t.submitted.as_ref().map(|(_, s)| s));
        checkpoint_unknown +=
            usize::from(submitted.is_some_and(|s| s.checkpointable && s.checkpoint_seconds.is_none()));
        affinity += usize::from(submitted.is_some_and(|s| s.pod_affinity));
        constrained += usize::from(submitted.is_some_and(|s| s.node_constraints));
        claims += usize::from(submitted.is_some_and(|s| s.claims));
        let ids = p.tasks.iter().filter_map(|t| t.submitted.as_ref().map(|(_, s)| &s.task).or(t.seen_as.as_ref()));
        members.insert(job.name.clone(), ids.map(|r| r.id.clone()).collect());
        out.push(job);
    }
    let mut say = |n: usize, what: &str| {
        if n > 0 {
            assumptions.push(format!("{n} {what}"));
        }
    };
    say(before_window, "jobs arrived and ended before the window: left out");
    say(
        going_at_start,
        "jobs were running when the window opened: they arrive at 0 where they ran (`running_on`), with the run \
         time they had left",
    );
    say(
        waited_at_start,
        "jobs were waiting when the window opened (arrived before it, neither finished nor running): they arrive at 0",
    );
    say(
        withdrawn,
        "jobs were withdrawn while they waited (pods deleted): withdrawn then unless the replay has started them",
    );
    say(partly_withdrawn, "gangs had some of their waiting pods deleted, not all: the replay keeps them whole");
    say(unfinished, "jobs started but did not finish in the window: they run to the end of the replay");
    say(deleted, "jobs ended deleted or failed rather than completed: their run time is what they ran");
    say(checkpoint_unknown, "jobs checkpoint but the stream does not say how long that takes: at once");
    say(affinity, "jobs have inter-pod affinity, which the stream does not carry: left out");
    say(
        constrained,
        "jobs may go only to some nodes (node selector or affinity), which the stream does not carry: any node",
    );
    say(claims, CLAIMS_NOT_CARRIED);
    out
}

/// What is said of jobs whose DRA claims the stream does not carry.
pub const CLAIMS_NOT_CARRIED: &str = "jobs ask for DRA devices, which the stream does not carry: left out";

/// When the stream first saw a task: its submission, else its first attempt or placement.
fn first_seen(t: &TaskHistory) -> Option<u64> {
    t.submitted.as_ref().map(|(at, _)| *at).or_else(|| t.runs.iter().map(|r| r.start).min())
}

/// The job's spec from its first submitted member (or from what its placements show).
fn job_of(p: &JobParts<'_>) -> Option<Job> {
    let submitted = p.tasks.iter().find_map(|t| t.submitted.as_ref().map(|(_, s)| s));
    let seen = p.tasks.iter().find_map(|t| t.seen_as.as_ref());
    let task = submitted.map(|s| &s.task).or(seen)?;
    let mut job = Job { name: p.name.clone(), queue: task.queue.clone(), priority: task.priority, ..Job::default() };
    match submitted {
        Some(s) => {
            let r = &s.request;
            job.cpu_milli = r.cpu_milli;
            job.memory_mib = mib(r.memory_bytes);
            job.gpus = r.gpus;
            job.gpu_milli = if r.gpus == 0 { 0 } else { r.gpu_milli };
            job.gpu_models = r.gpu_models.clone();
            job.accelerator = r.accelerator.as_ref().map(accelerator);
            let members = s.gang.as_ref().map_or(1, |g| g.members).max(p.tasks.len() as u32);
            job.replicas = members;
            let min = s.gang.as_ref().map_or(members, |g| g.min_member);
            job.min_replicas = (min < members).then_some(min.max(1));
            job.timeout = s.gang.as_ref().and_then(|g| g.timeout_seconds);
            job.topology = s.gang.as_ref().filter(|g| !g.topology.is_empty() || g.slice_size > 0).map(|g| {
                let mut preferred = g.topology.clone();
                let required = if g.topology_required { preferred.pop() } else { None };
                let slices = g.slice_topology.clone().filter(|_| g.slice_size > 0);
                let slices = slices.map(|level| wasmsched_sim::timed::GangSlices { size: g.slice_size, level });
                wasmsched_sim::timed::GangTopology {
                    preferred,
                    required,
                    wait_seconds: g.topology_wait_seconds,
                    slices,
                }
            });
            job.preemptible = s.preemptible;
            job.preempts = s.preempts;
            job.checkpoint_seconds = s.checkpoint_seconds.or(s.checkpointable.then_some(0));
            job.grace_seconds = s.grace_seconds;
            job.termination_seconds = s.termination_seconds;
            job.labels = s.labels.clone();
        }
        None => {
            let (q, devices) = p.tasks.iter().find_map(|t| t.placed_request)?;
            job.cpu_milli = q.cpu_milli;
            job.memory_mib = mib(q.memory_bytes);
            job.gpus = devices;
            job.gpu_milli = if devices == 0 { 0 } else { (q.gpu_milli / u64::from(devices)) as u32 };
            job.replicas = p.tasks.len() as u32;
        }
    }
    Some(job)
}

/// A member's run as the job's run time counts it.
struct MemberRun {
    start: u64,
    /// When it stopped counting as placed, why, and whether its work survived; `None`: still
    /// running at the end of the stream.
    stop: Option<(u64, EndReason, bool)>,
}

fn member_runs(p: &JobParts<'_>) -> Vec<MemberRun> {
    let mut runs: Vec<MemberRun> = p
        .tasks
        .iter()
        .flat_map(|t| t.runs.iter())
        .map(|r| MemberRun {
            start: r.start,
            stop: r.end.map(|(at, reason, kept)| (r.placed_until.unwrap_or(at).min(at), reason, kept)),
        })
        .collect();
    runs.sort_by_key(|r| r.start);
    runs
}

enum RunTime {
    /// It completed (or was deleted or failed) after running this long.
    Completed { seconds: u64, deleted_or_failed: bool },
    /// It never finished in the stream (`started`: it ran at some point).
    Unknown { started: bool },
}

/// The run time a job needed: time with at least `min` members placed, since its last stop that
/// lost its work, up to the instant a member completed while it ran.
fn run_time(runs: &[MemberRun], min: u32) -> RunTime {
    // (time, +1 start / -1 stop, why it stopped and whether its work survived); stops first at
    // one instant, as the replay carries out departures and evictions before it places anything.
    type Change = (u64, i8, Option<(EndReason, bool)>);
    let mut changes: Vec<Change> = Vec::new();
    for r in runs {
        changes.push((r.start, 1, None));
        if let Some((at, reason, kept)) = r.stop {
            changes.push((at, -1, Some((reason, kept))));
        }
    }
    changes.sort_by_key(|c| (c.0, c.1));
    let (mut placed, mut since, mut progress) = (0u32, None::<u64>, 0u64);
    for (at, delta, end) in changes {
        if delta > 0 {
            placed += 1;
            if since.is_none() && placed >= min {
                since = Some(at);
            }
            continue;
        }
        placed = placed.saturating_sub(1);
        let Some(start) = since else { continue };
        let Some((reason, kept)) = end else { continue };
        match reason {
            EndReason::Completed | EndReason::Deleted | EndReason::Failed => {
                let ran_ms = progress + at.saturating_sub(start);
                return RunTime::Completed {
                    seconds: (ran_ms + 500) / 1000,
                    deleted_or_failed: reason != EndReason::Completed,
                };
            }
            EndReason::Preempted | EndReason::Evicted if placed < min => {
                progress = if kept { progress + at.saturating_sub(start) } else { 0 };
                since = None;
            }
            EndReason::Preempted | EndReason::Evicted => {}
        }
    }
    RunTime::Unknown { started: !runs.is_empty() }
}

/// `scenario` as JSON with every field a job or queue leaves at its default left out: what a
/// person writes, and a tenth of the size for a stream of many small jobs.
pub fn compact(scenario: &Scenario) -> Result<serde_json::Value, serde_json::Error> {
    let mut value = serde_json::to_value(scenario)?;
    let default_job = serde_json::to_value(Job::default())?;
    let default_queue = serde_json::to_value(QueueConfig::named(""))?;
    let prune = |items: Option<&mut serde_json::Value>, default: &serde_json::Value, keep: &[&str]| {
        let (Some(serde_json::Value::Array(items)), serde_json::Value::Object(default)) = (items, default) else {
            return;
        };
        for item in items.iter_mut() {
            if let serde_json::Value::Object(fields) = item {
                fields.retain(|k, v| keep.contains(&k.as_str()) || default.get(k) != Some(v));
            }
        }
    };
    prune(value.get_mut("jobs"), &default_job, &["name", "arrival"]);
    prune(value.get_mut("queues"), &default_queue, &["name"]);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start: u64, stop: Option<(u64, EndReason, bool)>) -> MemberRun {
        MemberRun { start: start * 1000, stop: stop.map(|(at, r, k)| (at * 1000, r, k)) }
    }

    fn seconds_of(t: RunTime) -> Option<u64> {
        match t {
            RunTime::Completed { seconds, .. } => Some(seconds),
            RunTime::Unknown { .. } => None,
        }
    }

    #[test]
    fn a_start_and_an_end_published_again_after_a_fail_over_are_one_run() {
        use wasmsched_events::schema::{GangSpec, TaskEnded, TaskScheduled};
        // A gang of two that must run whole: x placed at 10 s, y at 20 s, both done at 80 s.
        let member =
            |id: &str| TaskRef { id: id.into(), namespace: "ml".into(), queue: "default".into(), ..TaskRef::default() };
        let gang = GangSpec { name: "g".into(), members: 2, min_member: 2, ..GangSpec::default() };
        let submitted = |t: &TaskRef| {
            Payload::TaskSubmitted(TaskSubmitted {
                task: t.clone(),
                gang: Some(gang.clone()),
                ..TaskSubmitted::default()
            })
        };
        let scheduled = |t: &TaskRef| {
            Payload::TaskScheduled(TaskScheduled { task: t.clone(), node: "n".into(), ..TaskScheduled::default() })
        };
        let ended = |t: &TaskRef, started: u64| {
            Payload::TaskEnded(TaskEnded {
                task: t.clone(),
                node: "n".into(),
                started: Timestamp(started),
                reason: EndReason::Completed,
                ..TaskEnded::default()
            })
        };
        let (x, y) = (member("ml/x"), member("ml/y"));
        let mut events = vec![
            (Timestamp(5_000), submitted(&x)),
            (Timestamp(5_000), submitted(&y)),
            (Timestamp(10_000), scheduled(&x)),
            (Timestamp(20_000), scheduled(&y)),
            (Timestamp(80_000), ended(&x, 10_000)),
            (Timestamp(80_000), ended(&y, 20_000)),
        ];
        let once = history_of(events.clone());
        assert_eq!(once, [Some(60)], "whole from 20 s to 80 s");
        // A new leader's copies of x's start and end (a fail-over between): still one run each.
        events.push((Timestamp(10_000), scheduled(&x)));
        events.push((Timestamp(80_300), ended(&x, 10_000)));
        assert_eq!(history_of(events), once);
    }

    #[test]
    fn a_standby_s_deleted_copy_of_an_end_does_not_hide_a_preemption() {
        use wasmsched_events::schema::{TaskEnded, TaskScheduled};
        let t = TaskRef { id: "ml/x".into(), namespace: "ml".into(), queue: "default".into(), ..TaskRef::default() };
        let scheduled =
            Payload::TaskScheduled(TaskScheduled { task: t.clone(), node: "n".into(), ..TaskScheduled::default() });
        let ended = |started: u64, reason| {
            Payload::TaskEnded(TaskEnded {
                task: t.clone(),
                node: "n".into(),
                started: Timestamp(started),
                reason,
                ..TaskEnded::default()
            })
        };
        let events = vec![
            (Timestamp(5_000), Payload::TaskSubmitted(TaskSubmitted { task: t.clone(), ..TaskSubmitted::default() })),
            (Timestamp(10_000), scheduled.clone()),
            // Preempted at 30 s (its work lost); the new leader's copy says only "deleted", 2 ms earlier.
            (Timestamp(29_998), ended(10_000, EndReason::Deleted)),
            (Timestamp(30_000), ended(10_000, EndReason::Preempted)),
            (Timestamp(60_000), scheduled),
            (Timestamp(100_000), ended(60_000, EndReason::Completed)),
        ];
        assert_eq!(history_of(events), [Some(40)], "it ran 40 s once it started again, not 20 s and deleted");
    }

    fn history_of(events: Vec<(Timestamp, Payload)>) -> Vec<Option<u64>> {
        let h = scenario(events, Window { from: None, to: None });
        h.scenario.jobs.iter().map(|j| j.duration).collect()
    }

    #[test]
    fn a_checkpointed_stop_keeps_what_ran_and_one_without_starts_over() {
        use EndReason::*;
        // Ran 0–40, checkpointed; again 100–160: needed 100 s.
        let kept = [run(0, Some((40, Preempted, true))), run(100, Some((160, Completed, false)))];
        assert_eq!(seconds_of(run_time(&kept, 1)), Some(100));
        // The same without the checkpoint: only the last run counts.
        let lost = [run(0, Some((40, Preempted, false))), run(100, Some((160, Completed, false)))];
        assert_eq!(seconds_of(run_time(&lost, 1)), Some(60));
    }

    #[test]
    fn an_elastic_job_runs_while_its_minimum_does_and_a_gang_only_when_whole() {
        use EndReason::*;
        // Min 1 of 2: a member shrunk away at 30 does not stop the job; it ends at 90.
        let elastic = [run(0, Some((30, Preempted, true))), run(0, Some((90, Completed, false)))];
        assert_eq!(seconds_of(run_time(&elastic, 1)), Some(90));
        // Min 2: the job starts when its second member does.
        let gang = [run(0, Some((50, Completed, false))), run(20, Some((50, Completed, false)))];
        assert_eq!(seconds_of(run_time(&gang, 2)), Some(30));
        // Still running at the end of the stream: unknown.
        assert!(matches!(run_time(&[run(0, None)], 1), RunTime::Unknown { started: true }));
        assert!(matches!(run_time(&[], 1), RunTime::Unknown { started: false }));
        // Deleted by its owner: what it ran, said as such.
        assert!(matches!(
            run_time(&[run(5, Some((25, Deleted, false)))], 1),
            RunTime::Completed { seconds: 20, deleted_or_failed: true }
        ));
    }
}
