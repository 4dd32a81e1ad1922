//! Carrying out the core's decisions on the API server: binds, evictions, checkpoint requests,
//! nominations, why a pod waits, and the events of each decision.

use super::*;
use wasmsched_core::{PluginFault, PolicySet};

/// What every decision of one `carry_out` shares: the policy version that decided, its reference
/// for events, and the decision time per decision.
pub(super) struct Carried<'a> {
    live: &'a Arc<PolicyVersion>,
    policy: &'a PolicySetRef,
    each: Duration,
}

/// The core's decisions of one cycle, carried out on the API server through the
/// [`wasmsched_core::Effects`]
/// trait the simulator's replay implements too. Preemptors left waiting are nominated once, after
/// all the cycle's evictions.
struct Carrier<'s, 'a> {
    scheduler: &'s mut Scheduler,
    at: Carried<'a>,
    nominated: AHashSet<String>,
    /// Workloads whose DRA claims could not all be served where they were placed, with why.
    refused: AHashMap<String, String>,
}

impl wasmsched_core::Effects for Carrier<'_, '_> {
    fn bind(&mut self, d: &Decision, workload: &str, _: &str, _: &str, _: &[DeviceShare]) {
        if !self.refused.contains_key(workload) {
            self.scheduler.bound(d, &self.at);
        }
    }

    fn unschedulable(&mut self, d: &Decision, workload: &str, explanation: &Explanation) {
        self.scheduler.unschedulable(d, workload, explanation, &self.at);
    }

    fn request_checkpoint(&mut self, _: &Decision, task: &str, preemptor: &str, deadline: u64) {
        self.scheduler.ask_for_checkpoint(task, preemptor, deadline);
    }

    fn evict(&mut self, d: &Decision, _: &str, task: &str, _: &str, reason: &EvictReason) {
        self.scheduler.evicted(d, task, reason, &self.at);
        if let EvictReason::Preempted { preemptor, .. } = reason {
            self.nominated.insert(preemptor.clone());
        }
    }

    fn timed_out(&mut self, d: &Decision, workload: &str) {
        self.scheduler.timed_out(d, workload, &self.at);
    }

    fn fault(&mut self, d: &Decision, fault: &PluginFault) {
        self.scheduler.fault(d, fault, &self.at);
    }
}

impl Scheduler {
    /// Carries out the core's decisions, in order.
    pub(super) fn carry_out(&mut self, decisions: Vec<Decision>, live: &Arc<PolicyVersion>, each: Duration) {
        let policy = policy_ref(live);
        let refused = self.reserve_claims(&decisions, &live.set);
        let mut carrier = Carrier {
            scheduler: self,
            at: Carried { live, policy: &policy, each },
            nominated: AHashSet::new(),
            refused,
        };
        for d in &decisions {
            wasmsched_core::carry_out(d, &mut carrier);
        }
        let nominated = std::mem::take(&mut carrier.nominated);
        let refused = std::mem::take(&mut carrier.refused);
        for workload in nominated {
            self.nominate(&workload);
        }
        for (workload, reason) in refused {
            self.claims_refused(&workload, &decisions, &reason);
        }
    }

    /// Before any bind of the cycle starts, the DRA claims of each pod it places are allocated on
    /// the pod's node against the devices held now (an earlier placement may have taken them),
    /// workload by workload: a workload whose claims cannot all be served places none of its pods
    /// this cycle. The writes wait in `in_flight.claims` for their binds.
    fn reserve_claims(&mut self, decisions: &[Decision], set: &PolicySet) -> AHashMap<String, String> {
        let mut refused: AHashMap<String, String> = AHashMap::new();
        let mut reserved: AHashMap<&str, Vec<&str>> = AHashMap::new();
        for d in decisions {
            let Decision::Bound { workload, task, node, .. } = d else { continue };
            if refused.contains_key(workload) {
                continue;
            }
            let (Some(facts), Some(pod)) = (self.view.ours.get(task), self.view.objects.dra_pods.get(task)) else {
                continue;
            };
            // The policy's device-selection stage may rank each request's candidate devices.
            let nodes = self.view.cache.nodes();
            let mut rank =
                |request: &wasmsched_api::ClaimRequest| set.rank_claim_devices(nodes, &facts.task, node, request);
            let rank: Option<&mut wasmsched_dra::allocator::Rank> =
                if set.ranks_claim_devices() { Some(&mut rank) } else { None };
            let mut outcome =
                self.view.objects.dra.reserve(&facts.task.namespace, &pod.claims, pod.made.as_ref(), node, rank);
            // Devices beyond what the cycle counted (an `All` request, a larger `firstAvailable`
            // alternative) are charged to the pod's node and queues, or the allocation is given
            // back when its queues cannot hold them.
            if let Ok(writes) = &outcome {
                let mut more: Vec<(wasmsched_api::ResourceName, u64)> = Vec::new();
                for (resource, n) in writes.iter().flat_map(crate::dra::ClaimWrite::beyond_count) {
                    match more.iter_mut().find(|(r, _)| *r == resource) {
                        Some((_, total)) => *total += n,
                        None => more.push((resource, n)),
                    }
                }
                if !more.is_empty() {
                    match self.core.charge_more(task, &more) {
                        Ok(()) => {
                            for w in writes.iter().filter(|w| w.allocation.is_some()) {
                                let key = format!("{}/{}", w.namespace, w.name);
                                let counted = self
                                    .view
                                    .objects
                                    .dra_counted
                                    .entry(key)
                                    .or_insert_with(|| (task.clone(), Vec::new()));
                                for (resource, _) in w.beyond_count() {
                                    if !counted.1.iter().any(|r| r.as_str() == resource.as_str()) {
                                        counted.1.push(resource.to_string());
                                    }
                                }
                            }
                            // Its devices of those classes are the core's count now, not others' holds.
                            self.next.stale_nodes.insert(node.clone());
                        }
                        Err(e) => {
                            self.view.objects.dra.forget(writes);
                            outcome = Err(format!("its claims got devices beyond what was counted ahead: {e}"));
                        }
                    }
                }
            }
            match outcome {
                Ok(writes) => {
                    self.in_flight.claims.insert(task.clone(), writes);
                    reserved.entry(workload).or_default().push(task);
                }
                Err(reason) => {
                    for t in reserved.remove(workload.as_str()).unwrap_or_default() {
                        if let Some(writes) = self.in_flight.claims.remove(t) {
                            self.view.objects.dra.forget(&writes);
                        }
                    }
                    // Not this node again until devices are freed: what the cycle counts free
                    // there is not what the claim can use (a selector, a taint, a constraint).
                    self.next.dra_avoid.entry(workload.clone()).or_default().insert(node.clone());
                    refused.insert(workload.clone(), reason);
                }
            }
        }
        refused
    }

    /// The pods `workload` placed this cycle cannot have their claims where they were placed:
    /// they are taken back (the whole workload when nothing of it ran before), told why, and
    /// tried again after a back-off or as soon as devices are freed.
    fn claims_refused(&mut self, workload: &str, decisions: &[Decision], reason: &str) {
        let placed_now: Vec<String> = decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Bound { workload: w, task, .. } if w == workload => Some(task.clone()),
                _ => None,
            })
            .collect();
        let placed_before = self
            .core
            .members_of(workload)
            .is_some_and(|m| m.filter(|(t, placed)| *placed && !placed_now.contains(&t.id)).count() > 0);
        tracing::info!(workload, %reason, "placement taken back: its DRA claims cannot be served there now");
        if placed_before {
            for t in &placed_now {
                let _ = self.core.remove_task(t);
            }
        } else {
            let _ = self.core.finish(workload);
            self.next.dra_submitted.remove(workload);
        }
        let at = self.now() + self.config.core.backoff_initial_seconds.max(1);
        self.next.not_before.insert(workload.to_string(), at);
        self.next.dra_waiting.insert(workload.to_string());
        self.next.dirty = true;
        self.report(&placed_now, reason);
    }

    /// A bind decided: assumed in the cache, recorded, its events held until the bind succeeds.
    pub(super) fn bound(&mut self, d: &Decision, at: &Carried<'_>) {
        let Decision::Bound { workload, task, node, devices, score, feasible, faults, .. } = d else {
            return;
        };
        self.next.dra_not_now.remove(workload.as_str());
        let (live, policy, each) = (at.live, at.policy, at.each);
        let Some(facts) = self.view.ours.get(task).cloned() else {
            tracing::warn!(pod = %task, "bound a pod that is gone; the bind will fail");
            return;
        };
        let attempt = self.reports.attempts.remove(workload).unwrap_or(0) + 1;
        if let Some(slot) = self.view.cache.nodes().slot_of(node) {
            let placement = Placement {
                node: slot,
                devices: devices.clone(),
                score: *score,
                feasible: *feasible,
                skipped_faults: faults.clone(),
            };
            let observed =
                Observed { task: &facts.task, nodes: self.view.cache.nodes(), result: &Ok(placement), latency: each };
            self.shared.registry.record(live, observed);
            self.view.cache.assume(slot, &facts.task, devices);
        }
        // Built with or without an event sink: the usage meter counts them too.
        let cycle_facts = self.facts(&facts.task, attempt);
        let payloads = decisions::cycle(d, &cycle_facts, self.view.cache.nodes(), policy);
        self.reports.unconfirmed.insert(task.clone(), payloads);
        self.reports.decided += 1;
        let claims = self.in_flight.claims.remove(task).unwrap_or_default();
        self.start_bind(&facts, node.clone(), devices.clone(), claims, each);
    }

    /// A failed attempt: recorded, published, and each waiting pod told why.
    pub(super) fn unschedulable(&mut self, d: &Decision, workload: &str, explanation: &Explanation, at: &Carried<'_>) {
        let (live, policy, each) = (at.live, at.policy, at.each);
        let Some(waiting): Option<Vec<Task>> =
            self.core.members_of(workload).map(|m| m.filter(|(_, placed)| !placed).map(|(t, _)| t.clone()).collect())
        else {
            return;
        };
        self.reports.attempts.insert(workload.to_string(), explanation.attempts);
        for _ in &waiting {
            self.shared.metrics.attempt("unschedulable", each);
        }
        if let (Some(first), Some(diagnosis)) = (waiting.first(), &explanation.nodes) {
            let result = Err(Unschedulable { diagnosis: diagnosis.clone() });
            let observed = Observed { task: first, nodes: self.view.cache.nodes(), result: &result, latency: each };
            self.shared.registry.record(live, observed);
        }
        if let (Some(sink), Some(first)) = (self.reports.events.as_ref().filter(|s| s.wanted()), waiting.first()) {
            for p in decisions::cycle(d, &self.facts(first, explanation.attempts), self.view.cache.nodes(), policy) {
                sink.emit(p);
            }
        }
        let ids: Vec<String> = waiting.iter().map(|t| t.id.clone()).collect();
        let mut why = reason(explanation);
        // Submitted only for the nodes whose devices could serve it once freed: why none can now.
        if let Some(now) = self.next.dra_not_now.get(workload) {
            why = format!("{why}; now: {now}");
        }
        match self.other_kind_of_node(workload, &ids, &why) {
            Tried::Both(both) => self.report(&ids, &both),
            Tried::PluginNodesOnly => {}
            Tried::NotMixed => self.report(&ids, &why),
        }
    }

    /// Pods that device-plugin nodes and DRA nodes could both serve (see [`MixedPath`]): the kind
    /// of node they were submitted for had no room, so the workload is withdrawn and submitted
    /// for the other kind — at once after the device-plugin nodes, after the back-off once the
    /// DRA nodes were tried too (or could not serve it at all).
    fn other_kind_of_node(&mut self, workload: &str, ids: &[String], why: &str) -> Tried {
        let Some(first) = ids.first().and_then(|id| self.next.mixed.get(id)).cloned() else {
            return Tried::NotMixed;
        };
        let placed = self.core.members_of(workload).is_some_and(|mut m| m.any(|(_, placed)| placed));
        if placed || !ids.iter().all(|id| self.next.mixed.contains_key(id)) {
            for id in ids {
                self.next.mixed.remove(id);
            }
            return Tried::NotMixed;
        }
        let _ = self.core.finish(workload);
        self.next.dra_submitted.remove(workload);
        self.next.dirty = true;
        let tried = if first.submitted_dra {
            let plugin = first.plugin_reason.as_deref().unwrap_or("no room");
            Tried::Both(format!("device-plugin nodes: {plugin}; DRA nodes: {why}"))
        } else if first.dra {
            // Meant for the DRA nodes, but none could serve it: the device-plugin nodes' reason.
            Tried::Both(why.to_string())
        } else {
            Tried::PluginNodesOnly
        };
        let to_dra = matches!(tried, Tried::PluginNodesOnly);
        let backoff = if to_dra { first.backoff } else { (first.backoff * 2).clamp(1, 10) };
        if !to_dra {
            self.next.not_before.insert(workload.to_string(), self.now() + backoff);
        }
        for id in ids {
            let path = self.next.mixed.entry(id.clone()).or_default();
            path.dra = to_dra;
            path.backoff = backoff;
            path.plugin_reason = to_dra.then(|| why.to_string());
        }
        tried
    }

    /// A victim that can checkpoint is asked to (its deadline as wall-clock time).
    pub(super) fn ask_for_checkpoint(&mut self, task: &str, preemptor: &str, deadline: u64) {
        let wall = k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(deadline.saturating_sub(self.now()));
        let (effects, key, preemptor) = (self.api.effects.clone(), key_of_id(task), preemptor.to_string());
        if *self.leadership.leader.borrow() {
            tokio::spawn(async move {
                if let Err(e) = effects.request_checkpoint(&key, &preemptor, &wall.to_string()).await {
                    tracing::warn!(pod = %key, error = %e, "could not ask for a checkpoint; evicted at the deadline");
                }
            });
        }
    }

    /// A victim evicted: published, forgotten by the core (its room held as terminating) and
    /// evicted through the API.
    pub(super) fn evicted(&mut self, d: &Decision, task: &str, reason: &EvictReason, at: &Carried<'_>) {
        let policy = at.policy;
        if let Some(sink) = self.reports.events.as_ref().filter(|s| s.wanted())
            && let Some(victim) = self.view.ours.get(task)
        {
            let preemptor = match reason {
                EvictReason::Preempted { preemptor, .. } => {
                    self.core.members_of(preemptor).and_then(|mut m| m.next().map(|(t, _)| t.clone()))
                }
                _ => None,
            };
            let grace = victim.checkpoint.map(|g| g.unwrap_or(self.config.core.checkpoint_grace_seconds));
            let facts =
                CycleFacts { preemptor: preemptor.as_ref(), grace_seconds: grace, ..self.facts(&victim.task, 0) };
            for p in decisions::cycle(d, &facts, self.view.cache.nodes(), policy) {
                sink.emit(p);
            }
        }
        let why = match reason {
            EvictReason::Preempted { kind: wasmsched_core::PreemptKind::Priority, .. } => "priority",
            EvictReason::Preempted { kind: wasmsched_core::PreemptKind::Reclaim(_), .. } => "reclaim",
            EvictReason::Preempted { kind: wasmsched_core::PreemptKind::ElasticShrink, .. } => "elastic_shrink",
            EvictReason::GangBroken => "gang_broken",
            EvictReason::NodeLost => "node_lost",
        };
        self.shared.metrics.preemptions.get_or_create(&crate::metrics::PreemptLabels { reason: why }).inc();
        self.run_stopped(task, reason);
        // Evicted pods do not come back (their controller makes new ones): the core
        // forgets the task now and holds its room as terminating until the pod is gone.
        let _ = self.core.remove_task(task);
        if !matches!(reason, EvictReason::NodeLost) {
            self.view.evicting.insert(task.to_string());
            self.start_eviction(task, reason);
        }
    }

    /// A gang given up for now: published, reported, and submitted again after a while.
    pub(super) fn timed_out(&mut self, d: &Decision, workload: &str, at: &Carried<'_>) {
        let policy = at.policy;
        let members: Vec<Task> =
            self.core.members_of(workload).map(|m| m.map(|(t, _)| t.clone()).collect()).unwrap_or_default();
        if let (Some(sink), Some(first)) = (self.reports.events.as_ref().filter(|s| s.wanted()), members.first()) {
            let status = self.core.status(workload);
            let facts = CycleFacts {
                min_member: members.len() as u32,
                placed: status.map_or(0, |s| s.explanation.gang.map_or(0, |g| g.0 as u32)),
                ..self.facts(first, 0)
            };
            for p in decisions::cycle(d, &facts, self.view.cache.nodes(), policy) {
                sink.emit(p);
            }
        }
        // Given up for a while, not for good: pods in Kubernetes wait as long as they exist.
        let _ = self.core.finish(workload);
        let retry = self.now() + self.config.resubmit_after.as_secs().max(1);
        self.next.not_before.insert(workload.to_string(), retry);
        let ids: Vec<String> = members.iter().map(|t| t.id.clone()).collect();
        self.report(&ids, &format!("pod group {workload} timed out waiting to be placed; retrying"));
    }

    /// A plugin fault the cycle recovered from: logged and published.
    pub(super) fn fault(&mut self, d: &Decision, fault: &PluginFault, at: &Carried<'_>) {
        let policy = at.policy;
        tracing::warn!(fault = %fault, "plugin fault");
        if let Some(sink) = self.reports.events.as_ref().filter(|s| s.wanted()) {
            let any = Task::default();
            for p in decisions::cycle(d, &self.facts(&any, 0), self.view.cache.nodes(), policy) {
                sink.emit(p);
            }
        }
    }

    /// A preemptor waits for its victims to go: its pods say so, and name the node(s) kept for
    /// them in `status.nominatedNodeName`, as kube-scheduler's do.
    pub(super) fn nominate(&mut self, workload: &str) {
        let Some(nodes) = self.core.nomination(workload) else { return };
        let Some(waiting): Option<Vec<Task>> =
            self.core.members_of(workload).map(|m| m.filter(|(_, placed)| !placed).map(|(t, _)| t.clone()).collect())
        else {
            return;
        };
        let message = self.core.explain(workload).map(reason).unwrap_or_default();
        tracing::info!(workload, nodes = ?nodes, "nominated: waiting for its victims to go");
        for (i, task) in waiting.iter().enumerate() {
            let Some(uid) = self.view.ours.get(&task.id).map(|f| f.uid.clone()) else { continue };
            // One write with the reason: the node of a gang's member is a hint, round robin.
            let node = nodes.get(i % nodes.len().max(1)).map(String::as_str);
            self.report_one(&task.id, &uid, &message, node);
        }
    }

    pub(super) fn facts<'a>(&self, task: &'a Task, attempt: u32) -> CycleFacts<'a> {
        let submitted = self.view.ours.get(&task.id).and_then(|f| f.created.as_ref()).map(crate::convert::event_time);
        CycleFacts {
            task,
            preemptor: None,
            grace_seconds: None,
            attempt,
            min_member: 1,
            placed: 0,
            waited_seconds: 0,
            submitted,
        }
    }

    /// `PodScheduled=False` with `message` on each pod, when it says something new.
    pub(super) fn report(&mut self, ids: &[String], message: &str) {
        for id in ids {
            let Some(uid) = self.view.ours.get(id).map(|f| f.uid.clone()) else { continue };
            self.report_one(id, &uid, message, None);
        }
    }

    pub(super) fn report_one(&mut self, id: &str, uid: &str, message: &str, nominated: Option<&str>) {
        if self.reports.reported.get(id).is_some_and(|m| m == message) {
            return;
        }
        tracing::debug!(pod = %id, reason = message, "unschedulable");
        if !*self.leadership.leader.borrow() {
            return;
        }
        self.reports.reported.insert(id.to_string(), message.to_string());
        if let Some(writer) = &self.reports.pod_status {
            writer.unschedulable(id, key_of_id(id), uid, message, nominated);
        }
    }

    /// Pod `id` no longer waits (bound, gone): nothing more is written about why it did.
    pub(super) fn unreport(&mut self, id: &str) {
        if self.reports.reported.remove(id).is_some()
            && let Some(writer) = &self.reports.pod_status
        {
            writer.forget(id);
        }
    }

    /// Binds a pod, its DRA claims written first (and taken back if the bind fails).
    pub(super) fn start_bind(
        &mut self,
        pod: &PodFacts,
        node: String,
        devices: Vec<DeviceShare>,
        mut claims: Vec<crate::dra::ClaimWrite>,
        decided_in: Duration,
    ) {
        let (effects, leader, done) =
            (self.api.effects.clone(), self.leadership.leader.clone(), self.in_flight.done_tx.clone());
        let nodes = self.view.cache.nodes();
        let numa = nodes.slot_of(&node).and_then(|s| nodes.get(s)).and_then(|n| convert::numa_of(n, &devices));
        let (key, uid, id) = (key_of(&pod.task), pod.uid.clone(), pod.task.id.clone());
        let binds = self.in_flight.binds.clone();
        tokio::spawn(async move {
            let permit = binds.acquire_owned().await;
            let started = Instant::now();
            // The run's start, on the pod too (a replica taking the run over reads it there).
            let at = wasmsched_events::Timestamp::now();
            // Checked at the last moment: a replica that lost the lease writes nothing more.
            let result = if !*leader.borrow() {
                Err(EffectError::NotLeader)
            } else if let Err(e) = effects.reserve_claims(&key, &uid, &mut claims).await {
                Err(e)
            } else {
                let bound = effects.bind(&key, &uid, &node, &devices, numa, at).await;
                if bound.is_err() {
                    effects.unreserve_claims(&key, &uid, &claims).await;
                }
                bound
            };
            let took = started.elapsed();
            let bound = result.is_ok();
            let _ = done.send(Done::Bind { id, claims, result, took, decided_in, at });
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
    pub(super) fn start_eviction(&mut self, id: &str, reason: &EvictReason) {
        let (effects, leader, done) =
            (self.api.effects.clone(), self.leadership.leader.clone(), self.in_flight.done_tx.clone());
        let metrics = self.shared.metrics.clone();
        let count = move |result: &'static str| metrics.evictions.get_or_create(&BindLabels { result }).inc();
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
                        count("ok");
                        tracing::info!(pod = %key, reason = %note, "evicted");
                        effects.event(&key, None, EventType::Normal, "Preempted", &note).await;
                        return;
                    }
                    Err(EffectError::NotFound(_)) => return,
                    Err(e) => {
                        count("refused");
                        if attempt == 0 {
                            tracing::warn!(pod = %key, error = %e, "eviction refused; retrying with back-off");
                        }
                    }
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(10));
            }
            count("abandoned");
            let _ = done.send(Done::EvictionAbandoned { id });
        });
    }

    pub(super) fn done(&mut self, done: Done) {
        match done {
            Done::Bind { id, claims, result, took, decided_in, at } => {
                if result.is_err() {
                    self.view.objects.dra.release(&claims);
                }
                // A claim made for the pod is known by its name from now on.
                for w in claims.iter().filter(|_| result.is_ok()) {
                    let Some(made) = &w.create else { continue };
                    let placeholder = made.claim.metadata.name.clone().unwrap_or_default();
                    self.view.objects.dra.created(&w.namespace, &placeholder, &w.name);
                    if let Some(task) = self.view.objects.dra_counted.remove(&format!("{}/{placeholder}", w.namespace))
                    {
                        self.view.objects.dra_counted.insert(format!("{}/{}", w.namespace, w.name), task);
                    }
                    if let Some(pod) = self.view.objects.dra_pods.get_mut(&id) {
                        pod.made = None;
                        pod.claims.push(crate::dra::ClaimRef {
                            name: "extended resources".into(),
                            claim: Some(w.name.clone()),
                            template: None,
                        });
                    }
                }
                self.bind_done(id, result, took, decided_in, at)
            }
            Done::RunFinished { run, at, phase } => self.run_finished(*run, at, phase.as_deref()),
            Done::EvictionAbandoned { id } => {
                tracing::warn!(pod = %id, "gave up evicting; it counts as running again");
                // The core stops holding its room as terminating; the node shows it as anyone's
                // pod, and a preemptor waiting for it tries again (elsewhere, or other victims).
                self.view.evicting.remove(&id);
                self.core.terminated(&id);
                if let Some(node) = self.view.cache.node_of(&id).map(String::from) {
                    self.stale(node);
                }
            }
        }
    }

    pub(super) fn bind_done(
        &mut self,
        id: String,
        result: Result<(), EffectError>,
        took: Duration,
        decided_in: Duration,
        at: wasmsched_events::Timestamp,
    ) {
        self.shared.metrics.bind_duration.observe(took.as_secs_f64());
        let (label, attempt) = match &result {
            Ok(()) => ("ok", "scheduled"),
            Err(EffectError::Conflict(_)) => ("conflict", "error"),
            Err(EffectError::NotFound(_)) => ("not_found", "error"),
            Err(EffectError::NotLeader) => ("not_leader", "error"),
            Err(EffectError::TooManyRequests(..)) => ("throttled", "error"),
            Err(EffectError::Retryable(_)) => ("retry", "error"),
        };
        self.shared.metrics.binds.get_or_create(&BindLabels { result: label }).inc();
        self.shared.metrics.attempt(attempt, decided_in + took);
        let events = self.reports.unconfirmed.remove(&id);
        match result {
            Ok(()) => self.run_started(&id, events.unwrap_or_default(), at),
            Err(e) => {
                // Bound elsewhere or gone (409/404): the watch stream says what is true, and the
                // pod leaves the pending ones when it shows it. Either way the pod waits a back-off
                // before it is submitted again: a 409 the watch has not explained yet (its event
                // still on the way, or never coming) must not be tried again at once, in a loop.
                let raced = matches!(e, EffectError::Conflict(_) | EffectError::NotFound(_));
                tracing::info!(pod = %id, error = %e, raced, "bind failed");
                self.view.cache.forget_assumed(&id);
                if self.core.placement_of(&id).is_some() {
                    let _ = self.core.remove_task(&id);
                }
                // The watch may already have shown it bound (by another scheduler, possibly to the
                // very node we chose): it runs there as others' usage, which the core sees only
                // once that node is shown to it again.
                if let Some(node) = self.view.cache.node_of(&id).map(String::from) {
                    self.stale(node);
                }
                let wait = e.retry_after().map_or(0, |d| d.as_secs());
                let at = self.now() + self.config.core.backoff_initial_seconds.max(1).max(wait);
                let wait_key = self.gang_of(&id).unwrap_or_else(|| id.clone());
                self.next.not_before.insert(wait_key, at);
                self.next.dirty = true;
            }
        }
    }
}

/// What [`Scheduler::other_kind_of_node`] did with an unschedulable workload.
enum Tried {
    /// Not a pod both kinds of node could serve: its reason stands.
    NotMixed,
    /// The device-plugin nodes had no room; the DRA nodes are tried next, at once.
    PluginNodesOnly,
    /// Both kinds were tried (or only one could serve it): it waits, for these reasons.
    Both(String),
}
