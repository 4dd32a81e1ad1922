//! The scheduler's GPU decisions for this node, in the order the kubelet admits their pods, and
//! which of them the kubelet has carried out.
//!
//! The kubelet's device-plugin calls name devices, never the pod. What lets the agent tell which
//! decision a call is for:
//!
//! - the kubelet admits a node's pods one at a time (its pod-admission loop holds the device
//!   manager's allocation for one container at a time), in the order it learns of them from its
//!   watch of pods bound to the node; the agent watches the same pods (`spec.nodeName` = this
//!   node) and numbers each decision as it first sees it bound here ([`Decisions::apply`]). Watch
//!   events come in one order for every watcher of a resource, so the lowest number still waiting
//!   is the pod the kubelet is admitting, unless that pod was refused before its devices were
//!   asked for (then it is skipped below, and drops out when it turns `Failed`).
//! - `GetPreferredAllocation` answers with the first waiting decision whose GPUs fit the request
//!   (the size, and all of them among the devices the kubelet still has free);
//! - `Allocate` is the check that cannot be fooled: the devices the kubelet chose must be exactly
//!   GPUs of one waiting decision, none held by another pod and no GPU's shares over 1000 milli;
//!   else it is **refused**, the pod fails admission with the reason in its events, and nothing is
//!   handed out silently. A container never gets a GPU the scheduler did not give its pod.
//!
//! Races, and why they are safe: the kubelet admits a pod the moment its watch shows it bound, and
//! the agent's watch of the same API server may show it a few milliseconds later (seen on a real
//! kubelet: its `GetPreferredAllocation` came before the agent knew the pod). So a call no decision
//! explains waits for the watch — it looks again on every pod the watch shows, for
//! [`DEFAULT_GRACE`] — and only then is refused (the kubelet reports it; the pod's controller makes
//! a new one). A call a decision explains but that is wrong (a GPU held) is refused at once. Two
//! waiting pods whose decisions both fit a request could be swapped only if the kubelet admitted
//! them out of watch order; each still gets GPUs the scheduler gave one of them, never a GPU twice
//! (the check above), and the swap shows as a difference between the annotation and the kubelet's
//! PodResources. After an agent restart, pods whose containers started hold their decided GPUs
//! again (from their status), so nothing they hold can be given to another.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use wasmsched_api::{DeviceShare, GPU_MILLI};
use wasmsched_deviceplugin::Refusal;
use wasmsched_topology::annotation::{GPU_IDS_ANNOTATION, parse_gpu_ids};

/// A pod, as messages name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// `namespace/name`.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// One pod's decision and what of it the kubelet has carried out.
#[derive(Debug)]
struct Decided {
    pod: PodRef,
    /// When the agent first saw it bound here: the kubelet's admission order.
    seen: u64,
    whole: Vec<u32>,
    share: Option<DeviceShare>,
    given_whole: BTreeSet<u32>,
    given_share: bool,
    /// Its containers have started: its allocation is over, it holds all it was given.
    started: bool,
}

impl Decided {
    fn waiting_whole(&self) -> Vec<u32> {
        if self.started {
            Vec::new()
        } else {
            self.whole.iter().copied().filter(|g| !self.given_whole.contains(g)).collect()
        }
    }

    fn waiting_share(&self) -> Option<DeviceShare> {
        self.share.filter(|_| !self.started && !self.given_share)
    }

    /// Whole GPUs it holds now.
    fn holds_whole(&self) -> impl Iterator<Item = u32> + '_ {
        self.whole.iter().copied().filter(|g| self.started || self.given_whole.contains(g))
    }

    fn holds_share(&self) -> Option<DeviceShare> {
        self.share.filter(|_| self.started || self.given_share)
    }
}

#[derive(Default)]
struct Ledger {
    next: u64,
    pods: BTreeMap<String, Decided>,
}

impl Ledger {
    fn waiting(&self) -> Vec<&Decided> {
        let mut pods: Vec<&Decided> = self.pods.values().filter(|d| !d.started).collect();
        pods.sort_by_key(|d| d.seen);
        pods
    }

    /// Who holds `gpu` whole, and the milli of shares on it.
    fn holders(&self, gpu: u32) -> (Option<&PodRef>, u32) {
        let whole = self.pods.values().find(|d| d.holds_whole().any(|g| g == gpu)).map(|d| &d.pod);
        let shares =
            self.pods.values().filter_map(Decided::holds_share).filter(|s| s.gpu == gpu).map(|s| s.milli).sum();
        (whole, shares)
    }
}

/// How long a kubelet call no decision explains waits for the agent's watch to show one.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(2);

/// Why a call found nothing to give.
enum Miss {
    /// No waiting decision explains it (yet): the agent's watch may be behind the kubelet's.
    NoDecision(String),
    /// A decision explains it, and it is still wrong (a GPU held, a share that does not fit).
    Refused(Refusal),
}

/// The decisions for one node.
pub struct Decisions {
    node: String,
    ledger: Mutex<Ledger>,
    /// Signalled on every pod the watch shows.
    changed: Condvar,
    grace: Duration,
    /// The watch has listed the node's pods once: until then the ledger knows nothing of the
    /// pods running here, so nothing may be concluded from what it lacks.
    listed: AtomicBool,
}

impl Decisions {
    /// The decisions for the node `node` (none yet).
    pub fn new(node: impl Into<String>) -> Decisions {
        Decisions {
            node: node.into(),
            ledger: Mutex::default(),
            changed: Condvar::new(),
            grace: DEFAULT_GRACE,
            listed: AtomicBool::new(false),
        }
    }

    /// How long a call no decision explains waits for one before it is refused
    /// ([`DEFAULT_GRACE`]). The kubelet sees a pod bound as soon as the agent does — both watch the
    /// same API server — and admits it at once, so on a real node its call often comes a few
    /// milliseconds before the agent's watch shows the decision.
    pub fn with_grace(mut self, grace: Duration) -> Decisions {
        self.grace = grace;
        self
    }

    /// `attempt` on the ledger; while no decision explains the call, again on each pod the watch
    /// shows, for [`Decisions::with_grace`] at most.
    fn patiently<T>(&self, mut attempt: impl FnMut(&mut Ledger) -> Result<T, Miss>) -> Result<T, Refusal> {
        let until = Instant::now() + self.grace;
        let mut ledger = self.ledger.lock().expect("ledger lock");
        loop {
            match attempt(&mut ledger) {
                Ok(v) => return Ok(v),
                Err(Miss::Refused(r)) => return Err(r),
                Err(Miss::NoDecision(what)) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(self.no_decision(&ledger, &what));
                    }
                    ledger = self.changed.wait_timeout(ledger, left).expect("ledger lock").0;
                }
            }
        }
    }

    /// A pod as the watch shows it now (added or changed).
    pub fn apply(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else { return };
        let mut ledger = self.ledger.lock().expect("ledger lock");
        // Whatever it changes, a call waiting for a decision looks again once the lock is free.
        self.changed.notify_all();
        let here = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node.as_str());
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        let ids = pod.metadata.annotations.as_ref().and_then(|a| a.get(GPU_IDS_ANNOTATION));
        let (true, false, Some(ids)) = (here, matches!(phase, "Succeeded" | "Failed"), ids) else {
            ledger.pods.remove(&uid);
            return;
        };
        let name = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        let devices = match parse_gpu_ids(ids) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(pod = %name, error = %e, "unreadable GPU decision; its devices will be refused");
                ledger.pods.remove(&uid);
                return;
            }
        };
        let started = phase == "Running" || containers_started(pod);
        if let Some(known) = ledger.pods.get_mut(&uid) {
            known.started |= started;
            return;
        }
        let seen = ledger.next;
        ledger.next += 1;
        let whole = devices.iter().filter(|d| d.milli >= GPU_MILLI).map(|d| d.gpu).collect();
        let share = devices.iter().find(|d| d.milli < GPU_MILLI).copied();
        ledger.pods.insert(
            uid.clone(),
            Decided {
                pod: PodRef { name, uid },
                seen,
                whole,
                share,
                given_whole: BTreeSet::new(),
                given_share: false,
                started,
            },
        );
    }

    /// A pod deleted: what it held is free.
    pub fn delete(&self, uid: &str) {
        self.ledger.lock().expect("ledger lock").pods.remove(uid);
    }

    /// The watch listed every pod again: those not among `pods` are gone.
    pub fn retain(&self, uids: &BTreeSet<String>) {
        self.ledger.lock().expect("ledger lock").pods.retain(|uid, _| uids.contains(uid));
        self.listed.store(true, Ordering::Release);
    }

    /// Whether the watch has listed the node's pods (see [`Decisions::retain`]) since the agent
    /// started: before that, a GPU with no decision may still hold a running pod's share.
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// The GPUs that hold shares or have shares decided on them: those whose MPS daemon must run.
    pub fn share_gpus(&self) -> BTreeSet<u32> {
        let ledger = self.ledger.lock().expect("ledger lock");
        ledger.pods.values().filter_map(|d| d.share).map(|s| s.gpu).collect()
    }

    /// `GetPreferredAllocation` for `size` whole GPUs among `available`: the GPUs of the first
    /// waiting decision that fits.
    pub fn prefer_whole(&self, available: &[u32], must_include: &[u32], size: usize) -> Result<Vec<u32>, Refusal> {
        self.patiently(|ledger| {
            for d in ledger.waiting() {
                let waiting = d.waiting_whole();
                if waiting.len() < size {
                    continue;
                }
                let pick: Vec<u32> = waiting[..size].to_vec();
                if pick.iter().all(|g| available.contains(g)) && must_include.iter().all(|g| pick.contains(g)) {
                    return Ok(pick);
                }
            }
            Err(Miss::NoDecision(format!("{size} whole GPU(s) among {available:?}")))
        })
    }

    /// `Allocate` of the whole GPUs `gpus`: which pod they are for, now marked given; refused
    /// unless they are GPUs of one waiting decision and nobody else holds them.
    pub fn give_whole(&self, gpus: &[u32]) -> Result<PodRef, Refusal> {
        self.patiently(|ledger| {
            let uid = ledger
                .waiting()
                .into_iter()
                .find(|d| {
                    let waiting = d.waiting_whole();
                    gpus.iter().all(|g| waiting.contains(g))
                })
                .map(|d| d.pod.uid.clone())
                .ok_or_else(|| Miss::NoDecision(format!("whole GPU(s) {gpus:?}")))?;
            for &gpu in gpus {
                match ledger.holders(gpu) {
                    (Some(holder), _) => {
                        let why = format!("GPU {gpu} on node {} is held by pod {}", self.node, holder.name);
                        return Err(Miss::Refused(Refusal(why)));
                    }
                    (None, milli) if milli > 0 => {
                        let why = format!("GPU {gpu} on node {} holds shares of other pods ({milli} milli)", self.node);
                        return Err(Miss::Refused(Refusal(why)));
                    }
                    _ => {}
                }
            }
            let d = ledger.pods.get_mut(&uid).expect("found above");
            d.given_whole.extend(gpus.iter().copied());
            Ok(d.pod.clone())
        })
    }

    /// `GetPreferredAllocation` for a share of `milli` with `free` milli-units free per GPU: the
    /// GPU of the first waiting share decision of that size whose GPU has room.
    pub fn prefer_share(&self, free: &BTreeMap<u32, usize>, milli: u32) -> Result<u32, Refusal> {
        self.patiently(|ledger| {
            for d in ledger.waiting() {
                if let Some(s) = d.waiting_share()
                    && s.milli == milli
                    && free.get(&s.gpu).copied().unwrap_or(0) >= milli as usize
                {
                    return Ok(s.gpu);
                }
            }
            Err(Miss::NoDecision(format!("a share of {milli} milli")))
        })
    }

    /// `Allocate` of `milli` units on `gpu`: which pod it is for, now marked given; refused unless
    /// it is one waiting share decision and the GPU has room for it beside its other holders.
    pub fn give_share(&self, gpu: u32, milli: u32) -> Result<PodRef, Refusal> {
        self.patiently(|ledger| {
            let uid = ledger
                .waiting()
                .into_iter()
                .find(|d| d.waiting_share() == Some(DeviceShare { gpu, milli }))
                .map(|d| d.pod.uid.clone())
                .ok_or_else(|| Miss::NoDecision(format!("a share of {milli} milli of GPU {gpu}")))?;
            match ledger.holders(gpu) {
                (Some(holder), _) => {
                    let why = format!("GPU {gpu} on node {} is held whole by pod {}", self.node, holder.name);
                    return Err(Miss::Refused(Refusal(why)));
                }
                (None, held) if held + milli > GPU_MILLI => {
                    let free = GPU_MILLI - held.min(GPU_MILLI);
                    let why = format!("GPU {gpu} on node {} has {free} milli free, the share needs {milli}", self.node);
                    return Err(Miss::Refused(Refusal(why)));
                }
                _ => {}
            }
            let d = ledger.pods.get_mut(&uid).expect("found above");
            d.given_share = true;
            Ok(d.pod.clone())
        })
    }

    fn no_decision(&self, ledger: &Ledger, what: &str) -> Refusal {
        let waiting: Vec<String> = ledger
            .waiting()
            .iter()
            .filter(|d| !d.waiting_whole().is_empty() || d.waiting_share().is_some())
            .take(5)
            .map(|d| format!("{} ({})", d.pod.name, describe(d)))
            .collect();
        Refusal(format!(
            "wasmsched: no pod bound to node {} was given {what} by the scheduler (waiting here: {}); \
             the devices are not handed out",
            self.node,
            if waiting.is_empty() { "none".to_string() } else { waiting.join(", ") }
        ))
    }
}

fn describe(d: &Decided) -> String {
    let mut parts: Vec<String> = d.waiting_whole().iter().map(u32::to_string).collect();
    if let Some(s) = d.waiting_share() {
        parts.push(format!("{}:{}", s.gpu, s.milli));
    }
    format!("GPUs {}", parts.join(","))
}

fn containers_started(pod: &Pod) -> bool {
    let Some(status) = &pod.status else { return false };
    status.container_statuses.iter().flatten().chain(status.init_container_statuses.iter().flatten()).any(|c| {
        c.state.as_ref().is_some_and(|s| s.running.is_some() || s.terminated.is_some())
            || c.last_state.as_ref().is_some_and(|s| s.running.is_some() || s.terminated.is_some())
    })
}
