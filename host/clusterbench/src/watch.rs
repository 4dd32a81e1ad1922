//! The run's one watch on its pods: when each was first seen bound (client clock), and the
//! kubelet's part for pods that have none — a pod being deleted (a preemption's victim) is removed
//! at once, as a kubelet would once its containers stopped, so a preemptor is not left waiting
//! for a node that will never report back.

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
}

/// The running watch.
pub struct Watch {
    seen: Arc<Mutex<Seen>>,
    changed: signal::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// Watches the pods of run `run` in `namespace`.
    pub fn start(client: Client, namespace: &str, run: &str, own: OwnRequests) -> Watch {
        let api = Api::<Pod>::namespaced(client, namespace);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, changed) = signal::channel(0u64);
        let config = watcher::Config::default().labels(&format!("{RUN_LABEL}={run}"));
        let stream = watcher(api.clone(), config);
        let task = tokio::spawn(follow(stream, api, seen.clone(), tx, own));
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

    /// Waits until `count` measured pods have been bound or `deadline`; returns when each bound
    /// pod was first seen bound, by name.
    pub async fn wait_measured(&self, count: usize, deadline: Instant) -> HashMap<String, Instant> {
        self.wait_until(|s| s.bound.len() >= count, Some(deadline)).await;
        self.seen.lock().unwrap().bound.clone()
    }

    /// Deletions this finished so far.
    pub fn finished_terminations(&self) -> usize {
        self.seen.lock().unwrap().finished.len()
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
) {
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
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
        if pod.metadata.deletion_timestamp.is_some() {
            if s.finished.insert(uid.clone()) {
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
            Some("filler") => s.fillers.insert(name),
            _ if s.bound.contains_key(&name) => false,
            _ => s.bound.insert(name, now).is_none(),
        };
        drop(s);
        if newly {
            changed.send_modify(|n| *n += 1);
        }
    }
}
