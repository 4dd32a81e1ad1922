//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas run with one binding.
//!
//! The rules are client-go's: a lease is taken over only when its holder has not renewed it for
//! `lease_duration` *as observed by this replica's clock* (so clock skew between replicas does not
//! matter), every write is a replace with the read `resourceVersion` (so two candidates cannot both
//! win), and a leader that cannot renew within `renew_deadline` steps down by itself — before any
//! other replica may take over, since `renew_deadline < lease_duration`. Leadership is published on a
//! `watch` channel that the binder checks before every write: the moment a renewal finds another
//! holder, this replica stops binding.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;

/// Lease timing and identity.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica (the pod name).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long steps down (< `lease_duration`).
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// kube-scheduler's defaults: 15 s lease, 10 s renew deadline, 2 s retry period.
    pub fn new(name: &str, namespace: &str, identity: &str) -> LeaseConfig {
        LeaseConfig {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What identifies a lease record: its holder and renew time.
type Record = (Option<String>, Option<MicroTime>);

/// A replica's view of the lease while it runs for leader.
pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The last record seen (holder, renew time, resource version) and when it was first seen.
    observed: Option<(Record, Instant)>,
    last_renewed: Option<Instant>,
    leader: watch::Sender<bool>,
}

/// What one round of the election did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Round {
    /// This replica holds the lease (acquired or renewed).
    Leading,
    /// Another replica holds a live lease.
    Following(String),
    /// The lease could not be read or written; leadership unchanged unless the deadline passed.
    Failed(String),
}

impl Elector {
    /// An elector publishing leadership on the returned channel (initially `false`).
    pub fn new(client: Client, config: LeaseConfig) -> (Elector, watch::Receiver<bool>) {
        let (leader, rx) = watch::channel(false);
        let api = Api::namespaced(client, &config.namespace);
        (Elector { api, config, observed: None, last_renewed: None, leader }, rx)
    }

    fn set_leader(&self, leading: bool) {
        self.leader.send_if_modified(|l| std::mem::replace(l, leading) != leading);
    }

    fn lease_spec(&self, transitions: i32, acquire: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.lease_duration.as_secs().max(1) as i32),
            acquire_time: Some(acquire.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt to acquire or renew.
    pub async fn round(&mut self) -> Round {
        // A hung API call must not keep a leader leading past its deadline.
        let limit = self.config.retry_period.max(self.config.renew_deadline / 2);
        let round = tokio::time::timeout(limit, self.try_round())
            .await
            .unwrap_or_else(|_| Round::Failed("lease request timed out".into()));
        let now = Instant::now();
        match &round {
            Round::Leading => {
                self.last_renewed = Some(now);
                self.set_leader(true);
            }
            Round::Following(holder) => {
                if *self.leader.borrow() {
                    tracing::warn!(holder, "lost the scheduler lease: stopped binding");
                }
                self.last_renewed = None;
                self.set_leader(false);
            }
            Round::Failed(error) => {
                let expired = self.last_renewed.is_none_or(|t| now.duration_since(t) >= self.config.renew_deadline);
                if expired && *self.leader.borrow() {
                    tracing::warn!(error, "could not renew the scheduler lease in time: stepped down");
                    self.set_leader(false);
                }
            }
        }
        round
    }

    async fn try_round(&mut self) -> Round {
        let name = self.config.name.clone();
        let lease = match self.api.get_opt(&name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(name), ..Default::default() },
                    spec: Some(self.lease_spec(0, None)),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Round::Leading,
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        Round::Failed("another replica created the lease".into())
                    }
                    Err(e) => Round::Failed(e.to_string()),
                };
            }
            Err(e) => return Round::Failed(e.to_string()),
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let record = (holder.clone(), spec.renew_time.clone());
        let now = Instant::now();
        match &self.observed {
            Some((seen, _)) if *seen == record => {}
            _ => self.observed = Some((record, now)),
        }
        let observed_at = self.observed.as_ref().map_or(now, |(_, t)| *t);
        let duration = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(self.config.lease_duration);
        let ours = holder.as_deref() == Some(self.config.identity.as_str());
        let expired = holder.is_none() || now.duration_since(observed_at) >= duration;
        if !ours && !expired {
            return Round::Following(holder.unwrap_or_default());
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let acquire = if ours { spec.acquire_time.clone() } else { None };
        let mut updated = lease;
        updated.spec = Some(self.lease_spec(transitions, acquire));
        // `updated` carries the resourceVersion we read: a concurrent writer makes this a 409.
        match self.api.replace(&self.config.name, &PostParams::default(), &updated).await {
            Ok(_) => Round::Leading,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.observed = None;
                Round::Following("(changed concurrently)".into())
            }
            Err(e) => Round::Failed(e.to_string()),
        }
    }

    /// Gives the lease up (on shutdown) so the other replica takes over at once instead of after
    /// the lease expires.
    pub async fn release(&mut self) {
        if !*self.leader.borrow() {
            return;
        }
        self.set_leader(false);
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else { return };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        if let Err(e) = self.api.replace(&self.config.name, &PostParams::default(), &lease).await {
            tracing::warn!(error = %e, "could not release the scheduler lease");
        }
    }

    /// Runs rounds every retry period until `stop` fires, then releases the lease.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            self.round().await;
            tokio::select! {
                _ = tokio::time::sleep(self.config.retry_period) => {}
                _ = stop.changed() => break,
            }
        }
        self.release().await;
    }
}
