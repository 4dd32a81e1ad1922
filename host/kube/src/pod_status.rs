//! Why each pending pod waits, on the pod: `PodScheduled=False` with the reason (and a
//! `FailedScheduling` event). One writer task owns these writes so that, however fast reasons
//! change, the API server sees at most one write per pod per change that is still current:
//!
//! - **coalesced, latest wins**: a reason that changes again before its write went out replaces it;
//! - **never reordered**: at most one write per pod is in flight, the next waits for it;
//! - **retried**: 429 and 5xx answers and transport errors are retried after the server's
//!   `Retry-After` (else a back-off doubling from 1 s to 30 s), unless a newer reason came;
//! - **bounded**: a few writes in flight at once; a pod that is bound or gone is forgotten.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ahash::{AHashMap, AHashSet};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::bind::EffectError;
use crate::convert::PodKey;
use crate::executor::Executor;

/// Writes in flight at most.
const IN_FLIGHT: usize = 8;
/// Longest back-off between retries of one pod's write.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

enum Command {
    Set { id: String, key: PodKey, uid: String, message: String, nominated: Option<String> },
    Forget { id: String },
}

/// The handle the scheduler loop reports through; cheap, never blocks.
#[derive(Clone)]
pub struct PodStatusWriter {
    tx: mpsc::UnboundedSender<Command>,
}

impl PodStatusWriter {
    /// Starts the writer task; it writes only while `leader` is `true`, and ends with the handle.
    pub fn start(effects: Arc<dyn Executor>, leader: watch::Receiver<bool>) -> PodStatusWriter {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(Worker::new(effects, leader).run(rx));
        PodStatusWriter { tx }
    }

    /// Pod `id` (`key`, incarnation `uid`) waits because of `message` (nominated to a node while
    /// its victims go, when `nominated`).
    pub fn unschedulable(&self, id: &str, key: PodKey, uid: &str, message: &str, nominated: Option<&str>) {
        let nominated = nominated.map(String::from);
        let command = Command::Set { id: id.into(), key, uid: uid.into(), message: message.into(), nominated };
        let _ = self.tx.send(command);
    }

    /// Pod `id` was bound or is gone: a reason not written yet is dropped.
    pub fn forget(&self, id: &str) {
        let _ = self.tx.send(Command::Forget { id: id.into() });
    }
}

struct Pending {
    key: PodKey,
    uid: String,
    message: String,
    nominated: Option<String>,
}

struct Worker {
    effects: Arc<dyn Executor>,
    leader: watch::Receiver<bool>,
    /// The reason to write next, per pod.
    latest: AHashMap<String, Pending>,
    /// Pods with a write due, in the order their reasons came.
    due: VecDeque<String>,
    queued: AHashSet<String>,
    in_flight: AHashSet<String>,
    /// Pods backing off after a failed write, until when.
    backoff: AHashMap<String, Instant>,
    /// Failed writes in a row per pod (until one succeeds): the back-off doubles with them.
    failures: AHashMap<String, u32>,
    writes: JoinSet<(String, Pending, Result<(), EffectError>)>,
}

impl Worker {
    fn new(effects: Arc<dyn Executor>, leader: watch::Receiver<bool>) -> Worker {
        Worker {
            effects,
            leader,
            latest: AHashMap::new(),
            due: VecDeque::new(),
            queued: AHashSet::new(),
            in_flight: AHashSet::new(),
            backoff: AHashMap::new(),
            failures: AHashMap::new(),
            writes: JoinSet::new(),
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            self.start_writes();
            let next_retry = self.backoff.values().min().copied();
            tokio::select! {
                command = rx.recv() => match command {
                    Some(command) => self.apply(command),
                    None => break,
                },
                Some(Ok((id, written, result))) = self.writes.join_next(), if !self.writes.is_empty() => {
                    self.finished(id, written, result);
                }
                _ = sleep_until(next_retry) => self.retry_due(),
                Ok(()) = self.leader.changed() => {}
            }
        }
        // The scheduler stopped: writes in flight finish, nothing new starts.
        while self.writes.join_next().await.is_some() {}
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Set { id, key, uid, message, nominated } => {
                self.latest.insert(id.clone(), Pending { key, uid, message, nominated });
                self.mark_due(id);
            }
            Command::Forget { id } => {
                self.latest.remove(&id);
                self.backoff.remove(&id);
                self.failures.remove(&id);
            }
        }
    }

    fn mark_due(&mut self, id: String) {
        if !self.in_flight.contains(&id) && !self.backoff.contains_key(&id) && self.queued.insert(id.clone()) {
            self.due.push_back(id);
        }
    }

    fn start_writes(&mut self) {
        if !*self.leader.borrow() {
            return;
        }
        while self.in_flight.len() < IN_FLIGHT {
            let Some(id) = self.due.pop_front() else { break };
            self.queued.remove(&id);
            let Some(pending) = self.latest.remove(&id) else { continue };
            self.in_flight.insert(id.clone());
            let effects = self.effects.clone();
            self.writes.spawn(async move {
                let (key, uid, nominated) = (&pending.key, &pending.uid, pending.nominated.as_deref());
                let result = effects.unschedulable(key, uid, &pending.message, nominated).await;
                (id, pending, result)
            });
        }
    }

    fn finished(&mut self, id: String, written: Pending, result: Result<(), EffectError>) {
        self.in_flight.remove(&id);
        match result {
            // Written; or gone, another incarnation, not leading: nothing more to tell it now.
            Ok(()) | Err(EffectError::NotFound(_) | EffectError::Conflict(_) | EffectError::NotLeader) => {
                self.failures.remove(&id);
            }
            Err(e) => {
                let failures = self.failures.entry(id.clone()).or_default();
                *failures += 1;
                let doubling = Duration::from_secs(1u64 << (*failures - 1).min(5)).min(MAX_BACKOFF);
                let wait = e.retry_after().unwrap_or(doubling);
                tracing::debug!(pod = %written.key, error = %e, ?wait, "PodScheduled not written; retrying");
                // A newer reason, if one came meanwhile, is what the retry writes.
                self.latest.entry(id.clone()).or_insert(written);
                self.backoff.insert(id, Instant::now() + wait);
                return;
            }
        }
        if self.latest.contains_key(&id) {
            self.mark_due(id);
        }
    }

    fn retry_due(&mut self) {
        let now = Instant::now();
        let ready: Vec<String> = self.backoff.iter().filter(|(_, at)| **at <= now).map(|(id, _)| id.clone()).collect();
        for id in ready {
            self.backoff.remove(&id);
            if self.latest.contains_key(&id) {
                self.mark_due(id);
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
