//! The cluster a run needs before its clock starts, and the clean-up after it.

use futures_util::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
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
    let slices = Api::<ResourceSlice>::all(client.clone());
    if let Ok(existing) =
        slices.list_metadata(&ListParams::default().labels(&format!("{}=true", objects::NODE_LABEL))).await
    {
        let wanted: std::collections::HashSet<String> = (0..count)
            .map(|i| objects::resource_slice(i, 0)["metadata"]["name"].as_str().unwrap_or_default().to_string())
            .collect();
        for extra in existing.items.iter().map(|s| s.name_any()).filter(|n| !wanted.contains(n)) {
            delete_if_there(&slices, &extra).await.map_err(Error::api(format!("deleting ResourceSlice {extra}")))?;
        }
    }
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

/// What the workload needs before its pods: priority classes for preemption, PodGroups for gangs,
/// for DRA the DeviceClass, every node's ResourceSlice and every pod's claim.
pub async fn workload(client: &Client, config: &Config, shape: &objects::PodShape<'_>) -> Result<(), Error> {
    if config.workload.has_dra() {
        dra(client, config, shape).await?;
    }
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

async fn dra(client: &Client, config: &Config, shape: &objects::PodShape<'_>) -> Result<(), Error> {
    let refused = || Error::api("DRA objects (is resource.k8s.io/v1 served?)");
    create_or_keep(&Api::<DeviceClass>::all(client.clone()), objects::device_class()).await.map_err(refused())?;
    let slices = Api::<ResourceSlice>::all(client.clone());
    stream::iter(0..config.nodes)
        .map(|i| {
            let slices = slices.clone();
            async move { create_or_keep(&slices, objects::resource_slice(i, config.gpus_per_node)).await }
        })
        .buffer_unordered(config.create_in_flight)
        .try_collect::<()>()
        .await
        .map_err(refused())?;
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &config.namespace);
    stream::iter((0..config.pods).filter(|&i| config.workload.member(i).workload == objects::Workload::Dra))
        .map(|i| {
            let claims = claims.clone();
            async move { create_or_keep(&claims, shape.claim(i)).await }
        })
        .buffer_unordered(config.create_in_flight)
        .try_collect::<()>()
        .await
        .map_err(refused())
}

/// Devices in two allocated claims of run `run` at once (0: none). No kubelet or controller
/// releases a claim here, so every allocation made during the run is still there to check.
pub async fn devices_allocated_twice(client: &Client, config: &Config, run: &str) -> Result<usize, Error> {
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &config.namespace)
        .list(&ListParams::default().labels(&format!("{}={run}", objects::RUN_LABEL)))
        .await
        .map_err(Error::api("listing the run's ResourceClaims"))?;
    let mut seen = std::collections::HashSet::new();
    let results = claims
        .items
        .iter()
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref())
        .flat_map(|d| d.results.iter().flatten());
    Ok(results.filter(|r| !seen.insert((r.driver.clone(), r.pool.clone(), r.device.clone()))).count())
}

/// Filler pods that take every GPU of the cluster.
pub fn fillers_to_fill(config: &Config) -> usize {
    config.nodes * (config.gpus_per_node / config.gpus_per_pod.max(1)) as usize
}

/// Deletes the run's pods (at once: no kubelet will finish them), PodGroups and ResourceClaims
/// (their allocations released), and the fake nodes when asked.
pub async fn clean_up(client: &Client, config: &Config, run: &str) -> Result<(), kube::Error> {
    let by_run = ListParams::default().labels(&format!("{}={run}", objects::RUN_LABEL));
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    Api::<Pod>::namespaced(client.clone(), &config.namespace).delete_collection(&now, &by_run).await?;
    if config.workload.has_gangs() {
        pod_groups(client, &config.namespace).delete_collection(&DeleteParams::default(), &by_run).await?;
    }
    if config.workload.has_dra() {
        let claims = Api::<ResourceClaim>::namespaced(client.clone(), &config.namespace);
        claims.delete_collection(&DeleteParams::default(), &by_run).await?;
        // A scheduler that allocated a claim protected it with a finalizer, which the controller
        // manager's claim controller removes once no pod uses it; a benchmark cluster may run
        // none, and the devices would stay allocated for the next run. Done in its place.
        let held: Vec<String> = claims
            .list(&by_run)
            .await?
            .items
            .iter()
            .filter(|c| !c.finalizers().is_empty())
            .map(|c| c.name_any())
            .collect();
        let unprotect = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
        stream::iter(held)
            .map(|name| {
                let (claims, unprotect) = (claims.clone(), &unprotect);
                async move {
                    match claims.patch(&name, &PatchParams::default(), unprotect).await {
                        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                        other => other.map(drop),
                    }
                }
            })
            .buffer_unordered(config.create_in_flight)
            .try_collect::<()>()
            .await?;
    }
    if config.delete_nodes {
        let fake = ListParams::default().labels(&format!("{}=true", objects::NODE_LABEL));
        Api::<Node>::all(client.clone()).delete_collection(&DeleteParams::default(), &fake).await?;
        Api::<ResourceSlice>::all(client.clone()).delete_collection(&DeleteParams::default(), &fake).await?;
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
