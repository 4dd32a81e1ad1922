//! The loop's inputs: one stream of watch events per kind of object it reads. [`Watches::open`]
//! makes them on the API server (kube-runtime's watcher: a re-list on `410 Gone`, back-off on
//! errors); tests hand in their own — channels, `stream::iter` — with [`Watches::quiet`] for the
//! kinds they leave empty.

use futures_util::stream::{self, BoxStream, SelectAll};
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::api::resource::v1beta2::DeviceTaintRule;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

use super::{SchedulerConfig, backoff};
use crate::crd::{PodGroup, Queue, ResourceFlavor};
use crate::groups::podgroups::{PodGroupApi, discover_upstream};

/// The events of one watch.
pub type Watch<K> = BoxStream<'static, watcher::Result<Event<K>>>;

/// Watches of dynamic objects, each event tagged with its watch's index.
pub type TaggedWatches = SelectAll<BoxStream<'static, (usize, watcher::Result<Event<DynamicObject>>)>>;

/// Every watch the loop reads.
pub struct Watches {
    /// Nodes.
    pub nodes: Watch<KubeNode>,
    /// Pods holding resources or waiting (finished ones are left out).
    pub pods: Watch<Pod>,
    /// Our `PodGroup`s.
    pub groups: Watch<PodGroup>,
    /// `Queue`s.
    pub queues: Watch<Queue>,
    /// `ResourceFlavor`s.
    pub flavors: Watch<ResourceFlavor>,
    /// `PriorityClass`es.
    pub priority_classes: Watch<PriorityClass>,
    /// `PodDisruptionBudget`s.
    pub budgets: Watch<PodDisruptionBudget>,
    /// DRA `ResourceSlice`s.
    pub slices: Watch<ResourceSlice>,
    /// DRA `DeviceClass`es.
    pub device_classes: Watch<DeviceClass>,
    /// DRA `ResourceClaim`s.
    pub claims: Watch<ResourceClaim>,
    /// DRA `DeviceTaintRule`s.
    pub taint_rules: Watch<DeviceTaintRule>,
    /// One watch per kind of the configured owner table, tagged with the kind's index.
    pub owners: TaggedWatches,
    /// Other APIs' `PodGroup`s, tagged with their index in `pod_group_apis`.
    pub pod_groups: TaggedWatches,
    /// The `PodGroup` APIs of `pod_groups`.
    pub pod_group_apis: Vec<PodGroupApi>,
}

impl Watches {
    /// The watches on the API server of `client`; the owner kinds are `config`'s, the upstream
    /// `PodGroup` version the one the cluster serves (found once here).
    pub async fn open(client: &Client, config: &SchedulerConfig) -> Watches {
        // Lists (the first, and after a watch expired) are served from the API server's watch
        // cache (`resourceVersion=0`), as kube-scheduler's informers list: a quorum read of
        // 5,000 pods from etcd, 500 a page, held the first decision back by a second; the watch
        // that follows brings a list that was a moment behind up to date.
        let all = || watcher::Config::default().any_semantic();
        // Finished pods hold nothing; leaving them out of the list is most of a big cluster's pods.
        let pods = all().fields("status.phase!=Succeeded,status.phase!=Failed");
        let tagged = |i: usize, resource: ApiResource| {
            let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
            on_own_task(watch_stream(api, all()).map(move |e| (i, e)))
        };
        let owners = config.owner_kinds.kinds().enumerate().map(|(i, k)| tagged(i, k.api_resource()));
        let mut apis = Vec::new();
        match discover_upstream(client).await {
            Some(version) => {
                tracing::info!(%version, "reading the Workload API's PodGroups (scheduling.k8s.io)");
                apis.push(PodGroupApi::Upstream { version });
            }
            None => tracing::info!(
                "the cluster serves no PodGroups of the Workload API (scheduling.k8s.io v1beta1 or v1alpha2): pods are grouped by their labels and owners"
            ),
        }
        apis.extend([PodGroupApi::Coscheduling, PodGroupApi::Volcano]);
        let pod_groups = apis.iter().enumerate().map(|(i, a)| tagged(i, a.api_resource()));
        Watches {
            nodes: on_own_task(watch_stream(Api::all(client.clone()), all())),
            pods: on_own_task(watch_stream(Api::all(client.clone()), pods)),
            groups: on_own_task(watch_stream(Api::all(client.clone()), all())),
            queues: on_own_task(watch_stream(Api::all(client.clone()), all())),
            flavors: on_own_task(watch_stream(Api::all(client.clone()), all())),
            priority_classes: on_own_task(watch_stream(Api::all(client.clone()), all())),
            budgets: on_own_task(watch_stream(Api::all(client.clone()), all())),
            slices: on_own_task(watch_stream(Api::all(client.clone()), all())),
            device_classes: on_own_task(watch_stream(Api::all(client.clone()), all())),
            claims: on_own_task(watch_stream(Api::all(client.clone()), all())),
            taint_rules: on_own_task(watch_stream(Api::all(client.clone()), all())),
            owners: stream::select_all(owners),
            pod_groups: stream::select_all(pod_groups),
            pod_group_apis: apis,
        }
    }

    /// Watches that list nothing and then stay quiet, one per kind `config` reads (its owner
    /// kinds; the coscheduling plugin's and Volcano's `PodGroup`s): a cluster with none of
    /// anything, for a test to replace the kinds it feeds.
    pub fn quiet(config: &SchedulerConfig) -> Watches {
        let tagged = |i: usize| quiet::<DynamicObject>().map(move |e| (i, e)).boxed();
        let apis = vec![PodGroupApi::Coscheduling, PodGroupApi::Volcano];
        Watches {
            nodes: quiet(),
            pods: quiet(),
            groups: quiet(),
            queues: quiet(),
            flavors: quiet(),
            priority_classes: quiet(),
            budgets: quiet(),
            slices: quiet(),
            device_classes: quiet(),
            claims: quiet(),
            taint_rules: quiet(),
            owners: stream::select_all((0..config.owner_kinds.kinds().count()).map(tagged)),
            pod_groups: stream::select_all((0..apis.len()).map(tagged)),
            pod_group_apis: apis,
        }
    }
}

/// Events this far ahead of the loop at most, per watch: a watch reads on while the loop decides,
/// and waits when it is this far ahead.
const READ_AHEAD: usize = 1024;

/// `stream` read on a task of its own, as kube-scheduler's informers run beside its scheduling
/// loop: the API server's JSON is decoded beside the loop (on another core when there is one),
/// and the loop only applies what arrives. The task ends with the stream, or when the loop drops
/// the other end.
fn on_own_task<T: Send + 'static>(stream: impl Stream<Item = T> + Send + 'static) -> BoxStream<'static, T> {
    let (tx, rx) = tokio::sync::mpsc::channel(READ_AHEAD);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                () = tx.closed() => return,
                item = stream.next() => {
                    let Some(item) = item else { return };
                    if tx.send(item).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) }).boxed()
}

/// A watch that lists nothing, then waits forever.
fn quiet<K: Send + 'static>() -> Watch<K> {
    stream::iter([Ok(Event::Init), Ok(Event::InitDone)]).chain(stream::pending()).boxed()
}

/// A watch stream that re-lists on `410 Gone` (kube-runtime's watcher) and backs off on errors
/// until it makes progress ([`backoff`]), yielding errors so they are logged rather than ending
/// the stream.
fn watch_stream<K>(api: Api<K>, config: watcher::Config) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    backoff::backoff_until_progress(watcher::watcher(api, config))
}
