//! Multi-node NVLink on Kubernetes, at the HTTP boundary (the fake API server, a MOCK, serving
//! NVIDIA's `ComputeDomain` as its CRD validates it): a Job's pods that ask for a ComputeDomain
//! are placed inside one NVLink domain, and the scheduler creates the object (owned by the Job)
//! and deletes it when the pods are done — never a domain a user made.

use std::time::Duration;

use serde_json::json;

use crate::boundary::{assert_chart_rbac_allows, eventually, node_of, start};
use crate::support::fake_api::{FakeApi, Kind, gpu_node, pod};
use crate::workloads::{bound, indexed_job, job_pods, names};

const ANNOTATION: &str = "scheduling.wasmsched.io/compute-domain";
const CLIQUE: &str = "nvidia.com/gpu.clique";

/// Clique A has two free 8-GPU nodes, clique B three, and `c1` (no clique) is the tightest fit:
/// a packer would put a 3 × 8-GPU gang on c1 and A.
fn cluster(api: &FakeApi) {
    for (name, clique) in
        [("a1", Some("A")), ("a2", Some("A")), ("b1", Some("B")), ("b2", Some("B")), ("b3", Some("B"))]
    {
        api.put(Kind::Node, gpu_node(name, 8, &clique.map(|c| vec![(CLIQUE, c)]).unwrap_or_default()));
    }
    api.put(Kind::Node, gpu_node("c1", 8, &[]));
}

fn domain(api: &FakeApi, key: &str) -> Option<serde_json::Value> {
    api.get(Kind::ComputeDomain, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_asking_for_a_compute_domain_gets_one_nvlink_domain_and_the_object_lives_as_long_as_its_pods() {
    let api = FakeApi::new();
    cluster(&api);
    api.put(Kind::Job, indexed_job("train", "job-train", 3));
    let mut pods = job_pods("train", "job-train", 0..3, 8, None);
    for p in &mut pods {
        p["metadata"]["annotations"][ANNOTATION] = json!("train-imex");
    }
    // A domain the user made, asked for by a lone pod, and one a previous run of ours left behind.
    api.put(
        Kind::ComputeDomain,
        json!({"metadata": {"name": "mine", "namespace": "ml"},
        "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "mine-ch"}}}}),
    );
    api.put(
        Kind::ComputeDomain,
        json!({"metadata": {"name": "stale", "namespace": "ml",
        "labels": {"app.kubernetes.io/managed-by": "wasmsched"}},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "stale"}}}}),
    );
    let mut solo = pod("ml", "solo", crate::boundary::NAME, 4, "1", "1Gi");
    solo["metadata"]["annotations"] = json!({ANNOTATION: "mine"});
    pods.push(solo);
    // A pod that names its channel's claim template, as the driver's users write: its claim comes
    // from the template the driver makes for the domain, so the domain must come first.
    let mut waiter = pod("ml", "waiter", crate::boundary::NAME, 4, "1", "1Gi");
    waiter["metadata"]["annotations"] = json!({ANNOTATION: "wait-imex"});
    waiter["spec"]["resourceClaims"] = json!([{"name": "imex", "resourceClaimTemplateName": "wait-imex"}]);
    api.put(Kind::Pod, waiter);
    for p in &pods {
        api.put(Kind::Pod, p.clone());
    }
    let run = start(&api, "t", None);
    let ids = names(&pods);
    eventually("every pod bound", Duration::from_secs(20), || bound(&api, &ids) == 4).await;
    let mut gang: Vec<String> = ids[..3].iter().map(|id| node_of(&api, id).unwrap()).collect();
    gang.sort();
    assert_eq!(gang, ["b1", "b2", "b3"], "the only NVLink domain with room for all three");
    assert_ne!(node_of(&api, "ml/solo").as_deref(), Some("c1"), "a lone pod in a domain too: a node of a clique");

    eventually("the gang's ComputeDomain", Duration::from_secs(10), || domain(&api, "ml/train-imex").is_some()).await;
    let d = domain(&api, "ml/train-imex").unwrap();
    assert_eq!(
        d["spec"],
        json!({"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "train-imex"}, "allocationMode": "Single"}})
    );
    assert_eq!(d["metadata"]["labels"]["app.kubernetes.io/managed-by"], "wasmsched");
    let owner = &d["metadata"]["ownerReferences"][0];
    assert_eq!((owner["kind"].as_str(), owner["uid"].as_str()), (Some("Job"), Some("job-train")));
    // Made beside the gang's, not necessarily before it was seen: waited for too.
    eventually("the waiter's ComputeDomain", Duration::from_secs(10), || domain(&api, "ml/wait-imex").is_some()).await;
    let w = domain(&api, "ml/wait-imex");
    assert_eq!(w.as_ref().map(|w| &w["spec"]["channel"]["resourceClaimTemplate"]["name"]), Some(&json!("wait-imex")));
    assert_eq!(node_of(&api, "ml/waiter"), None, "no claim yet (no driver made the template): it waits");
    eventually("ours left behind deleted", Duration::from_secs(10), || domain(&api, "ml/stale").is_none()).await;
    assert_eq!(domain(&api, "ml/mine").unwrap()["spec"]["numNodes"], 2, "the user's domain used as it is");

    // The gang's pods finish and the lone pod is deleted: ours goes, the user's stays.
    for id in &ids[..3] {
        let mut done = api.get(Kind::Pod, id).unwrap();
        done["status"]["phase"] = json!("Succeeded");
        api.put(Kind::Pod, done);
    }
    api.remove(Kind::Pod, "ml/solo");
    api.remove(Kind::Pod, "ml/waiter");
    eventually("the gang's domain deleted", Duration::from_secs(15), || domain(&api, "ml/train-imex").is_none()).await;
    eventually("the waiter's domain deleted", Duration::from_secs(5), || domain(&api, "ml/wait-imex").is_none()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(domain(&api, "ml/mine").is_some(), "a domain the scheduler did not make is never deleted");
    let calls = api.state().compute_domain_calls.clone();
    let count = |m: &str, key: &str| calls.iter().filter(|(cm, k)| cm == m && k == key).count();
    assert_eq!(
        (count("POST", "ml/"), count("DELETE", "ml/train-imex"), count("DELETE", "ml/mine")),
        (3, 1, 0),
        "one create for each domain missing (the user's answered 409), one delete: {calls:?}"
    );
    assert_chart_rbac_allows(&api);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_nvidia_s_driver_the_gang_still_gets_one_nvlink_domain_and_the_api_is_not_hammered() {
    let api = FakeApi::new();
    api.state().unserved.insert(Kind::ComputeDomain);
    cluster(&api);
    api.put(Kind::Job, indexed_job("train", "job-train", 3));
    let mut pods = job_pods("train", "job-train", 0..3, 8, None);
    for p in &mut pods {
        p["metadata"]["annotations"][ANNOTATION] = json!("train-imex");
        api.put(Kind::Pod, p.clone());
    }
    let run = start(&api, "t", None);
    let ids = names(&pods);
    eventually("the gang bound", Duration::from_secs(20), || bound(&api, &ids) == 3).await;
    let mut gang: Vec<String> = ids.iter().map(|id| node_of(&api, id).unwrap()).collect();
    gang.sort();
    assert_eq!(gang, ["b1", "b2", "b3"]);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let calls = api.state().requests.iter().filter(|(_, _, resource)| resource == "computedomains").count();
    assert!(calls <= 2, "one list refused, then quiet until the next resync: {calls} calls");
    run.stop().await;
}

/// The shipped example, as the Job controller turns it into pods: the domain it names is created
/// with the channel its pods claim, they wait for their claims (no driver made the template here)
/// and the domain goes with the Job's pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_job_gets_its_compute_domain_and_loses_it_with_its_pods() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/kubernetes/compute-domain-job.yaml");
    let job: serde_json::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let api = FakeApi::new();
    cluster(&api);
    let (name, ns) = (job["metadata"]["name"].as_str().unwrap(), job["metadata"]["namespace"].as_str().unwrap());
    let mut stored = job.clone();
    stored["metadata"]["uid"] = json!("job-llm");
    api.put(Kind::Job, stored);
    let template = &job["spec"]["template"];
    let mut ids = Vec::new();
    for i in 0..job["spec"]["parallelism"].as_u64().unwrap() {
        let mut p = pod(ns, &format!("{name}-{i}"), crate::boundary::NAME, 4, "1", "1Gi");
        p["metadata"]["annotations"] = template["metadata"]["annotations"].clone();
        p["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "job-llm", "controller": true}]);
        p["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] = json!("job-llm");
        p["spec"]["resourceClaims"] = template["spec"]["resourceClaims"].clone();
        api.put(Kind::Pod, p);
        ids.push(format!("{ns}/{name}-{i}"));
    }
    let run = start(&api, "t", None);
    let key = format!("{ns}/llm-imex");
    eventually("the example's domain", Duration::from_secs(10), || domain(&api, &key).is_some()).await;
    let d = domain(&api, &key).unwrap();
    let claimed = template["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].clone();
    assert_eq!(d["spec"]["channel"]["resourceClaimTemplate"]["name"], claimed, "the template its pods claim");
    assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "job-llm");
    assert_eq!(bound(&api, &ids), 0, "waiting for their channel claims");
    for id in &ids {
        api.remove(Kind::Pod, id);
    }
    eventually("the domain deleted with the pods", Duration::from_secs(10), || domain(&api, &key).is_none()).await;
    run.stop().await;
}
