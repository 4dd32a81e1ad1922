//! The cluster a run needs before its clock starts, and the clean-up after it.

use futures_util::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::objects;
use crate::{Config, Error};

/// Creates `namespace` and its `default` ServiceAccount unless they exist (the account is the
/// controller manager's work, and a benchmark cluster may run none; pods are refused without it).
pub async fn namespace(client: &Client, namespace: &str) -> Result<(), Error> {
    let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
    create_or_keep(&Api::<Namespace>::all(client.clone()), body)
        .await
        .map_err(Error::api(format!("namespace {namespace}")))?;
    let account = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
    create_or_keep(&Api::<ServiceAccount>::namespaced(client.clone(), namespace), account)
        .await
        .map_err(Error::api(format!("the default ServiceAccount of {namespace}")))
}

/// Makes fake nodes `0..count` Ready with `gpus` GPUs each and removes fake nodes beyond them
/// (left from a larger run, they would take pods).
pub async fn nodes(client: &Client, count: usize, gpus: u32, in_flight: usize) -> Result<(), Error> {
    let api = Api::<Node>::all(client.clone());
    let existing = api
        .list_metadata(&ListParams::default().labels(&format!("{}=true", objects::NODE_LABEL)))
        .await
        .map_err(Error::api("listing the fake nodes"))?;
    let wanted: std::collections::HashSet<String> = (0..count).map(objects::node_name).collect();
    for extra in existing.items.iter().map(|n| n.name_any()).filter(|n| !wanted.contains(n)) {
        delete_if_there(&api, &extra).await.map_err(Error::api(format!("deleting fake node {extra}")))?;
    }
    let status = objects::node_status(gpus);
    stream::iter(0..count)
        .map(|i| {
            let (api, status) = (api.clone(), &status);
            async move {
                let name = objects::node_name(i);
                create_or_keep(&api, objects::node(i)).await?;
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await?;
                api.patch(&name, &PatchParams::default(), &Patch::Merge(objects::untainted())).await?;
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(in_flight)
        .try_collect::<()>()
        .await
        .map_err(Error::api("making the fake nodes"))?;
    tracing::info!(count, gpus, "fake nodes ready");
    Ok(())
}

/// What the workload needs before its pods: priority classes for preemption, PodGroups for gangs.
pub async fn workload(client: &Client, config: &Config, shape: &objects::PodShape<'_>) -> Result<(), Error> {
    if config.workload.preempts() {
        let api = Api::<PriorityClass>::all(client.clone());
        for class in objects::priority_classes() {
            create_or_keep(&api, class).await.map_err(Error::api("priority classes"))?;
        }
    }
    let api = pod_groups(client, &config.namespace);
    stream::iter(config.workload.gangs(config.pods))
        .map(|(g, size)| {
            let api = api.clone();
            async move { create_or_keep(&api, shape.group(g, size)).await }
        })
        .buffer_unordered(config.create_in_flight)
        .try_collect::<()>()
        .await
        .map_err(Error::api("wasmsched PodGroups (is the chart's CRD installed?)"))
}

/// Filler pods that take every GPU of the cluster.
pub fn fillers_to_fill(config: &Config) -> usize {
    config.nodes * (config.gpus_per_node / config.gpus_per_pod.max(1)) as usize
}

/// Deletes the run's pods (at once: no kubelet will finish them) and PodGroups, and the fake
/// nodes when asked.
pub async fn clean_up(client: &Client, config: &Config, run: &str) -> Result<(), kube::Error> {
    let by_run = ListParams::default().labels(&format!("{}={run}", objects::RUN_LABEL));
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    Api::<Pod>::namespaced(client.clone(), &config.namespace).delete_collection(&now, &by_run).await?;
    if config.workload.has_gangs() {
        pod_groups(client, &config.namespace).delete_collection(&DeleteParams::default(), &by_run).await?;
    }
    if config.delete_nodes {
        let fake = ListParams::default().labels(&format!("{}=true", objects::NODE_LABEL));
        Api::<Node>::all(client.clone()).delete_collection(&DeleteParams::default(), &fake).await?;
    }
    Ok(())
}

fn pod_groups(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("scheduling.wasmsched.io", "v1alpha1", "PodGroup");
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk))
}

/// Creates `body`; one that already exists is kept as it is.
async fn create_or_keep<K>(api: &Api<K>, body: Value) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn delete_if_there<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}
