//! The run's one watch on its pods: when each was first seen bound (client clock); the kubelet's
//! part for pods that have none — a pod being deleted (a preemption's victim) is removed at once, as
//! a kubelet would once its containers stopped, so a preemptor is not left waiting for a node that
//! will never report back; with a lifetime, each measured pod's end (churn); and a check that no
//! node ever holds more GPUs than it has, in the order the server saw the changes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::watch as signal;

use crate::OwnRequests;
use crate::objects::{ROLE_LABEL, RUN_LABEL};

#[derive(Default)]
struct Seen {
    /// Measured pods by name: when first seen bound.
    bound: HashMap<String, Instant>,
    /// Filler pods seen bound.
    fillers: HashSet<String>,
    /// Pods whose deletion this finished, by UID.
    finished: HashSet<String>,
    /// The first list is complete.
    listed: bool,
    /// GPUs held per node by the bound pods not yet gone, by pod UID (a pod being deleted holds
    /// its GPUs until it is gone, as on a kubelet).
    held: HashMap<String, HashMap<String, u64>>,
    /// The most GPUs any node was seen to hold beyond its capacity, and on how many changes.
    overcommit: Overcommit,
    /// Measured pods ended by their lifetime.
    ended: usize,
    /// Fillers created to replace preempted ones.
    refilled: usize,
    /// Every bound pod not yet gone (any role), by UID: when first seen bound and its GPUs.
    since: HashMap<String, (Instant, u64)>,
    /// What the gone pods held: pods and GPU-seconds from bound to gone.
    gone: History,
}

/// The pods' own history as the watch saw it, to hold a scheduler's event and usage counts
/// against: every pod of the run seen bound (fillers too), and GPU-seconds from each pod's bind to
/// its end (client clock; a pod still running counts to now).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct History {
    /// Pods seen bound.
    pub bound: usize,
    /// GPU-seconds they held.
    pub gpu_seconds: f64,
}

/// Reads the watch's pod counts from anywhere.
#[derive(Clone)]
pub struct Counts(Arc<Mutex<Seen>>);

impl Counts {
    /// Pods bound and not yet gone, and the measured pods ended by their lifetime.
    pub fn now(&self) -> (usize, usize) {
        let s = self.0.lock().unwrap();
        (s.held.values().map(HashMap::len).sum(), s.ended)
    }
}

/// Nodes seen holding more GPUs than they have.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Overcommit {
    /// Changes after which some node held more than its GPUs.
    pub times: usize,
    /// The most GPUs beyond capacity a node held.
    pub most: u64,
}

/// What the watch does besides recording binds.
#[derive(Clone, Debug)]
pub struct Duties {
    /// GPUs on each node (for the overcommit check).
    pub gpus_per_node: u32,
    /// Delete each measured pod this long after it was seen bound.
    pub lifetime: Option<Duration>,
    /// Replace each filler deleted (a preemption's victim) with a new one made from this pod,
    /// renamed, as its ReplicaSet would.
    pub refill: Option<serde_json::Value>,
}

/// The running watch.
pub struct Watch {
    seen: Arc<Mutex<Seen>>,
    changed: signal::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// Watches the pods of run `run` in `namespace`.
    pub fn start(client: Client, namespace: &str, run: &str, own: OwnRequests, duties: Duties) -> Watch {
        let api = Api::<Pod>::namespaced(client, namespace);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, changed) = signal::channel(0u64);
        let config = watcher::Config::default().labels(&format!("{RUN_LABEL}={run}"));
        let stream = watcher(api.clone(), config);
        let task = tokio::spawn(follow(stream, api, seen.clone(), tx, own, duties));
        Watch { seen, changed, task }
    }

    /// Returns once the first list is complete (pods created after it are all seen).
    pub async fn wait_listed(&self) {
        self.wait_until(|s| s.listed, None).await;
    }

    /// Waits until `count` filler pods have been bound, at most `timeout`; returns how many were.
    pub async fn wait_fillers(&self, count: usize, timeout: Duration) -> usize {
        self.wait_until(|s| s.fillers.len() >= count, Some(Instant::now() + timeout)).await;
        self.seen.lock().unwrap().fillers.len()
    }

    /// Waits until `count` measured pods have been bound or `deadline`; returns how many were.
    pub async fn wait_measured(&self, count: usize, deadline: Instant) -> usize {
        self.wait_until(|s| s.bound.len() >= count, Some(deadline)).await;
        self.seen.lock().unwrap().bound.len()
    }

    /// When each bound measured pod was first seen bound, by name (copied once, for the report).
    pub fn bound_times(&self) -> HashMap<String, Instant> {
        self.seen.lock().unwrap().bound.clone()
    }

    /// Deletions this finished so far.
    pub fn finished_terminations(&self) -> usize {
        self.seen.lock().unwrap().finished.len()
    }

    /// Fillers created so far to replace preempted ones.
    pub fn refilled(&self) -> usize {
        self.seen.lock().unwrap().refilled
    }

    /// The run's pods seen bound and the GPU-seconds they held, up to now.
    pub fn history(&self) -> History {
        let s = self.seen.lock().unwrap();
        let now = Instant::now();
        let running = s.since.values().map(|(at, gpus)| (now - *at).as_secs_f64() * *gpus as f64).sum::<f64>();
        History { bound: s.gone.bound + s.since.len(), gpu_seconds: s.gone.gpu_seconds + running }
    }

    /// Nodes seen over their GPUs so far.
    pub fn overcommit(&self) -> Overcommit {
        self.seen.lock().unwrap().overcommit
    }

    /// A handle that reads the pods alive and ended ([`Counts::now`]) from another task.
    pub fn counts(&self) -> Counts {
        Counts(self.seen.clone())
    }

    /// Stops watching.
    pub fn stop(&self) {
        self.task.abort();
    }

    async fn wait_until(&self, done: impl Fn(&Seen) -> bool, deadline: Option<Instant>) {
        let mut changed = self.changed.clone();
        loop {
            if done(&self.seen.lock().unwrap()) {
                return;
            }
            let next = changed.changed();
            match deadline {
                Some(d) => match tokio::time::timeout_at(d.into(), next).await {
                    Ok(Ok(())) => {}
                    _ => return,
                },
                None => {
                    if next.await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

async fn follow(
    stream: impl futures_util::Stream<Item = Result<watcher::Event<Pod>, watcher::Error>>,
    api: Api<Pod>,
    seen: Arc<Mutex<Seen>>,
    changed: signal::Sender<u64>,
    own: OwnRequests,
    duties: Duties,
) {
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            Ok(watcher::Event::Delete(pod)) => {
                let mut s = seen.lock().unwrap();
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
                let uid = pod.uid().unwrap_or_default();
                if let Some(pods) = s.held.get_mut(&node) {
                    pods.remove(&uid);
                }
                if let Some((at, gpus)) = s.since.remove(&uid) {
                    s.gone.bound += 1;
                    s.gone.gpu_seconds += at.elapsed().as_secs_f64() * gpus as f64;
                }
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                seen.lock().unwrap().listed = true;
                changed.send_modify(|n| *n += 1);
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "watching the run's pods");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let now = Instant::now();
        let mut s = seen.lock().unwrap();
        let uid = pod.uid().unwrap_or_default();
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()) {
            let gpus = gpus_of(&pod);
            s.since.entry(uid.clone()).or_insert((now, gpus));
            let pods = s.held.entry(node.clone()).or_default();
            pods.insert(uid.clone(), gpus);
            let over = pods.values().sum::<u64>().saturating_sub(u64::from(duties.gpus_per_node));
            if over > 0 {
                s.overcommit.times += 1;
                s.overcommit.most = s.overcommit.most.max(over);
                tracing::error!(%node, over, "a node holds more GPUs than it has");
            }
        }
        if pod.metadata.deletion_timestamp.is_some() {
            if s.finished.insert(uid.clone()) {
                if let Some(template) = &duties.refill
                    && pod.labels().get(ROLE_LABEL).map(String::as_str) == Some("filler")
                {
                    s.refilled += 1;
                    refill(&api, template, s.refilled, &own);
                }
                own.count("DELETE pods");
                let (api, name) = (api.clone(), pod.name_any());
                tokio::spawn(async move {
                    let now = DeleteParams {
                        grace_period_seconds: Some(0),
                        preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
                        ..DeleteParams::default()
                    };
                    if let Err(e) = api.delete(&name, &now).await {
                        tracing::debug!(pod = %name, error = %e, "finishing a deletion");
                    }
                });
            }
            continue;
        }
        if pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
            continue;
        }
        let name = pod.name_any();
        let newly = match pod.labels().get(ROLE_LABEL).map(String::as_str) {
            Some("filler") => s.fillers.insert(name.clone()),
            _ if s.bound.contains_key(&name) => false,
            _ => s.bound.insert(name.clone(), now).is_none(),
        };
        if newly
            && let Some(lifetime) = duties.lifetime
            && pod.labels().get(ROLE_LABEL).map(String::as_str) == Some("measured")
        {
            let (api, own, seen) = (api.clone(), own.clone(), seen.clone());
            tokio::spawn(async move {
                tokio::time::sleep(lifetime).await;
                let gone = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
                    ..DeleteParams::default()
                };
                own.count("DELETE pods");
                match api.delete(&name, &gone).await {
                    Ok(_) => seen.lock().unwrap().ended += 1,
                    Err(e) => tracing::debug!(pod = %name, error = %e, "ending a pod"),
                }
            });
        }
        drop(s);
        if newly {
            changed.send_modify(|n| *n += 1);
        }
    }
}

/// Creates filler number `n` made from `template` (named after it, `-r{n}` added).
fn refill(api: &Api<Pod>, template: &serde_json::Value, n: usize, own: &OwnRequests) {
    let mut body = template.clone();
    let name = format!("{}-r{n}", body["metadata"]["name"].as_str().unwrap_or("filler"));
    body["metadata"]["name"] = serde_json::json!(name);
    own.count("POST pods");
    let api = api.clone();
    tokio::spawn(async move {
        let pod: Pod = match serde_json::from_value(body) {
            Ok(pod) => pod,
            Err(e) => return tracing::error!(error = %e, "a filler pod does not parse"),
        };
        if let Err(e) = api.create(&kube::api::PostParams::default(), &pod).await {
            tracing::warn!(pod = %name, error = %e, "replacing a preempted filler");
        }
    });
}

/// Whole GPUs a pod asks (its containers' [`GPU_RESOURCE`](crate::objects::GPU_RESOURCE) limits).
fn gpus_of(pod: &Pod) -> u64 {
    let containers = pod.spec.iter().flat_map(|s| &s.containers);
    containers
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(crate::objects::GPU_RESOURCE)?.0.parse::<u64>().ok())
        .sum()
}
