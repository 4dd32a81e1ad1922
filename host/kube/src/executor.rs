//! Where the scheduling loop's writes go: one interface for everything a decision writes (binds
//! with their claims, why a pod waits, checkpoint requests, evictions, events) and the one read a
//! run's end needs.
//!
//! The API server's implementation is [`crate::bind::Effects`]. [`Recording`] writes nothing: it
//! answers each write and tells it on a channel, so the loop can be driven without HTTP — whoever
//! holds the channel plays the API server and shows the result on the watch streams it hands the
//! loop ([`crate::scheduler::Watches`]). The fake HTTP API server stays for what only the HTTP
//! boundary shows (RBAC, 429s, field ownership, graceful deletion).

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use wasmsched_api::DeviceShare;
use wasmsched_events::Timestamp;

use crate::bind::{EffectError, EventType};
use crate::convert::PodKey;
use crate::dra::ClaimWrite;

/// Carries out a decision's writes. Each call may be slow (the API server's latency, its rate
/// limits): the loop calls them on tasks of their own, never on the scheduling task.
pub trait Executor: Send + Sync + 'static {
    /// Binds pod `key` (incarnation `uid`) to `node` with `devices` (on NUMA node `numa` when
    /// they share one); `at` is the run's start, written on the pod.
    fn bind<'a>(
        &'a self,
        key: &'a PodKey,
        uid: &'a str,
        node: &'a str,
        devices: &'a [DeviceShare],
        numa: Option<u32>,
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), EffectError>>;

    /// Writes the pod's DRA claims before its bind (creating those still to be made: their names
    /// are written back into `writes`).
    fn reserve_claims<'a>(
        &'a self,
        key: &'a PodKey,
        uid: &'a str,
        writes: &'a mut [ClaimWrite],
    ) -> BoxFuture<'a, Result<(), EffectError>>;

    /// Takes back what [`Executor::reserve_claims`] wrote: the bind failed.
    fn unreserve_claims<'a>(&'a self, key: &'a PodKey, uid: &'a str, writes: &'a [ClaimWrite]) -> BoxFuture<'a, ()>;

    /// Says on the pod why it waits (`PodScheduled=False`), and the node it is nominated for.
    fn unschedulable<'a>(
        &'a self,
        key: &'a PodKey,
        uid: &'a str,
        message: &'a str,
        nominated: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), EffectError>>;

    /// Asks a victim that can checkpoint to do so by `deadline`, for `preemptor`.
    fn request_checkpoint<'a>(
        &'a self,
        key: &'a PodKey,
        preemptor: &'a str,
        deadline: &'a str,
    ) -> BoxFuture<'a, Result<(), EffectError>>;

    /// Evicts a victim; a refusal (a disruption budget) is [`EffectError::TooManyRequests`].
    fn evict<'a>(&'a self, key: &'a PodKey) -> BoxFuture<'a, Result<(), EffectError>>;

    /// Records an event about a pod (best effort: nothing waits on it).
    fn event<'a>(
        &'a self,
        key: &'a PodKey,
        uid: Option<&'a str>,
        type_: EventType,
        reason: &'a str,
        note: &'a str,
    ) -> BoxFuture<'a, ()>;

    /// How pod `key`, which left the watch without its end showing, ended: `Evicted` when the
    /// kubelet evicted it, else its phase; `None` when it is gone or cannot be read.
    fn ended_as<'a>(&'a self, key: &'a PodKey) -> BoxFuture<'a, Option<String>>;
}

/// One write the loop made, as [`Recording`] tells it.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// `pod` bound to `node` with `devices`.
    Bind {
        /// The pod.
        pod: PodKey,
        /// Its incarnation.
        uid: String,
        /// Where.
        node: String,
        /// Its GPUs (or shares of them).
        devices: Vec<DeviceShare>,
    },
    /// `pod`'s claims (`namespace/name`) written before its bind.
    ClaimsReserved {
        /// The pod.
        pod: PodKey,
        /// The claims.
        claims: Vec<String>,
    },
    /// `pod`'s claims taken back: its bind failed.
    ClaimsReleased {
        /// The pod.
        pod: PodKey,
        /// The claims.
        claims: Vec<String>,
    },
    /// Why `pod` waits, and the node it is nominated for.
    Unschedulable {
        /// The pod.
        pod: PodKey,
        /// Why, as `PodScheduled=False` says it.
        message: String,
        /// `status.nominatedNodeName`.
        nominated: Option<String>,
    },
    /// `pod` asked to checkpoint for `preemptor`.
    CheckpointRequested {
        /// The victim.
        pod: PodKey,
        /// Who needs its room.
        preemptor: String,
    },
    /// `pod` evicted.
    Evict {
        /// The victim.
        pod: PodKey,
    },
    /// An event about `pod`.
    Event {
        /// The pod.
        pod: PodKey,
        /// `Scheduled`, `Preempted`, `FailedScheduling`, …
        reason: String,
        /// What it says.
        note: String,
    },
}

/// A write and how it was answered.
pub type Answered = (Write, Result<(), EffectError>);

/// How [`Recording`] answers a write: `Ok` unless told otherwise.
pub type Answer = Box<dyn Fn(&Write) -> Result<(), EffectError> + Send + Sync>;

/// An executor in memory: every write is answered by `answer` (success by default) and sent,
/// answered, on a channel.
pub struct Recording {
    sent: mpsc::UnboundedSender<Answered>,
    answer: Answer,
}

impl Recording {
    /// An executor whose writes all succeed, and the channel that tells them with their answers.
    pub fn new() -> (Recording, mpsc::UnboundedReceiver<Answered>) {
        let (sent, writes) = mpsc::unbounded_channel();
        (Recording { sent, answer: Box::new(|_| Ok(())) }, writes)
    }

    /// Writes answered by `answer` instead (a conflict, a refusal, a server error).
    pub fn answering(mut self, answer: impl Fn(&Write) -> Result<(), EffectError> + Send + Sync + 'static) -> Self {
        self.answer = Box::new(answer);
        self
    }

    fn write(&self, write: Write) -> Result<(), EffectError> {
        let answer = (self.answer)(&write);
        let _ = self.sent.send((write, answer.clone()));
        answer
    }
}

impl Executor for Recording {
    fn bind<'a>(
        &'a self,
        key: &'a PodKey,
        uid: &'a str,
        node: &'a str,
        devices: &'a [DeviceShare],
        _numa: Option<u32>,
        _at: Timestamp,
    ) -> BoxFuture<'a, Result<(), EffectError>> {
        let write = Write::Bind { pod: key.clone(), uid: uid.into(), node: node.into(), devices: devices.to_vec() };
        Box::pin(std::future::ready(self.write(write)))
    }

    fn reserve_claims<'a>(
        &'a self,
        key: &'a PodKey,
        _uid: &'a str,
        writes: &'a mut [ClaimWrite],
    ) -> BoxFuture<'a, Result<(), EffectError>> {
        let result = if writes.is_empty() {
            Ok(())
        } else {
            let claims = writes.iter().map(|w| format!("{}/{}", w.namespace, w.name)).collect();
            self.write(Write::ClaimsReserved { pod: key.clone(), claims })
        };
        Box::pin(std::future::ready(result))
    }

    fn unreserve_claims<'a>(&'a self, key: &'a PodKey, _uid: &'a str, writes: &'a [ClaimWrite]) -> BoxFuture<'a, ()> {
        if !writes.is_empty() {
            let claims = writes.iter().map(|w| format!("{}/{}", w.namespace, w.name)).collect();
            let _ = self.write(Write::ClaimsReleased { pod: key.clone(), claims });
        }
        Box::pin(std::future::ready(()))
    }

    fn unschedulable<'a>(
        &'a self,
        key: &'a PodKey,
        _uid: &'a str,
        message: &'a str,
        nominated: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), EffectError>> {
        let write =
            Write::Unschedulable { pod: key.clone(), message: message.into(), nominated: nominated.map(String::from) };
        Box::pin(std::future::ready(self.write(write)))
    }

    fn request_checkpoint<'a>(
        &'a self,
        key: &'a PodKey,
        preemptor: &'a str,
        _deadline: &'a str,
    ) -> BoxFuture<'a, Result<(), EffectError>> {
        let write = Write::CheckpointRequested { pod: key.clone(), preemptor: preemptor.into() };
        Box::pin(std::future::ready(self.write(write)))
    }

    fn evict<'a>(&'a self, key: &'a PodKey) -> BoxFuture<'a, Result<(), EffectError>> {
        Box::pin(std::future::ready(self.write(Write::Evict { pod: key.clone() })))
    }

    fn event<'a>(
        &'a self,
        key: &'a PodKey,
        _uid: Option<&'a str>,
        _type: EventType,
        reason: &'a str,
        note: &'a str,
    ) -> BoxFuture<'a, ()> {
        let _ = self.write(Write::Event { pod: key.clone(), reason: reason.into(), note: note.into() });
        Box::pin(std::future::ready(()))
    }

    fn ended_as<'a>(&'a self, _key: &'a PodKey) -> BoxFuture<'a, Option<String>> {
        Box::pin(std::future::ready(None))
    }
}
