//! Workloads as users submit them, at the HTTP boundary (the fake API server of
//! `support/fake_api.rs`, a MOCK): the objects each controller creates — the Job controller's
//! Workload, PodGroup and pods (Kubernetes 1.36, `WorkloadWithJob`), JobSet's Jobs, the training
//! operator's, KubeRay's and LeaderWorkerSet's pods, the coscheduling plugin's and Volcano's
//! PodGroups — with their owner references, labels and annotations as those controllers write
//! them. Each is gang-scheduled all or nothing, including when members arrive late, one is deleted
//! mid-run, or the owner is scaled.

use std::time::Duration;

use serde_json::{Value, json};

use crate::boundary::{NAME, eventually, node_of, start};
use crate::support::{
    self,
    fake_api::{FakeApi, Kind, gpu_node, pod},
};

fn owner_ref(api_version: &str, kind: &str, name: &str, uid: &str, controller: bool) -> Value {
    let mut r = json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid});
    if controller {
        r["controller"] = json!(true);
        r["blockOwnerDeletion"] = json!(true);
    }
    r
}

/// A pod `name` of `gpus` GPUs with `owners`, `labels` and `annotations` (merged into the base).
fn member(name: &str, gpus: u32, owners: Vec<Value>, labels: Value, annotations: Value) -> Value {
    let mut p = pod("ml", name, NAME, gpus, "4", "32Gi");
    p["metadata"]["ownerReferences"] = json!(owners);
    let base = p["metadata"]["labels"].as_object().cloned().unwrap_or_default();
    let mut all = base;
    all.extend(labels.as_object().cloned().unwrap_or_default());
    p["metadata"]["labels"] = json!(all);
    p["metadata"]["annotations"] = annotations;
    p
}

/// The pods of an Indexed Job `job` (uid `uid`) as the Job controller creates them, indexes
/// `indexes`, each naming `pod_group` (Workload API) when given.
pub(crate) fn job_pods(
    job: &str,
    uid: &str,
    indexes: std::ops::Range<u32>,
    gpus: u32,
    pod_group: Option<&str>,
) -> Vec<Value> {
    indexes
        .map(|i| {
            let mut owners = vec![owner_ref("batch/v1", "Job", job, uid, true)];
            if let Some(pg) = pod_group {
                owners.push(owner_ref("scheduling.k8s.io/v1alpha2", "PodGroup", pg, &format!("{pg}-uid"), false));
            }
            let labels = json!({"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": job,
                "controller-uid": uid, "job-name": job, "batch.kubernetes.io/job-completion-index": i.to_string()});
            let annotations = json!({"batch.kubernetes.io/job-completion-index": i.to_string()});
            let mut p = member(&format!("{job}-{i}-x{i}k"), gpus, owners, labels, annotations);
            p["metadata"]["generateName"] = json!(format!("{job}-{i}-"));
            p["metadata"]["finalizers"] = json!(["batch.kubernetes.io/job-tracking"]);
            p["spec"]["hostname"] = json!(format!("{job}-{i}"));
            p["spec"]["subdomain"] = json!(job);
            if let Some(pg) = pod_group {
                p["spec"]["schedulingGroup"] = json!({"podGroupName": pg});
            }
            p
        })
        .collect()
}

pub(crate) fn indexed_job(name: &str, uid: &str, parallelism: u32) -> Value {
    json!({"metadata": {"name": name, "namespace": "ml", "uid": uid},
           "spec": {"parallelism": parallelism, "completions": parallelism, "completionMode": "Indexed",
                    "backoffLimit": 6, "template": {"spec": {"schedulerName": NAME, "containers": []}}}})
}

/// The Workload and PodGroup the 1.36 Job controller creates for an Indexed Job.
fn workload_objects(api: &FakeApi, job: &str, uid: &str, parallelism: u32) -> String {
    let workload = format!("{job}-2471916045");
    let template = format!("{job}-pgt-0");
    let pod_group = format!("{workload}-{template}-1877336721");
    api.put(Kind::Workload, json!({"apiVersion": "scheduling.k8s.io/v1alpha2",
        "metadata": {"name": workload, "namespace": "ml", "ownerReferences": [owner_ref("batch/v1", "Job", job, uid, true)]},
        "spec": {"controllerRef": {"apiGroup": "batch", "kind": "Job", "name": job},
                 "podGroupTemplates": [{"name": template, "schedulingPolicy": {"gang": {"minCount": parallelism}}}]}}));
    api.put(Kind::UpstreamPodGroup, json!({"apiVersion": "scheduling.k8s.io/v1alpha2",
        "metadata": {"name": pod_group, "namespace": "ml", "uid": format!("{pod_group}-uid"),
                     "ownerReferences": [owner_ref("batch/v1", "Job", job, uid, true),
                                         owner_ref("scheduling.k8s.io/v1alpha2", "Workload", &workload, "wl-uid", false)]},
        "spec": {"podGroupTemplateRef": {"workload": {"workloadName": workload, "podGroupTemplateName": template}},
                 "schedulingPolicy": {"gang": {"minCount": parallelism}}}}));
    pod_group
}

pub(crate) fn names(pods: &[Value]) -> Vec<String> {
    pods.iter().map(|p| format!("ml/{}", p["metadata"]["name"].as_str().unwrap())).collect()
}

pub(crate) fn bound(api: &FakeApi, ids: &[String]) -> usize {
    ids.iter().filter(|id| node_of(api, id).is_some()).count()
}

fn waiting_message(api: &FakeApi, id: &str) -> Option<String> {
    let p = api.get(Kind::Pod, id)?;
    p["status"]["conditions"].as_array()?.iter().find_map(|c| {
        (c["type"] == "PodScheduled" && c["status"] == "False").then(|| c["message"].as_str().unwrap_or("").to_string())
    })
}

fn condition(api: &FakeApi, kind: Kind, key: &str, type_: &str) -> Option<Value> {
    let g = api.get(kind, key)?;
    g["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_).cloned()
}

/// Stays true for `d`: nothing of `ids` is bound meanwhile.
async fn none_bound_for(api: &FakeApi, ids: &[String], d: Duration, why: &str) {
    let until = std::time::Instant::now() + d;
    while std::time::Instant::now() < until {
        assert_eq!(bound(api, ids), 0, "{why}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexed_job_with_a_workload_is_one_gang_all_or_nothing_and_its_pod_group_says_so() {
    let api = FakeApi::new();
    api.state().upstream_version = Some("v1alpha2");
    for n in 0..6 {
        api.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
    }
    // Job a: 4 members of 8 GPUs; three exist at first.
    api.put(Kind::Job, indexed_job("a", "job-a", 4));
    let group_a = workload_objects(&api, "a", "job-a", 4);
    let a = job_pods("a", "job-a", 0..4, 8, Some(&group_a));
    for p in &a[..3] {
        api.put(Kind::Pod, p.clone());
    }
    let run = start(&api, "a", None);
    let ids_a = names(&a);
    eventually("the members that exist told why they wait", Duration::from_secs(20), || {
        waiting_message(&api, &ids_a[0]).is_some_and(|m| m.contains("waiting for its 4 members"))
    })
    .await;
    none_bound_for(&api, &ids_a[..3], Duration::from_millis(1500), "three of four members are not a gang").await;
    api.put(Kind::Pod, a[3].clone());
    eventually("job a bound whole", Duration::from_secs(20), || bound(&api, &ids_a) == 4).await;
    let key_a = format!("ml/{group_a}");
    eventually("PodGroupScheduled=True on a's PodGroup", Duration::from_secs(20), || {
        condition(&api, Kind::UpstreamPodGroup, &key_a, "PodGroupScheduled")
            .is_some_and(|c| c["status"] == "True" && c["reason"] == "Scheduled" && c["observedGeneration"].is_null())
    })
    .await;

    // Job b: 4 × 8 GPUs with room for 2: none bound, its PodGroup says why.
    api.put(Kind::Job, indexed_job("b", "job-b", 4));
    let group_b = workload_objects(&api, "b", "job-b", 4);
    let b = job_pods("b", "job-b", 0..4, 8, Some(&group_b));
    for p in &b {
        api.put(Kind::Pod, p.clone());
    }
    let ids_b = names(&b);
    let key_b = format!("ml/{group_b}");
    eventually("PodGroupScheduled=False on b's PodGroup", Duration::from_secs(20), || {
        condition(&api, Kind::UpstreamPodGroup, &key_b, "PodGroupScheduled").is_some_and(|c| {
            c["status"] == "False" && c["reason"] == "Unschedulable" && !c["message"].as_str().unwrap_or("").is_empty()
        })
    })
    .await;
    none_bound_for(&api, &ids_b, Duration::from_millis(1000), "half a gang never holds GPUs").await;
    // A condition once True stays True: a's members finishing does not regress it.
    let c = condition(&api, Kind::UpstreamPodGroup, &key_a, "PodGroupScheduled").unwrap();
    assert_eq!(c["status"], "True");
    support::assert_rbac_allows(&api, "rbac.yaml", &|n| !n.contains("leader") && !n.ends_with("-agent"));
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_v1beta1_workload_api_gangs_and_a_basic_pod_group_places_pods_independently() {
    let api = FakeApi::new();
    api.state().upstream_version = Some("v1beta1");
    for n in 0..3 {
        api.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
    }
    // As a 1.37 controller writes it: workloadRef, and the gang's condition is PodGroupInitiallyScheduled.
    let pg = |name: &str, policy: Value| {
        json!({"apiVersion": "scheduling.k8s.io/v1beta1",
               "metadata": {"name": name, "namespace": "ml"},
               "spec": {"workloadRef": {"workloadName": "w", "templateName": name}, "schedulingPolicy": policy}})
    };
    api.put(Kind::UpstreamPodGroup, pg("gang", json!({"gang": {"minCount": 2}})));
    api.put(Kind::UpstreamPodGroup, pg("loose", json!({"basic": {}})));
    let with_group = |name: &str, group: &str, gpus: u32| {
        let mut p = pod("ml", name, NAME, gpus, "4", "32Gi");
        p["spec"]["schedulingGroup"] = json!({"podGroupName": group});
        p
    };
    // Basic: 4 pods of 8 GPUs, room for 2 after the gang: 2 run now, independently.
    api.put(Kind::Pod, with_group("g-0", "gang", 4));
    api.put(Kind::Pod, with_group("g-1", "gang", 4));
    let run = start(&api, "a", None);
    let gang = ["ml/g-0".to_string(), "ml/g-1".to_string()];
    eventually("the gang bound", Duration::from_secs(20), || bound(&api, &gang) == 2).await;
    let loose: Vec<String> = (0..4).map(|i| format!("loose-{i}")).collect();
    for name in &loose {
        api.put(Kind::Pod, with_group(name, "loose", 8));
    }
    let loose_ids: Vec<String> = loose.iter().map(|n| format!("ml/{n}")).collect();
    eventually("two basic pods bound on their own", Duration::from_secs(20), || bound(&api, &loose_ids) == 2).await;
    eventually("PodGroupInitiallyScheduled=True", Duration::from_secs(20), || {
        condition(&api, Kind::UpstreamPodGroup, "ml/gang", "PodGroupInitiallyScheduled")
            .is_some_and(|c| c["status"] == "True" && c["observedGeneration"] == 1)
    })
    .await;
    assert!(
        condition(&api, Kind::UpstreamPodGroup, "ml/loose", "PodGroupInitiallyScheduled").is_none(),
        "basic groups get no gang condition"
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_gangs_by_its_owner_waits_for_its_owner_and_a_work_queue_job_does_not() {
    let api = FakeApi::new();
    for n in 0..2 {
        api.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
    }
    // No Workload API: the Indexed Job's pods exist before the scheduler has seen the Job.
    let a = job_pods("a", "job-a", 0..3, 8, None);
    for p in &a {
        api.put(Kind::Pod, p.clone());
    }
    // A work-queue Job (completions ≫ parallelism) of 8-GPU pods: each runs as room allows.
    let mut queue_job = indexed_job("q", "job-q", 2);
    queue_job["spec"]["completions"] = json!(100);
    api.put(Kind::Job, queue_job);
    let q = job_pods("q", "job-q", 0..2, 8, None);
    let run = start(&api, "a", None);
    let ids_a = names(&a);
    eventually("a's members wait for their owner", Duration::from_secs(20), || {
        waiting_message(&api, &ids_a[0]).is_some_and(|m| m.contains("owner Job a"))
    })
    .await;
    none_bound_for(&api, &ids_a, Duration::from_millis(500), "an unseen owner's pods do not run alone").await;
    api.put(Kind::Job, indexed_job("a", "job-a", 3));
    eventually("a told it waits as a gang", Duration::from_secs(20), || {
        waiting_message(&api, &ids_a[0]).is_some_and(|m| !m.contains("owner Job a"))
    })
    .await;
    none_bound_for(&api, &ids_a, Duration::from_millis(1000), "room for 2 of a gang of 3").await;
    for n in 2..4 {
        api.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
    }
    eventually("a bound whole", Duration::from_secs(20), || bound(&api, &ids_a) == 3).await;
    for p in &q {
        api.put(Kind::Pod, p.clone());
    }
    let ids_q = names(&q);
    eventually("one work-queue pod runs in the room left", Duration::from_secs(20), || bound(&api, &ids_q) == 1).await;
    run.stop().await;
}

fn jobset_objects(api: &FakeApi, name: &str, workers: u32, per_job: u32, attempt: u32) -> Vec<Value> {
    let uid = format!("{name}-uid");
    api.put(
        Kind::JobSet,
        json!({"metadata": {"name": name, "namespace": "ml", "uid": uid,
            "labels": {"kueue.x-k8s.io/queue-name": "research"}},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": workers,
            "template": {"spec": {"parallelism": per_job, "completions": per_job, "completionMode": "Indexed",
                                  "template": {"spec": {"schedulerName": NAME, "containers": []}}}}}],
                 "failurePolicy": {"maxRestarts": 3}}}),
    );
    let mut pods = Vec::new();
    for j in 0..workers {
        let job = format!("{name}-workers-{j}");
        let job_uid = format!("{job}-uid-{attempt}");
        let common = json!({"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": "workers",
            "jobset.sigs.k8s.io/job-index": j.to_string(), "jobset.sigs.k8s.io/restart-attempt": attempt.to_string(),
            "jobset.sigs.k8s.io/replicatedjob-replicas": workers.to_string()});
        let mut job_obj = indexed_job(&job, &job_uid, per_job);
        job_obj["metadata"]["labels"] = common.clone();
        job_obj["metadata"]["ownerReferences"] =
            json!([owner_ref("jobset.x-k8s.io/v1alpha2", "JobSet", name, &uid, true)]);
        api.put(Kind::Job, job_obj);
        for mut p in job_pods(&job, &job_uid, 0..per_job, 8, None) {
            let mut labels = p["metadata"]["labels"].as_object().cloned().unwrap();
            labels.extend(common.as_object().cloned().unwrap());
            p["metadata"]["labels"] = json!(labels);
            p["metadata"]["name"] = json!(format!("{}-a{attempt}", p["metadata"]["name"].as_str().unwrap()));
            pods.push(p);
        }
    }
    pods
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobset_is_one_gang_across_its_jobs_and_a_restart_is_a_new_gang() {
    let api = FakeApi::new();
    for n in 0..3 {
        api.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
    }
    api.put(Kind::Queue, json!({"metadata": {"name": "research"}, "spec": {}}));
    // 2 Jobs × 2 pods of 8 GPUs, room for 3: nothing runs until a fourth node comes.
    let pods = jobset_objects(&api, "js", 2, 2, 0);
    for p in &pods {
        api.put(Kind::Pod, p.clone());
    }
    let run = start(&api, "a", None);
    let ids = names(&pods);
    eventually("the JobSet's pods say they wait", Duration::from_secs(20), || waiting_message(&api, &ids[0]).is_some())
        .await;
    none_bound_for(&api, &ids, Duration::from_millis(1000), "three of four members are not placed").await;
    api.put(Kind::Node, gpu_node("gpu-3", 8, &[]));
    eventually("the JobSet bound whole", Duration::from_secs(20), || bound(&api, &ids) == 4).await;
    // In its Kueue-named queue.
    eventually("counted in queue research", Duration::from_secs(20), || {
        api.get(Kind::Queue, "research").is_some_and(|q| q["status"]["running"] == 4)
    })
    .await;
    // A failure restarts the JobSet: every Job is deleted and made again (attempt 1). The new pods
    // are a new gang of their own, not late members of the old one.
    for id in &ids {
        api.remove(Kind::Pod, id);
    }
    let again = jobset_objects(&api, "js", 2, 2, 1);
    for p in &again {
        api.put(Kind::Pod, p.clone());
    }
    let ids = names(&again);
    eventually("the restarted JobSet bound whole", Duration::from_secs(20), || bound(&api, &ids) == 4).await;
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pytorch_job_waits_for_every_replica_and_a_replaced_worker_rejoins_its_running_gang() {
    let api = FakeApi::new();
    for n in 0..5 {
        api.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
    }
    api.put(
        Kind::PyTorchJob,
        json!({"metadata": {"name": "pt", "namespace": "ml", "uid": "pt-uid"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": {}},
                                         "Worker": {"replicas": 3, "restartPolicy": "OnFailure", "template": {}}},
                 "runPolicy": {"cleanPodPolicy": "None"}}}),
    );
    let replica = |kind: &str, index: u32, uid: &str| {
        let labels = json!({"training.kubeflow.org/job-name": "pt", "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": kind.to_lowercase(), "training.kubeflow.org/replica-index": index.to_string()});
        let mut p = member(
            &format!("pt-{}-{index}", kind.to_lowercase()),
            8,
            vec![owner_ref("kubeflow.org/v1", "PyTorchJob", "pt", "pt-uid", true)],
            labels,
            json!({}),
        );
        p["metadata"]["uid"] = json!(uid);
        p
    };
    let mut pods = vec![replica("Master", 0, "m0")];
    pods.extend((0..3).map(|i| replica("Worker", i, &format!("w{i}"))));
    for p in &pods[..3] {
        api.put(Kind::Pod, p.clone());
    }
    let run = start(&api, "a", None);
    let ids = names(&pods);
    none_bound_for(&api, &ids, Duration::from_millis(1500), "3 of 4 replicas do not start").await;
    api.put(Kind::Pod, pods[3].clone());
    eventually("all 4 replicas bound", Duration::from_secs(20), || bound(&api, &ids) == 4).await;
    // Worker 1 fails and is deleted; the operator creates it again (same name, new UID): it joins
    // the running gang alone, while the other three keep running where they are.
    let before: Vec<Option<String>> = ids.iter().map(|id| node_of(&api, id)).collect();
    api.remove(Kind::Pod, "ml/pt-worker-1");
    api.put(Kind::Pod, replica("Worker", 1, "w1-again"));
    eventually("the replacement bound", Duration::from_secs(20), || node_of(&api, "ml/pt-worker-1").is_some()).await;
    for (i, id) in ids.iter().enumerate().filter(|(_, id)| id.as_str() != "ml/pt-worker-1") {
        assert_eq!(node_of(&api, id), before[i], "{id} kept running where it was");
    }
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_scaled_while_its_gang_waits_is_submitted_again_at_its_new_size() {
    let api = FakeApi::new();
    for n in 0..2 {
        api.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
    }
    let job = |min: u32| {
        json!({"metadata": {"name": "el", "namespace": "ml", "uid": "el-uid"},
               "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 4, "template": {}}},
                        "runPolicy": {"schedulingPolicy": {"minAvailable": min}}}})
    };
    api.put(Kind::PyTorchJob, job(4));
    let pods: Vec<Value> = (0..4)
        .map(|i| {
            member(
                &format!("el-worker-{i}"),
                8,
                vec![owner_ref("kubeflow.org/v1", "PyTorchJob", "el", "el-uid", true)],
                json!({"training.kubeflow.org/job-name": "el", "training.kubeflow.org/replica-type": "worker",
                       "training.kubeflow.org/replica-index": i.to_string()}),
                json!({}),
            )
        })
        .collect();
    for p in &pods {
        api.put(Kind::Pod, p.clone());
    }
    let run = start(&api, "a", None);
    let ids = names(&pods);
    eventually("the gang of 4 waits, tried", Duration::from_secs(20), || waiting_message(&api, &ids[0]).is_some())
        .await;
    none_bound_for(&api, &ids, Duration::from_millis(800), "4 of 8 GPUs each with room for 2").await;
    // Elastic: the job now starts with 2.
    api.put(Kind::PyTorchJob, job(2));
    eventually("2 members run", Duration::from_secs(20), || bound(&api, &ids) == 2).await;
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ray_clusters_and_leader_worker_sets_gang_by_owner_and_an_uninstalled_kind_runs_pods_alone() {
    let api = FakeApi::new();
    for n in 0..4 {
        api.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
    }
    // KubeRay: head + a worker group of minReplicas 2 (replicas 3): gang of 3, the 4th grows in.
    api.put(
        Kind::RayCluster,
        json!({"metadata": {"name": "rc", "namespace": "ml", "uid": "rc-uid"},
        "spec": {"headGroupSpec": {"template": {}}, "workerGroupSpecs": [
            {"groupName": "gpu", "replicas": 3, "minReplicas": 2, "maxReplicas": 6, "template": {}}]}}),
    );
    let ray = |name: &str, node_type: &str| {
        member(
            name,
            8,
            vec![owner_ref("ray.io/v1", "RayCluster", "rc", "rc-uid", true)],
            json!({"ray.io/cluster": "rc", "ray.io/node-type": node_type, "ray.io/group": if node_type == "head" { "headgroup" } else { "gpu" },
                   "ray.io/is-ray-node": "yes"}),
            json!({}),
        )
    };
    let head = ray("rc-head-x7k2p", "head");
    let workers: Vec<Value> = (0..3).map(|i| ray(&format!("rc-gpu-worker-{i}"), "worker")).collect();
    api.put(Kind::Pod, head.clone());
    api.put(Kind::Pod, workers[0].clone());
    let run = start(&api, "a", None);
    let ids_rc = names(&[vec![head], workers.clone()].concat());
    none_bound_for(&api, &ids_rc[..2], Duration::from_millis(1200), "head + 1 of min 3").await;
    for w in &workers[1..] {
        api.put(Kind::Pod, w.clone());
    }
    eventually("the Ray cluster's 4 pods bound (min 3, one grown)", Duration::from_secs(20), || {
        bound(&api, &ids_rc) == 4
    })
    .await;

    // LeaderWorkerSet: not installed in this cluster (its list is 404): its pods run alone.
    api.state().unserved.insert(Kind::LeaderWorkerSet);
    run.stop().await;
    let api2 = FakeApi::new();
    api2.state().unserved.insert(Kind::LeaderWorkerSet);
    api2.put(Kind::Node, gpu_node("gpu-0", 8, &[]));
    let lws_pod = |name: &str, group: u32| {
        member(
            name,
            8,
            vec![owner_ref("apps/v1", "StatefulSet", &format!("llm-{group}"), "sts", true)],
            json!({"leaderworkerset.sigs.k8s.io/name": "llm", "leaderworkerset.sigs.k8s.io/group-index": group.to_string(),
                   "leaderworkerset.sigs.k8s.io/worker-index": "1"}),
            json!({"leaderworkerset.sigs.k8s.io/size": "2"}),
        )
    };
    api2.put(Kind::Pod, lws_pod("llm-0-1", 0));
    let run2 = start(&api2, "a", None);
    eventually("an uninstalled owner kind's pod runs alone", Duration::from_secs(20), || {
        node_of(&api2, "ml/llm-0-1").is_some()
    })
    .await;
    run2.stop().await;

    // Installed: one gang per group, owner found by label (a worker's controller is a
    // StatefulSet of the leader pod). Room for 3 pods: group 0 runs whole, group 1 not half.
    let api3 = FakeApi::new();
    for n in 0..3 {
        api3.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
    }
    api3.put(
        Kind::LeaderWorkerSet,
        json!({"metadata": {"name": "llm", "namespace": "ml", "uid": "lws-uid"},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 2, "workerTemplate": {}}}}),
    );
    let lws: Vec<Value> = vec![
        member(
            "llm-0",
            8,
            vec![owner_ref("apps/v1", "StatefulSet", "llm", "sts-l", true)],
            json!({"leaderworkerset.sigs.k8s.io/name": "llm", "leaderworkerset.sigs.k8s.io/group-index": "0", "leaderworkerset.sigs.k8s.io/worker-index": "0"}),
            json!({}),
        ),
        lws_pod("llm-0-1", 0),
        member(
            "llm-1",
            8,
            vec![owner_ref("apps/v1", "StatefulSet", "llm", "sts-l", true)],
            json!({"leaderworkerset.sigs.k8s.io/name": "llm", "leaderworkerset.sigs.k8s.io/group-index": "1", "leaderworkerset.sigs.k8s.io/worker-index": "0"}),
            json!({}),
        ),
        lws_pod("llm-1-1", 1),
    ];
    for p in &lws {
        api3.put(Kind::Pod, p.clone());
    }
    let run3 = start(&api3, "a", None);
    let ids = names(&lws);
    eventually("one LWS group bound whole", Duration::from_secs(20), || bound(&api3, &ids) == 2).await;
    none_bound_for(
        &api3,
        &ids[2..].iter().filter(|id| node_of(&api3, id).is_none()).cloned().collect::<Vec<_>>(),
        Duration::from_millis(500),
        "",
    )
    .await;
    let groups_bound: Vec<bool> = [&ids[..2], &ids[2..]].iter().map(|g| bound(&api3, g) == 2).collect();
    assert!(
        groups_bound.contains(&true) && bound(&api3, &ids) == 2,
        "a whole group runs, never half of each: {groups_bound:?}"
    );
    run3.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coscheduling_and_volcano_pod_groups_work_unchanged() {
    let api = FakeApi::new();
    for n in 0..3 {
        api.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
    }
    // As the training operator writes them for scheduler-plugins (coscheduling) and for Volcano.
    api.put(
        Kind::CoschedulingPodGroup,
        json!({"metadata": {"name": "cs", "namespace": "ml"},
        "spec": {"minMember": 2, "scheduleTimeoutSeconds": 60, "minResources": {"nvidia.com/gpu": "16"}}}),
    );
    api.put(
        Kind::VolcanoPodGroup,
        json!({"metadata": {"name": "vc", "namespace": "ml"},
        "spec": {"minMember": 3, "queue": "default", "minTaskMember": {"worker": 3}}}),
    );
    let cs: Vec<Value> = (0..2)
        .map(|i| member(&format!("cs-{i}"), 8, vec![], json!({"scheduling.x-k8s.io/pod-group": "cs"}), json!({})))
        .collect();
    let vc: Vec<Value> = (0..2)
        .map(|i| member(&format!("vc-{i}"), 2, vec![], json!({}), json!({"scheduling.k8s.io/group-name": "vc"})))
        .collect();
    for p in cs.iter().chain(&vc) {
        api.put(Kind::Pod, p.clone());
    }
    let run = start(&api, "a", None);
    let (ids_cs, ids_vc) = (names(&cs), names(&vc));
    eventually("the coscheduling group bound", Duration::from_secs(20), || bound(&api, &ids_cs) == 2).await;
    eventually("the Volcano group waits for its third", Duration::from_secs(20), || {
        waiting_message(&api, &ids_vc[0]).is_some_and(|m| m.contains("waiting for its 3 members"))
    })
    .await;
    none_bound_for(&api, &ids_vc, Duration::from_millis(500), "2 of min 3").await;
    let third = member("vc-2", 2, vec![], json!({}), json!({"scheduling.k8s.io/group-name": "vc"}));
    api.put(Kind::Pod, third);
    let all_vc = [ids_vc, vec!["ml/vc-2".to_string()]].concat();
    eventually("the Volcano group bound", Duration::from_secs(20), || bound(&api, &all_vc) == 3).await;
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elastic_indexed_job_scaled_while_running_grows_and_shrinks_its_gang() {
    let api = FakeApi::new();
    for n in 0..4 {
        api.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
    }
    api.put(Kind::Job, indexed_job("e", "job-e", 2));
    let pods = job_pods("e", "job-e", 0..3, 8, None);
    for p in &pods[..2] {
        api.put(Kind::Pod, p.clone());
    }
    let run = start(&api, "a", None);
    let ids = names(&pods);
    eventually("e's 2 bound", Duration::from_secs(20), || bound(&api, &ids[..2]) == 2).await;
    let before: Vec<Option<String>> = ids[..2].iter().map(|id| node_of(&api, id)).collect();
    // Scaled up (parallelism and completions together, as elastic Indexed Jobs allow): the Job
    // controller adds index 2, which joins the running gang.
    api.put(Kind::Job, indexed_job("e", "job-e", 3));
    api.put(Kind::Pod, pods[2].clone());
    eventually("the new member bound", Duration::from_secs(20), || node_of(&api, &ids[2]).is_some()).await;
    assert_eq!(ids[..2].iter().map(|id| node_of(&api, id)).collect::<Vec<_>>(), before, "the others stay put");
    // Scaled down to 1: indexes 1 and 2 are deleted; index 0 runs on, and their room is free.
    api.put(Kind::Job, indexed_job("e", "job-e", 1));
    api.remove(Kind::Pod, &ids[1]);
    api.remove(Kind::Pod, &ids[2]);
    api.put(Kind::Job, indexed_job("f", "job-f", 3));
    let f = job_pods("f", "job-f", 0..3, 8, None);
    for p in &f {
        api.put(Kind::Pod, p.clone());
    }
    let ids_f = names(&f);
    eventually("a gang of 3 fits in the room given back", Duration::from_secs(20), || bound(&api, &ids_f) == 3).await;
    assert_eq!(node_of(&api, &ids[0]), before[0], "index 0 kept running");
    run.stop().await;
}

/// One kind of owner for [`every_owner_kind_gangs_its_pods_through_partial_arrival_a_replaced_member_and_scaling`]:
/// its objects for a gang of `size`, and its member `i` (incarnation `uid`) as its controller makes it.
struct OwnerCase {
    what: &'static str,
    owner: fn(&FakeApi, u32),
    member: fn(u32, &str) -> Value,
    /// Whether the kind can grow a running gang (a JobSet's replicas and a LeaderWorkerSet's
    /// group size are fixed; their controllers recreate instead).
    scales: bool,
}

fn with_uid(mut p: Value, uid: &str) -> Value {
    p["metadata"]["uid"] = json!(uid);
    p
}

fn training_labels(job: &str, kind: &str, i: u32) -> Value {
    json!({"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": kind,
           "training.kubeflow.org/replica-index": i.to_string(), "training.kubeflow.org/operator-name": "tfjob-controller"})
}

fn owner_cases() -> Vec<OwnerCase> {
    vec![
        OwnerCase {
            what: "Indexed Job",
            owner: |api, size| {
                api.put(Kind::Job, indexed_job("ij", "ij-uid", size));
            },
            member: |i, uid| with_uid(job_pods("ij", "ij-uid", i..i + 1, 8, None).remove(0), uid),
            scales: true,
        },
        OwnerCase {
            what: "TFJob",
            owner: |api, size| {
                api.put(
                    Kind::TfJob,
                    json!({"metadata": {"name": "tf", "namespace": "ml", "uid": "tf-uid"},
                    "spec": {"tfReplicaSpecs": {"PS": {"replicas": 1, "template": {}},
                                                "Worker": {"replicas": size - 1, "template": {}}}}}),
                );
            },
            member: |i, uid| {
                let (kind, index) = if i == 0 { ("ps", 0) } else { ("worker", i - 1) };
                let owners = vec![owner_ref("kubeflow.org/v1", "TFJob", "tf", "tf-uid", true)];
                with_uid(
                    member(&format!("tf-{kind}-{index}"), 8, owners, training_labels("tf", kind, index), json!({})),
                    uid,
                )
            },
            scales: true,
        },
        OwnerCase {
            what: "MPIJob (launcher a Job of its own)",
            owner: |api, size| {
                api.put(
                    Kind::MpiJob,
                    json!({"metadata": {"name": "mpi", "namespace": "ml", "uid": "mpi-uid"},
                    "spec": {"launcherCreationPolicy": "AtStartup", "slotsPerWorker": 8,
                             "mpiReplicaSpecs": {"Launcher": {"replicas": 1, "template": {}},
                                                 "Worker": {"replicas": size - 1, "template": {}}}}}),
                );
                let mut launcher = indexed_job("mpi-launcher", "mpi-launcher-uid", 1);
                launcher["metadata"]["ownerReferences"] =
                    json!([owner_ref("kubeflow.org/v2beta1", "MPIJob", "mpi", "mpi-uid", true)]);
                api.put(Kind::Job, launcher);
            },
            member: |i, uid| {
                let labels = json!({"training.kubeflow.org/job-name": "mpi",
                    "training.kubeflow.org/job-role": if i == 0 { "launcher" } else { "worker" }});
                let p = if i == 0 {
                    member(
                        "mpi-launcher-x1",
                        8,
                        vec![owner_ref("batch/v1", "Job", "mpi-launcher", "mpi-launcher-uid", true)],
                        labels,
                        json!({}),
                    )
                } else {
                    member(
                        &format!("mpi-worker-{}", i - 1),
                        8,
                        vec![owner_ref("kubeflow.org/v2beta1", "MPIJob", "mpi", "mpi-uid", true)],
                        labels,
                        json!({}),
                    )
                };
                with_uid(p, uid)
            },
            scales: true,
        },
        OwnerCase {
            what: "JobSet",
            owner: |api, size| {
                api.put(Kind::JobSet, json!({"metadata": {"name": "gs", "namespace": "ml", "uid": "gs-uid"},
                    "spec": {"replicatedJobs": [{"name": "w", "replicas": size, "template": {"spec": {"parallelism": 1, "completions": 1, "template": {}}}}]}}));
                for j in 0..size {
                    let mut job = indexed_job(&format!("gs-w-{j}"), &format!("gs-w-{j}-uid"), 1);
                    job["metadata"]["ownerReferences"] =
                        json!([owner_ref("jobset.x-k8s.io/v1alpha2", "JobSet", "gs", "gs-uid", true)]);
                    api.put(Kind::Job, job);
                }
            },
            member: |i, uid| {
                let job = format!("gs-w-{i}");
                let mut p = job_pods(&job, &format!("{job}-uid"), 0..1, 8, None).remove(0);
                p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = json!("gs");
                p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] = json!("0");
                with_uid(p, uid)
            },
            scales: false,
        },
        OwnerCase {
            what: "RayCluster",
            owner: |api, size| {
                api.put(Kind::RayCluster, json!({"metadata": {"name": "ray", "namespace": "ml", "uid": "ray-uid"},
                    "spec": {"headGroupSpec": {"template": {}}, "workerGroupSpecs": [
                        {"groupName": "gpu", "replicas": size - 1, "minReplicas": 2, "maxReplicas": 8, "template": {}}]}}));
            },
            member: |i, uid| {
                let (name, node_type) =
                    if i == 0 { ("ray-head-x".to_string(), "head") } else { (format!("ray-gpu-worker-{i}"), "worker") };
                let owners = vec![owner_ref("ray.io/v1", "RayCluster", "ray", "ray-uid", true)];
                with_uid(
                    member(
                        &name,
                        8,
                        owners,
                        json!({"ray.io/cluster": "ray", "ray.io/node-type": node_type}),
                        json!({}),
                    ),
                    uid,
                )
            },
            scales: true,
        },
        OwnerCase {
            what: "LeaderWorkerSet",
            owner: |api, size| {
                api.put(
                    Kind::LeaderWorkerSet,
                    json!({"metadata": {"name": "lw", "namespace": "ml", "uid": "lw-uid"},
                    "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": size, "workerTemplate": {}}}}),
                );
            },
            member: |i, uid| {
                let (name, sts) = if i == 0 { ("lw-0".to_string(), "lw") } else { (format!("lw-0-{i}"), "lw-0") };
                let owners = vec![owner_ref("apps/v1", "StatefulSet", sts, &format!("{sts}-uid"), true)];
                let labels = json!({"leaderworkerset.sigs.k8s.io/name": "lw", "leaderworkerset.sigs.k8s.io/group-index": "0",
                                    "leaderworkerset.sigs.k8s.io/worker-index": i.to_string()});
                with_uid(member(&name, 8, owners, labels, json!({"leaderworkerset.sigs.k8s.io/size": "3"})), uid)
            },
            scales: false,
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_owner_kind_gangs_its_pods_through_partial_arrival_a_replaced_member_and_scaling() {
    for case in owner_cases() {
        let what = case.what;
        let api = FakeApi::new();
        for n in 0..5 {
            api.put(Kind::Node, gpu_node(&format!("gpu-{n}"), 8, &[]));
        }
        (case.owner)(&api, 3);
        let pods: Vec<Value> = (0..4).map(|i| (case.member)(i, &format!("{what}-{i}"))).collect();
        let ids = names(&pods);
        for p in &pods[..2] {
            api.put(Kind::Pod, p.clone());
        }
        let run = start(&api, "a", None);
        eventually(&format!("{what}: the first two told why they wait"), Duration::from_secs(20), || {
            waiting_message(&api, &ids[0]).is_some()
        })
        .await;
        none_bound_for(&api, &ids[..2], Duration::from_millis(800), &format!("{what}: 2 of a gang of 3")).await;
        api.put(Kind::Pod, pods[2].clone());
        eventually(&format!("{what}: the gang of 3 bound"), Duration::from_secs(20), || bound(&api, &ids[..3]) == 3)
            .await;
        // A member fails and is made again (same name, new UID): it joins the running gang alone.
        let before: Vec<Option<String>> = ids[..3].iter().map(|id| node_of(&api, id)).collect();
        api.remove(Kind::Pod, &ids[1]);
        api.put(Kind::Pod, (case.member)(1, &format!("{what}-1-again")));
        eventually(&format!("{what}: the replacement bound"), Duration::from_secs(20), || {
            node_of(&api, &ids[1]).is_some()
        })
        .await;
        assert_eq!(
            (node_of(&api, &ids[0]), node_of(&api, &ids[2])),
            (before[0].clone(), before[2].clone()),
            "{what}: the others stay"
        );
        if case.scales {
            // The owner grows to 4: the new member joins the running gang.
            (case.owner)(&api, 4);
            api.put(Kind::Pod, pods[3].clone());
            eventually(&format!("{what}: the 4th member bound"), Duration::from_secs(20), || {
                node_of(&api, &ids[3]).is_some()
            })
            .await;
        }
        run.stop().await;
    }
}

pub(crate) async fn dashboard_get(addr: std::net::SocketAddr, path: &str) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    serde_json::from_str(out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default()).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_cluster_the_core_sees_and_why_a_gang_waits() {
    let api = FakeApi::new();
    for n in 0..3 {
        // gpu-0 and gpu-1 form one NVLink domain (the default levels' innermost), gpu-2 another.
        let clique = if n < 2 { "nvl.0" } else { "nvl.1" };
        let mut node = gpu_node(&format!("gpu-{n}"), 8, &[("nvidia.com/gpu.clique", clique)]);
        if n == 0 {
            // The node agent's topology annotation: a real 8 × H100 `nvidia-smi topo -m`.
            let text = include_str!("../../../topology/tests/fixtures/h100-sxm-8gpu-nv18.txt");
            let topology = wasmsched_topology::smi::parse(text).unwrap();
            node["metadata"]["annotations"][wasmsched_topology::annotation::TOPOLOGY_ANNOTATION] =
                serde_json::json!(wasmsched_topology::annotation::to_annotation(&topology));
        }
        api.put(Kind::Node, node);
    }
    api.put(Kind::Job, indexed_job("big", "big-uid", 4));
    for p in job_pods("big", "big-uid", 0..4, 8, None) {
        api.put(Kind::Pod, p);
    }
    // `solo` runs in a leaf queue under an inner one (a queue counts its subtree's tasks).
    api.put(Kind::Queue, json!({"metadata": {"name": "org"}, "spec": {}}));
    api.put(Kind::Queue, json!({"metadata": {"name": "team"}, "spec": {"parent": "org"}}));
    let mut solo = pod("ml", "solo", NAME, 2, "4", "32Gi");
    solo["metadata"]["annotations"] = json!({"scheduling.wasmsched.io/queue": "team"});
    api.put(Kind::Pod, solo);
    // A pod group of two with one member so far: held back before the core sees it.
    api.put(Kind::PodGroup, json!({"metadata": {"name": "pair", "namespace": "ml"}, "spec": {"minMember": 2}}));
    let mut lonely = pod("ml", "lonely", NAME, 1, "1", "1Gi");
    lonely["metadata"]["labels"]["scheduling.wasmsched.io/pod-group"] = json!("pair");
    api.put(Kind::Pod, lonely);
    let publisher = wasmsched_dashboard::Publisher::new();
    let server = wasmsched_dashboard::Server::start("127.0.0.1:0".parse().unwrap(), publisher.clone()).await.unwrap();
    // A page following the decisions from the start.
    let seen = wasmsched_dashboard::browser::follow_decisions(&server.addr().to_string()).await;
    while publisher.watchers() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // No `--events` destination: the stream is the outbox of a sink only the dashboard reads.
    let run = crate::boundary::start_with_dashboard(&api, "a", publisher);
    eventually("solo bound", Duration::from_secs(20), || node_of(&api, "ml/solo").is_some()).await;
    // The stream showed the bind and why the gang waits, as they happened: the events as a sink
    // publishes them, reasons per stage included.
    let shown = |t: &str, subject: &str| {
        let of = |e: &&Value| e["type"] == t && e["subject"].as_str().is_some_and(|s| s.starts_with(subject));
        seen.lock().unwrap().iter().find(of).cloned()
    };
    eventually("decisions streamed", Duration::from_secs(20), || {
        shown("io.wasmsched.task.scheduled.v1", "ml/solo").is_some()
            && shown("io.wasmsched.task.unschedulable.v1", "ml/big-").is_some()
    })
    .await;
    let placed = shown("io.wasmsched.task.scheduled.v1", "ml/solo").unwrap();
    assert!(placed["data"]["node"].as_str().is_some_and(|n| n.starts_with("gpu-")), "{placed}");
    let waits = shown("io.wasmsched.task.unschedulable.v1", "ml/big-").unwrap();
    assert!(waits["data"]["reasons"].as_array().is_some_and(|r| !r.is_empty()), "{waits}");
    let started = std::time::Instant::now();
    let (cluster, workloads) = loop {
        let c = dashboard_get(server.addr(), "/api/v1/cluster").await;
        let w = dashboard_get(server.addr(), "/api/v1/workloads").await;
        let tried = w["workloads"].as_array().is_some_and(|l| l.iter().any(|w| w["reason"].is_string()))
            && w["workloads"].as_array().is_some_and(|l| l.iter().any(|w| w["phase"] == "Held"));
        if c["cluster"]["gpu_milli_used"] == 2000 && tried {
            break (c, w);
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the view caught up: {c} {w}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (cluster["source"].as_str(), cluster["cluster"]["nodes"].as_u64()),
        (Some("kubernetes (leader)"), Some(3))
    );
    assert_eq!(cluster["cluster"]["gpus"], 24);
    assert_eq!(cluster["cluster"]["placed"], 1, "solo, counted once although two queues hold it: {cluster}");
    // The NVLink domains as the core keeps them: solo's two GPUs broke one of them.
    let domains: Vec<(String, u64, u64)> = cluster["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_string(),
                d["gpus"].as_u64().unwrap(),
                d["free_gpu_milli"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(domains.iter().map(|d| d.1).sum::<u64>(), 24, "{domains:?}");
    assert_eq!(domains.iter().map(|d| d.2).sum::<u64>(), 22_000, "{domains:?}");
    assert_eq!(domains.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(), ["nvl.0", "nvl.1"]);
    // The cluster's GPU allocation over time, sampled from the first view on.
    let series = cluster["series"].as_array().unwrap();
    assert!(!series.is_empty(), "{cluster}");
    assert!(
        series
            .iter()
            .all(|p| p["at"].is_number() && (0.0..=100.0).contains(&p["allocation_percent"].as_f64().unwrap())),
        "{cluster}"
    );
    // Its last point is the view's moment. Fragmentation is FGD's measure over the shapes of the
    // pods the scheduler has (4 × 8 GPUs, 1 × 2, 1 × 1): on solo's node the 6 free GPUs are
    // fragmented for the 8-GPU shape (weight 4/6), the other shapes fit; the other two nodes
    // take every shape. 4/6 · 6 of 24 GPUs.
    let now = series.last().unwrap();
    assert_eq!(now["allocation_percent"].as_f64(), Some(100.0 * 2.0 / 24.0), "{cluster}");
    let fragmented = now["fragmentation_percent"].as_f64().expect("measured on the scheduler");
    assert!((fragmented - 100.0 * 4.0 / 24.0).abs() < 1e-9, "{cluster}");
    let gang = &workloads["workloads"][0];
    assert_eq!((gang["name"].as_str(), gang["phase"].as_str()), (Some("ml/job/big"), Some("Pending")));
    assert_eq!(
        (gang["members"].as_u64(), gang["placed"].as_u64(), gang["min_member"].as_u64()),
        (Some(4), Some(0), Some(4))
    );
    assert!(gang["reason"].as_str().unwrap().contains("gang"), "{gang}");
    assert_eq!(gang["queue_position"], 1, "the only work waiting in its queue: {gang}");
    assert!(gang["waiting_seconds"].as_u64().is_some_and(|s| s < 60), "{gang}");
    // After what the core holds, the pods held back before it, each with why.
    let held = &workloads["workloads"][1];
    assert_eq!((held["name"].as_str(), held["phase"].as_str()), (Some("ml/lonely"), Some("Held")), "{workloads}");
    assert!(held["reason"].as_str().unwrap().contains("waiting for its 2 members to exist"), "{held}");
    assert_eq!(workloads["workloads"].as_array().unwrap().len(), 2, "{workloads}");
    let policies = dashboard_get(server.addr(), "/api/v1/policies").await;
    assert!(policies["policies"]["plugins"].as_array().is_some_and(|p| !p.is_empty()), "{policies}");
    // The queue that holds `solo`'s two GPUs, with its guarantee, what it borrows and its place
    // in fair share's order.
    let queues = dashboard_get(server.addr(), "/api/v1/queues").await;
    let holder =
        queues["queues"].as_array().unwrap().iter().find(|q| q["allocated_gpu_milli"] == 2000 && q["served"].is_u64());
    let holder = holder.unwrap_or_else(|| panic!("a served leaf holding 2 GPUs: {queues}"));
    let (allocated, guarantee) = (2000, holder["guarantee_gpu_milli"].as_u64().unwrap());
    assert_eq!(holder["borrowed_gpu_milli"].as_u64(), Some(allocated - guarantee.min(allocated)), "{holder}");
    assert!(holder["weight"].as_u64().is_some_and(|w| w > 0) && holder["allocated_cpu_milli"] == 4000, "{holder}");
    // Its share over time: sampled from the first view on (every 10 s).
    let history = dashboard_get(server.addr(), &format!("/api/v1/queues/{}", holder["name"].as_str().unwrap())).await;
    let first = &history["history"][0];
    assert!(first["at"].is_u64() && [0, 2000].contains(&first["allocated_gpu_milli"].as_u64().unwrap()), "{history}");
    // The node `solo` runs on lists it, and the queue filter finds that node alone.
    let queue = holder["name"].as_str().unwrap();
    let nodes = dashboard_get(server.addr(), &format!("/api/v1/nodes?queue={queue}")).await;
    assert_eq!(nodes["total"], 1, "{nodes}");
    assert_eq!(nodes["nodes"][0]["tasks"], serde_json::json!([{"name": "ml/solo", "queue": queue}]), "{nodes}");
    // A node's topology as `wasmsched topo` shows it, on its own page only.
    let gpu0 = dashboard_get(server.addr(), "/api/v1/nodes/gpu-0").await;
    let topo = gpu0["topology"].as_str().unwrap_or_else(|| panic!("{gpu0}"));
    assert!(topo.contains("GPU7") && topo.contains("NV18") && topo.contains("interconnect: nvswitch"), "{topo}");
    assert!(dashboard_get(server.addr(), "/api/v1/nodes/gpu-1").await["topology"].is_null());
    // The rollout as `policy status` has it: the first version live, in the history.
    let rollout = &policies["policies"]["rollout"];
    assert!(rollout["live"].as_str().is_some_and(|l| l.ends_with("@1")), "{rollout}");
    assert!(
        rollout["history"].as_array().is_some_and(|h| h.iter().any(|v| v["label"] == rollout["live"])),
        "{rollout}"
    );
    // The live plugins' budgets and what they have done: the filter was called for the pods.
    let plugins = policies["policies"]["plugins"].as_array().unwrap();
    let filter = plugins.iter().find(|p| p["stages"].as_array().unwrap().iter().any(|s| s == "Filter")).unwrap();
    assert!(filter["budget"]["deadline_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{filter}");
    assert!(filter["budget"]["memory_mib"].as_u64().is_some_and(|m| m > 0), "{filter}");
    let calls = &filter["calls"][0];
    assert_eq!(calls["stage"], "Filter", "{filter}");
    assert!(calls["calls"].as_u64().is_some_and(|n| n > 0) && calls["faults"] == serde_json::json!([]), "{filter}");
    assert!(calls["mean_us"].as_f64().is_some_and(|us| us > 0.0), "{filter}");
    run.stop().await;
}

/// Kueue's topology request on a Job's pods: the gang goes to one NVLink domain (the
/// `nvidia.com/gpu.clique` label NVIDIA's DRA driver sets) when one has room, the tightest such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_preferring_one_nvlink_domain_gets_one_where_a_blind_placement_splits_it() {
    let placed = |annotate: bool| async move {
        let api = FakeApi::new();
        // Domain A: a1 free (a packer's tightest fit for 8 GPUs), a2 with half its GPUs held;
        // domain B: two free 16-GPU nodes.
        for (name, clique, gpus) in [("a1", "A", 8), ("a2", "A", 8), ("b1", "B", 16), ("b2", "B", 16)] {
            api.put(Kind::Node, gpu_node(name, gpus, &[("nvidia.com/gpu.clique", clique)]));
        }
        let mut held = pod("other", "held", "default-scheduler", 4, "1", "1Gi");
        held["spec"]["nodeName"] = json!("a2");
        held["status"] = json!({"phase": "Running"});
        api.put(Kind::Pod, held);
        api.put(Kind::Job, indexed_job("t", "job-t", 2));
        let mut pods = job_pods("t", "job-t", 0..2, 8, None);
        if annotate {
            for p in &mut pods {
                p["metadata"]["annotations"]["kueue.x-k8s.io/podset-preferred-topology"] =
                    json!("nvidia.com/gpu.clique");
            }
        }
        for p in &pods {
            api.put(Kind::Pod, p.clone());
        }
        let run = start(&api, "t", None);
        let ids = names(&pods);
        eventually("the gang bound", Duration::from_secs(20), || bound(&api, &ids) == 2).await;
        let mut nodes: Vec<String> = ids.iter().map(|id| node_of(&api, id).unwrap()).collect();
        nodes.sort();
        run.stop().await;
        nodes
    };
    let aware = placed(true).await;
    assert!(aware.iter().all(|n| n.starts_with('b')), "both in domain B, the only one with room for both: {aware:?}");
    let blind = placed(false).await;
    assert!(
        blind.iter().any(|n| n.starts_with('a')) && blind.iter().any(|n| n.starts_with('b')),
        "without the request the tightest node is taken first and the gang split: {blind:?}"
    );
}
