//! The agent as the kubelet's device plugin, over real unix sockets with the stand-in kubelet
//! (`wasmsched_deviceplugin::fake_kubelet`, the mock at the kubelet's gRPC boundary) admitting
//! containers as the kubelet's device manager does. The node: 8 stand-in GPUs made from the
//! recorded H200 inventory (NUMA 0 for GPUs 0–3, 1 for 4–7), read through `Source::Recorded`.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tokio::sync::watch;
use wasmsched_agent::Source;
use wasmsched_agent::decisions::Decisions;
use wasmsched_agent::device_plugin::{Exposure, GpuShares, NodeGpus, SHARE_RESOURCE, WHOLE_RESOURCE, WholeGpus};
use wasmsched_agent::mps::MpsDaemons;
use wasmsched_deviceplugin::fake_kubelet::{FakeKubelet, until, within};
use wasmsched_deviceplugin::{HEALTHY, Resource, Served, UNHEALTHY};

const NODE: &str = "gpu-node-0";

/// The recorded H200 inventory grown to 8 GPUs: each a copy of the real one with its own index,
/// UUID, PCI address and NUMA node.
fn eight_gpu_inventory(dir: &std::path::Path) -> std::path::PathBuf {
    let recorded = std::fs::read_to_string(format!(
        "{}/../nvml/tests/fixtures/h200-driver-580.159.04-agent-inventory.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let mut inventory: serde_json::Value = serde_json::from_str(&recorded).unwrap();
    let one = inventory["devices"][0].clone();
    let devices: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            let mut d = one.clone();
            d["index"] = json!(i);
            d["uuid"] = json!(uuid(i));
            d["pci"] = json!(format!("0000:{:02x}:00.0", 0x10 + i));
            d["numa"] = json!(i / 4);
            d
        })
        .collect();
    inventory["devices"] = json!(devices);
    let mut paths = Vec::new();
    for a in 0..8 {
        for b in a + 1..8 {
            paths.push(if a / 4 == b / 4 { "node" } else { "system" });
        }
    }
    inventory["paths"] = json!(paths);
    let path = dir.join("inventory.json");
    std::fs::write(&path, inventory.to_string()).unwrap();
    path
}

fn uuid(i: u32) -> String {
    format!("GPU-5406ae7e-c004-9128-b16e-eb647c4a0d3{i}")
}

/// A pod bound to `node` with the scheduler's `gpu-ids`.
fn pod(name: &str, node: &str, gpu_ids: &str, phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "annotations": {"wasmsched.io/gpu-ids": gpu_ids}},
        "spec": {"nodeName": node, "containers": [{"name": "main"}]},
        "status": {"phase": phase},
    }))
    .unwrap()
}

/// A stand-in for NVIDIA's `nvidia-cuda-mps-control` (no GPU in CI), keeping to what the agent
/// relies on: `-d` forks a daemon into the background that writes its pid in
/// `$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid`; `quit` on stdin (same pipe directory)
/// ends it. It also notes the environment it was started with.
const MPS_CONTROL: &str = r#"#!/bin/bash
set -eu
pipes="$CUDA_MPS_PIPE_DIRECTORY"
if [ "${1:-}" = -d ]; then
  echo "$CUDA_VISIBLE_DEVICES $CUDA_MPS_LOG_DIRECTORY" >> "$pipes/started-with"
  setsid sleep 600 </dev/null >/dev/null 2>&1 &
  echo $! > "$pipes/nvidia-cuda-mps-control.pid"
  exit 0
fi
read -r command
[ "$command" = quit ] || { echo "unknown command $command" >&2; exit 1; }
kill "$(cat "$pipes/nvidia-cuda-mps-control.pid")"
rm -f "$pipes/nvidia-cuda-mps-control.pid"
"#;

/// The MPS daemons of a node whose control program is [`MPS_CONTROL`], under `dir`.
fn stand_in_mps(dir: &std::path::Path) -> Arc<MpsDaemons> {
    use std::os::unix::fs::PermissionsExt;
    let control = dir.join("nvidia-cuda-mps-control");
    std::fs::write(&control, MPS_CONTROL).unwrap();
    std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o755)).unwrap();
    Arc::new(MpsDaemons::new(control, dir.join("mps"), dir.join("shm")))
}

struct Node {
    dir: tempfile::TempDir,
    /// The node's own files (the kubelet's directory is emptied by a kubelet restart).
    state: tempfile::TempDir,
    mps: Arc<MpsDaemons>,
    kubelet: FakeKubelet,
    gpus: Arc<NodeGpus>,
    decisions: Arc<Decisions>,
    stop: watch::Sender<bool>,
    served: Vec<Arc<Served>>,
    servers: Vec<tokio::task::JoinHandle<Result<(), wasmsched_deviceplugin::ServeError>>>,
}

impl Node {
    async fn start() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = FakeKubelet::start(dir.path()).await;
        let found = Source::Recorded(eight_gpu_inventory(dir.path())).discover().unwrap();
        let gpus = Arc::new(NodeGpus::default());
        gpus.set(found.gpu_devices(&BTreeSet::new()));
        // Refusals come after a short wait here (2 s on a node: the agent's watch may lag).
        let decisions = Arc::new(Decisions::new(NODE).with_grace(Duration::from_millis(100)));
        let (stop, stopped) = watch::channel(false);
        let state = tempfile::tempdir().unwrap();
        let mps = stand_in_mps(state.path());
        let mut node = Node { dir, state, mps, kubelet, gpus, decisions, stop, served: vec![], servers: vec![] };
        node.serve(stopped);
        for resource in [WHOLE_RESOURCE, SHARE_RESOURCE] {
            let list = node.kubelet.devices(resource).await;
            until("the device list", || (!list.borrow().is_empty()).then_some(())).await;
        }
        node
    }

    fn serve(&mut self, stopped: watch::Receiver<bool>) {
        let whole: Arc<dyn Resource> =
            Arc::new(WholeGpus { gpus: self.gpus.clone(), decisions: self.decisions.clone(), exposure: Exposure::Env });
        let shares: Arc<dyn Resource> = Arc::new(GpuShares {
            gpus: self.gpus.clone(),
            decisions: self.decisions.clone(),
            exposure: Exposure::Env,
            mps: Some(self.mps.clone()),
        });
        for resource in [whole, shares] {
            let served = Served::new();
            self.served.push(served.clone());
            let dir = self.dir.path().to_path_buf();
            self.servers.push(tokio::spawn(wasmsched_deviceplugin::serve(resource, dir, stopped.clone(), served)));
        }
    }

    async fn stop(self) {
        // The stand-in daemons end with the test.
        self.mps.reconcile(BTreeSet::new);
        self.stop.send(true).unwrap();
        for s in self.servers {
            tokio::time::timeout(Duration::from_secs(10), s).await.unwrap().unwrap().unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_gpu_pods_get_exactly_the_schedulers_gpus_and_the_kubelet_agrees() {
    let node = Node::start().await;
    // Both registered once (in either order: each resource registers on its own).
    let mut registered: Vec<String> = node.kubelet.registrations().iter().map(|r| r.resource_name.clone()).collect();
    registered.sort();
    assert_eq!(registered, [WHOLE_RESOURCE, SHARE_RESOURCE]);

    // The list: 8 GPUs by UUID, healthy, each on its NUMA node; 1000 share units per GPU.
    let list = node.kubelet.devices(WHOLE_RESOURCE).await.borrow().clone();
    assert_eq!(list.len(), 8);
    assert_eq!(list[2].id, uuid(2));
    assert_eq!(list[2].health, HEALTHY);
    assert_eq!(list[5].topology.as_ref().unwrap().nodes[0].id, 1);
    assert_eq!(node.kubelet.devices(SHARE_RESOURCE).await.borrow().len(), 8000);

    // The scheduler chose {2,3}: the kubelet would have started from GPU 0.
    node.decisions.apply(&pod("train", NODE, "2,3", "Pending"));
    let got = node.kubelet.admit(WHOLE_RESOURCE, 2).await.unwrap();
    assert_eq!(got.preferred, [uuid(2), uuid(3)]);
    assert_eq!(got.devices, [uuid(2), uuid(3)]);
    assert_eq!(got.response.envs["NVIDIA_VISIBLE_DEVICES"], format!("{},{}", uuid(2), uuid(3)));
    assert_eq!(got.response.envs["WASMSCHED_GPU_IDS"], "2,3");
    // The kubelet's accounting (what PodResources reports) names the same GPUs.
    assert_eq!(node.kubelet.held(WHOLE_RESOURCE), [uuid(2), uuid(3)].into_iter().collect());

    // Two pods admitted back to back get their own GPUs, in the order the kubelet admits them.
    node.decisions.apply(&pod("a", NODE, "5", "Pending"));
    node.decisions.apply(&pod("b", NODE, "0", "Pending"));
    let a = node.kubelet.admit(WHOLE_RESOURCE, 1).await.unwrap();
    let b = node.kubelet.admit(WHOLE_RESOURCE, 1).await.unwrap();
    assert_eq!((a.devices, b.devices), (vec![uuid(5)], vec![uuid(0)]));

    // A pod no decision names is refused, with the reason the pod's events will show.
    let refused = node.kubelet.admit(WHOLE_RESOURCE, 1).await.unwrap_err();
    let reason = refused.message();
    assert!(reason.contains("no pod bound to node gpu-node-0 was given 1 whole GPU(s) among [1, 4, 6, 7]"), "{reason}");
    assert!(reason.contains("(waiting here: none)"), "{reason}");
    assert_eq!(node.kubelet.held(WHOLE_RESOURCE).len(), 4, "nothing handed out for the refused pod");
    // A pod bound to another node is not this node's decision.
    node.decisions.apply(&pod("elsewhere", "gpu-node-1", "7", "Pending"));
    assert!(node.kubelet.admit(WHOLE_RESOURCE, 1).await.is_err());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_that_picks_other_gpus_than_the_scheduler_is_refused() {
    let node = Node::start().await;
    node.decisions.apply(&pod("train", NODE, "6", "Pending"));
    // The kubelet's side of the call, picking GPU 1 by itself (as it does when a plugin's
    // preference is not among what it has free).
    let whole = WholeGpus { gpus: node.gpus.clone(), decisions: node.decisions.clone(), exposure: Exposure::Env };
    let refused = whole.allocate(&[uuid(1)]).unwrap_err();
    assert!(refused.0.contains("whole GPU(s) [1]") && refused.0.contains("ml/train (GPUs 6)"), "{refused}");
    // Devices the node does not have.
    assert!(whole.allocate(&["GPU-not-here".into()]).unwrap_err().0.contains("no GPU GPU-not-here"));
    // Its own GPU is still there for it.
    assert_eq!(node.kubelet.admit(WHOLE_RESOURCE, 1).await.unwrap().devices, [uuid(6)]);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_exactly_as_many_gpus_free_as_asked_the_kubelet_does_not_ask_and_allocate_refuses() {
    let node = Node::start().await;
    node.decisions.apply(&pod("big", NODE, "0,1,2,3,4,5,6", "Pending"));
    let got = node.kubelet.admit(WHOLE_RESOURCE, 7).await.unwrap();
    assert_eq!(got.devices.len(), 7);
    assert_eq!(got.response.envs["WASMSCHED_GPU_IDS"], "0,1,2,3,4,5,6");
    // A stale decision for a GPU that is taken: one GPU is free, so the kubelet takes it without
    // a preference, and only Allocate stands between the pod and the wrong GPU.
    node.decisions.apply(&pod("stale", NODE, "3", "Pending"));
    let refused = node.kubelet.admit(WHOLE_RESOURCE, 1).await.unwrap_err();
    let reason = refused.message();
    assert!(reason.contains("was given whole GPU(s) [7]") && reason.contains("ml/stale (GPUs 3)"), "{reason}");
    assert_eq!(node.kubelet.held(WHOLE_RESOURCE).len(), 7);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_land_on_the_schedulers_gpu_with_their_limits_and_never_overfill_it() {
    let node = Node::start().await;
    node.decisions.apply(&pod("infer-a", NODE, "4:500", "Pending"));
    node.decisions.apply(&pod("infer-b", NODE, "4:500", "Pending"));
    for _ in 0..2 {
        let got = node.kubelet.admit(SHARE_RESOURCE, 500).await.unwrap();
        assert_eq!(got.devices.len(), 500);
        assert!(got.devices.iter().all(|u| u.starts_with(&format!("{}::", uuid(4)))), "all units on GPU 4");
        let envs = &got.response.envs;
        assert_eq!(envs["NVIDIA_VISIBLE_DEVICES"], uuid(4));
        assert_eq!(envs["WASMSCHED_GPU_IDS"], "4:500");
        assert_eq!(envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "50");
        // Half of the recorded H200's 143,771 MiB.
        assert_eq!(envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=71885M");
        assert_eq!(envs["CUDA_MPS_PIPE_DIRECTORY"], "/tmp/nvidia-mps");
        let mounts: Vec<(&str, String)> =
            got.response.mounts.iter().map(|m| (m.container_path.as_str(), m.host_path.clone())).collect();
        let host = node.state.path().display();
        assert_eq!(
            mounts,
            [("/tmp/nvidia-mps", format!("{host}/mps/{}", uuid(4))), ("/dev/shm", format!("{host}/shm"))]
        );
    }
    // One MPS control daemon for GPU 4, started before the first share's container, seeing only
    // GPU 4, its log outside the directory the containers get.
    assert!(node.mps.running(&uuid(4)).is_some(), "GPU 4's daemon runs");
    let started = std::fs::read_to_string(node.mps.pipe_dir(&uuid(4)).join("started-with")).unwrap();
    assert_eq!(started, format!("{} {}/mps/log/{}\n", uuid(4), node.state.path().display(), uuid(4)), "started once");
    // GPU 4 is full: a stale decision for more of it is never admitted, whatever units the
    // kubelet still has (its other GPUs' units are free).
    node.decisions.apply(&pod("late", NODE, "4:300", "Pending"));
    let refused = node.kubelet.admit(SHARE_RESOURCE, 300).await.unwrap_err();
    assert!(refused.message().contains("was given a share of 300 milli"), "{refused:?}");
    let shares =
        GpuShares { gpus: node.gpus.clone(), decisions: node.decisions.clone(), exposure: Exposure::Env, mps: None };
    let units: Vec<String> = (600..900).map(|k| format!("{}::{k}", uuid(4))).collect();
    let refused = shares.allocate(&units).unwrap_err();
    assert!(refused.0.contains("GPU 4 on node gpu-node-0 has 0 milli free, the share needs 300"), "{refused}");
    // Units over two GPUs are not a share.
    let mixed = vec![format!("{}::1", uuid(0)), format!("{}::1", uuid(1))];
    assert!(shares.allocate(&mixed).unwrap_err().0.contains("units of one GPU"));
    // A GPU held whole takes no share, and a GPU with shares is not given whole.
    node.decisions.apply(&pod("whole-4", NODE, "4", "Pending"));
    let whole = WholeGpus { gpus: node.gpus.clone(), decisions: node.decisions.clone(), exposure: Exposure::Env };
    assert!(whole.allocate(&[uuid(4)]).unwrap_err().0.contains("holds shares of other pods (1000 milli)"));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_restart_and_an_agent_restart_give_no_gpu_twice() {
    let mut node = Node::start().await;
    node.decisions.apply(&pod("first", NODE, "0,1", "Pending"));
    node.kubelet.admit(WHOLE_RESOURCE, 2).await.unwrap();

    // The kubelet restarts: both resources register again, its held devices stay (its
    // checkpoint), and the next pod gets its own GPUs.
    node.kubelet.restart().await;
    for served in &node.served {
        within(served.registrations().wait_for(|n| *n == 2)).await.unwrap();
    }
    let list = node.kubelet.devices(WHOLE_RESOURCE).await;
    until("the list after the restart", || (list.borrow().len() == 8).then_some(())).await;
    node.decisions.apply(&pod("second", NODE, "2", "Pending"));
    assert_eq!(node.kubelet.admit(WHOLE_RESOURCE, 1).await.unwrap().devices, [uuid(2)]);

    // The agent restarts: new decisions, rebuilt from the pods as the watch lists them. The
    // running pods hold their GPUs; a stale decision naming one of them is refused.
    node.stop.send(true).unwrap();
    for s in std::mem::take(&mut node.servers) {
        tokio::time::timeout(Duration::from_secs(10), s).await.unwrap().unwrap().unwrap();
    }
    node.decisions = Arc::new(Decisions::new(NODE));
    node.served.clear();
    let (stop, stopped) = watch::channel(false);
    node.stop = stop;
    node.serve(stopped);
    for served in &node.served {
        within(served.registrations().wait_for(|n| *n == 1)).await.unwrap();
    }
    node.decisions.apply(&pod("first", NODE, "0,1", "Running"));
    node.decisions.apply(&pod("second", NODE, "2", "Running"));
    node.decisions.apply(&pod("stale", NODE, "1", "Pending"));
    let whole = WholeGpus { gpus: node.gpus.clone(), decisions: node.decisions.clone(), exposure: Exposure::Env };
    let refused = whole.allocate(&[uuid(1)]).unwrap_err();
    assert!(refused.0.contains("GPU 1 on node gpu-node-0 is held by pod ml/first"), "{refused}");
    // Once the holder is gone, its GPU can go to the next decision.
    node.decisions.delete("uid-first");
    assert_eq!(whole.allocate(&[uuid(1)]).unwrap().envs["WASMSCHED_GPU_IDS"], "1");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_gpu_is_offered_to_nobody() {
    let node = Node::start().await;
    // As the XID watcher reports it.
    node.gpus.set_health(&[6].into_iter().collect());
    let list = node.kubelet.devices(WHOLE_RESOURCE).await;
    until("GPU 6 unhealthy", || (list.borrow()[6].health == UNHEALTHY).then_some(())).await;
    let units = node.kubelet.devices(SHARE_RESOURCE).await;
    until("GPU 6's units unhealthy", || {
        (units.borrow().iter().filter(|d| d.health == UNHEALTHY).count() == 1000).then_some(())
    })
    .await;
    // A pod the scheduler placed on it before it failed is refused, not moved to another GPU.
    node.decisions.apply(&pod("unlucky", NODE, "6", "Pending"));
    let refused = node.kubelet.admit(WHOLE_RESOURCE, 1).await.unwrap_err();
    assert!(refused.message().contains("ml/unlucky (GPUs 6)"), "{refused:?}");
    assert!(node.kubelet.held(WHOLE_RESOURCE).is_empty());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpus_mps_daemon_runs_while_it_holds_shares_and_comes_back_if_it_dies() {
    let node = Node::start().await;
    let wanted = |gpus: &[u32]| gpus.iter().map(|&g| uuid(g)).collect::<BTreeSet<String>>();
    node.decisions.apply(&pod("infer-a", NODE, "5:250", "Pending"));
    node.decisions.apply(&pod("infer-b", NODE, "5:250", "Pending"));
    assert_eq!(node.decisions.share_gpus(), [5].into());
    for _ in 0..2 {
        node.kubelet.admit(SHARE_RESOURCE, 250).await.unwrap();
    }
    let pid = node.mps.running(&uuid(5)).expect("GPU 5's daemon runs");
    // Killed (an agent container restart ends it too) while its GPU holds shares: started again.
    assert!(Command::new("kill").arg(pid.to_string()).status().unwrap().success());
    until("the daemon gone", || node.mps.running(&uuid(5)).is_none().then_some(())).await;
    node.mps.reconcile(|| wanted(&node.decisions.share_gpus().into_iter().collect::<Vec<_>>()));
    let again = node.mps.running(&uuid(5)).expect("started again");
    assert_ne!(again, pid);
    // One share ends: the daemon stays for the other.
    node.decisions.delete("uid-infer-a");
    node.mps.reconcile(|| wanted(&[5]));
    assert_eq!(node.mps.running(&uuid(5)), Some(again));
    // The last ends: it quits, so GPU 5 can be given whole without MPS in front of it.
    node.decisions.delete("uid-infer-b");
    assert!(node.decisions.share_gpus().is_empty());
    node.mps.reconcile(|| wanted(&[]));
    assert_eq!(node.mps.running(&uuid(5)), None);
    assert!(!node.mps.pipe_dir(&uuid(5)).join("nvidia-cuda-mps-control.pid").exists());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_whose_mps_daemon_cannot_start_is_refused_not_run_unlimited() {
    let node = Node::start().await;
    let broken =
        Arc::new(MpsDaemons::new("/nonexistent/nvidia-cuda-mps-control", node.state.path().join("mps"), "/dev/shm"));
    let shares = GpuShares {
        gpus: node.gpus.clone(),
        decisions: node.decisions.clone(),
        exposure: Exposure::Env,
        mps: Some(broken),
    };
    node.decisions.apply(&pod("infer", NODE, "3:500", "Pending"));
    let units: Vec<String> = (0..500).map(|k| format!("{}::{k}", uuid(3))).collect();
    let refused = shares.allocate(&units).unwrap_err();
    assert!(
        refused.0.contains("ml/infer's share is not enforceable: cannot run /nonexistent/nvidia-cuda-mps-control"),
        "{refused}"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_that_refuses_the_registration_ends_the_agent_with_the_reason() {
    let kubelet_dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    // A kubelet that dropped v1beta1: it refuses the agent's registration.
    let _kubelet = FakeKubelet::speaking(kubelet_dir.path(), "v2").await;
    let inventory = eight_gpu_inventory(files.path());
    // The pod watch needs an API server only once the plugins run; this one is never reached.
    let kubeconfig = files.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_wasmsched-agent"))
        .args(["run", "--node", NODE, "--device-plugin", "--inventory"])
        .arg(&inventory)
        .arg("--device-plugin-dir")
        .arg(kubelet_dir.path())
        .env("KUBECONFIG", &kubeconfig)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = until("the agent to end", || agent.try_wait().unwrap()).await;
    let mut err = String::new();
    std::io::Read::read_to_string(&mut agent.stderr.take().unwrap(), &mut err).unwrap();
    drop(agent);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("the kubelet refused to register") && err.contains("unsupported version v1beta1"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_kubelet_admits_before_the_agents_watch_shows_it_gets_its_gpus() {
    let mut node = Node::start().await;
    // As on a node: the agent's decisions wait up to 2 s for its watch.
    node.decisions = Arc::new(Decisions::new(NODE));
    node.stop.send(true).unwrap();
    let servers = std::mem::take(&mut node.servers);
    for s in servers {
        s.await.unwrap().unwrap();
    }
    let (stop, stopped) = watch::channel(false);
    node.stop = stop;
    node.serve(stopped);
    until("registered again", || (node.kubelet.registrations().len() == 4).then_some(())).await;
    // The kubelet asks first; the agent's watch shows the pod 300 ms later.
    let decisions = node.decisions.clone();
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        decisions.apply(&pod("quick", NODE, "6,7", "Pending"));
    });
    let got = node.kubelet.admit(WHOLE_RESOURCE, 2).await.unwrap();
    late.await.unwrap();
    assert_eq!(got.preferred, [uuid(6), uuid(7)]);
    assert_eq!(got.response.envs["WASMSCHED_GPU_IDS"], "6,7");
    // Nothing shows up at all: refused after the wait, with the reason.
    let started = std::time::Instant::now();
    let refused = node.kubelet.admit(WHOLE_RESOURCE, 1).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_secs(2), "{:?}", started.elapsed());
    assert!(refused.message().contains("no pod bound to node gpu-node-0 was given 1 whole GPU(s)"), "{refused:?}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_keeps_the_mps_daemons_of_running_share_pods() {
    let node = Node::start().await;
    // Before the restart: a share pod running on GPU 5 with its daemon.
    let pid = node.mps.ensure(&uuid(5)).unwrap();
    // The restarted agent: no pod known until its watch has listed them.
    let decisions = Arc::new(Decisions::new(NODE));
    let (stop, stopped) = watch::channel(false);
    let every = Duration::from_millis(50);
    let keeper = tokio::spawn(wasmsched_agent::mps::keep(
        node.mps.clone(),
        node.gpus.clone(),
        decisions.clone(),
        every,
        stopped,
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(node.mps.running(&uuid(5)), Some(pid), "not quit before the pods are listed");
    // Listed: the running pod holds its share, the daemon stays.
    decisions.apply(&pod("serving", NODE, "5:400", "Running"));
    decisions.retain(&["uid-serving".to_string()].into());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(node.mps.running(&uuid(5)), Some(pid), "kept for the running share");
    // It ends: the daemon quits.
    decisions.delete("uid-serving");
    until("the daemon quit", || node.mps.running(&uuid(5)).is_none().then_some(())).await;
    stop.send(true).unwrap();
    within(keeper).await.unwrap();
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_during_the_upkeep_never_loses_its_daemon() {
    let node = Node::start().await;
    node.mps.ensure(&uuid(3)).unwrap();
    // The upkeep finds GPU 3 without shares (its answer takes 300 ms); 100 ms in, a share of GPU 3
    // is allocated and asks for its daemon. Either the quit comes first and the allocation starts
    // the daemon again, or the allocation's daemon is kept: never a share left without one.
    let mps = node.mps.clone();
    let upkeep = std::thread::spawn(move || {
        mps.reconcile(|| {
            std::thread::sleep(Duration::from_millis(300));
            BTreeSet::new()
        })
    });
    std::thread::sleep(Duration::from_millis(100));
    node.mps.ensure(&uuid(3)).unwrap();
    upkeep.join().unwrap();
    assert!(node.mps.running(&uuid(3)).is_some(), "the allocated share has its daemon");
    node.stop().await;
}

/// The agent's `/metrics` over HTTP: GPUs by health, the kubelet's calls by resource, call and
/// result, each counted as the fake kubelet made them; and every series and label the chart's
/// node dashboard and alerts read from the agents is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_count_the_kubelets_calls_and_carry_what_the_node_dashboard_reads() {
    use wasmsched_tests::promql::{exposition, scrape, used_series};
    let node = Node::start().await;
    node.gpus.set_health(&[6].into_iter().collect());
    node.decisions.apply(&pod("train", NODE, "2,3", "Pending"));
    node.kubelet.admit(WHOLE_RESOURCE, 2).await.unwrap();
    node.decisions.apply(&pod("infer", NODE, "4:500", "Pending"));
    node.kubelet.admit(SHARE_RESOURCE, 500).await.unwrap();
    // No decision names it: GetPreferredAllocation refuses (the kubelet fails the pod there).
    node.kubelet.admit(WHOLE_RESOURCE, 1).await.unwrap_err();
    // A kubelet that picked a GPU by itself: Allocate refuses.
    let whole = WholeGpus { gpus: node.gpus.clone(), decisions: node.decisions.clone(), exposure: Exposure::Env };
    whole.allocate(&[uuid(1)]).unwrap_err();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(wasmsched_agent::metrics::serve(listener, node.gpus.clone()));
    let text = tokio::task::spawn_blocking(move || scrape(addr)).await.unwrap();
    let sample = |series: &str| -> f64 {
        let line = text.lines().find_map(|l| l.strip_prefix(series)).unwrap_or_else(|| panic!("no {series}: {text}"));
        line.trim().parse().unwrap()
    };
    assert_eq!(sample(r#"wasmsched_agent_gpus{health="healthy"}"#), 7.0);
    assert_eq!(sample(r#"wasmsched_agent_gpus{health="unhealthy"}"#), 1.0);
    let calls = |resource: &str, call: &str, result: &str| {
        sample(&format!(
            r#"wasmsched_agent_device_plugin_calls_total{{resource="{resource}",call="{call}",result="{result}"}}"#
        ))
    };
    assert_eq!(calls(WHOLE_RESOURCE, "Allocate", "ok"), 1.0);
    assert_eq!(calls(WHOLE_RESOURCE, "GetPreferredAllocation", "ok"), 1.0);
    assert_eq!(calls(SHARE_RESOURCE, "Allocate", "ok"), 1.0);
    assert_eq!(calls(WHOLE_RESOURCE, "GetPreferredAllocation", "refused"), 1.0);
    assert_eq!(calls(WHOLE_RESOURCE, "Allocate", "refused"), 1.0);
    // A call never refused is there from zero: its first refusal is an increase Prometheus sees.
    assert_eq!(calls(SHARE_RESOURCE, "Allocate", "refused"), 0.0);
    // What the chart reads from the agents (the PodMonitor adds `node`).
    let exported = exposition(&text);
    let uses: Vec<_> = used_series().into_iter().filter(|u| u.reads_agents()).collect();
    assert!(uses.len() >= 5, "the node dashboard and its alert: {uses:?}");
    let missing: Vec<String> = uses.iter().filter_map(|u| u.check(&exported).err()).collect();
    assert!(missing.is_empty(), "{missing:#?}");
    server.abort();
    node.stop().await;
}
