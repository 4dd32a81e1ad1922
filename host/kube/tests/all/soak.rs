//! The soak, short and on the fake API server: churn (plain pods, gangs, preemptions of a full
//! cluster, each pod ending a while after its bind) through two replicas that elect a leader, with
//! the leader crashed — its runtime dropped, nothing given back, as a killed process — and a new
//! replica started in its place, and the policy swapped on every replica, again and again. What
//! must hold throughout: every pod bound, none bound twice, no node ever over its GPUs, a new
//! leader after each crash, and the replicas' events together counting every run once — closed
//! when its pod went, also when that happened while no replica led. `WASMSCHED_SOAK_SECONDS` sets the churn's length (30 s by default; CI
//! runs 600). The hours-long version on a real API server is in BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use wasmsched_clusterbench::{Arrival, Config, Mix, UnderTest};
use wasmsched_events::{EventSink, Origin, OutboxConfig};
use wasmsched_kube::leader::LeaseConfig;
use wasmsched_kube::metrics::Metrics;
use wasmsched_kube::{Scheduler, SchedulerConfig, policy};
use wasmsched_registry::{Fetched, PolicySetSpec, Registry};

use crate::boundary::{NAME, preparer};
use crate::support::fake_api::{FakeApi, Kind};

/// A scheduler replica on a runtime of its own, so that crashing it stops every task it started.
struct Replica {
    id: String,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    events: EventSink,
    runtime: tokio::runtime::Runtime,
    _stop: watch::Sender<bool>,
}

impl Replica {
    /// A replica publishing its decisions to `<dir>/<id>.jsonl`.
    fn launch(api: &FakeApi, id: &str, dir: &Path) -> Replica {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let _inside = runtime.enter();
        let registry = policy::registry(preparer(), &policy::default_policy(), None, 0).unwrap();
        let metrics = Metrics::new(NAME);
        let mut config = SchedulerConfig::new(NAME);
        config.lease = Some(LeaseConfig {
            lease_duration: Duration::from_secs(2),
            renew_deadline: Duration::from_millis(1500),
            retry_period: Duration::from_millis(200),
            ..LeaseConfig::new("wasmsched", "kube-system", id)
        });
        let origin = Origin { source: "wasmsched/soak/scheduler".into(), id_prefix: id.into() };
        let events = EventSink::jsonl(dir.join(format!("{id}.jsonl")), origin, OutboxConfig::default()).unwrap();
        let scheduler = Scheduler::new(api.clients(id, None), registry.clone(), metrics.clone(), config)
            .with_events(events.clone());
        let (stop, rx) = watch::channel(false);
        runtime.spawn(scheduler.run(rx));
        Replica { id: id.into(), registry, metrics, events, runtime, _stop: stop }
    }

    fn leads(&self) -> bool {
        self.metrics.leader.get() == 1
    }

    /// Gone at once, lease held: a killed process.
    fn crash(self) {
        self.runtime.shutdown_background();
    }
}

/// The two policy sets the replicas swap between: the chart's default (fair share, node affinity)
/// and a bin packer choosing devices itself, with preemption and no fair-share stage.
fn policies() -> [Fetched; 2] {
    let packing = "name: gpu-packing
plugins:
  resource-fit: { source: \"builtin:resource-fit\" }
  gpu-packing: { source: \"builtin:gpu-packing\" }
  priority-preempt: { source: \"builtin:priority-preempt\" }
stages:
  filter: [resource-fit]
  score: [{ plugin: gpu-packing, weight: 1 }]
  select_devices: gpu-packing
  preempt: priority-preempt
";
    let spec = PolicySetSpec::parse("soak", packing).unwrap();
    let packing = Fetched { spec, origin: "soak".into(), artifacts: Default::default(), fingerprint: "packing".into() };
    [packing, policy::default_policy()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_through_leader_crashes_and_policy_swaps_binds_every_pod_once_within_capacity() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_test_writer()
        .try_init();
    let seconds: u64 = std::env::var("WASMSCHED_SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let api = FakeApi::new();
    // No kubelet: the benchmark finishes the victims' deletions as one would.
    api.state().termination = None;
    let dir = std::env::temp_dir().join(format!("wasmsched-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut replicas = vec![Replica::launch(&api, "r0", &dir), Replica::launch(&api, "r1", &dir)];
    let mut launched = 2;

    // 10 nodes of 8 GPUs filled with low-priority pods; plain pods, gangs of 4 and single
    // preemptors take turns (6 pods a round), 12 a second, each ending 4 s after its bind: longer
    // than a takeover (a 2 s lease), or a gang's bound members could end before the next leader
    // binds the one a crash left pending — a gang that can never be whole again.
    let rate = 12.0;
    let pods = ((rate as u64 * seconds) / 6 * 6) as usize;
    let config = Config {
        scheduler_name: NAME.into(),
        under_test: UnderTest::Running { pid: None },
        namespace: "soak".into(),
        nodes: 10,
        gpus_per_node: 8,
        pods,
        gpus_per_pod: 1,
        arrival: Arrival::Rate(rate),
        workload: Mix::parse("plain,gang:4,preempt").unwrap(),
        create_in_flight: 8,
        warm_up: Duration::ZERO,
        timeout: Duration::from_secs(seconds + 120),
        settle: Duration::ZERO,
        delete_nodes: false,
        lifetime: Some(Duration::from_secs(4)),
        sample_every: None,
    };
    let done = std::sync::atomic::AtomicBool::new(false);
    let bench = async {
        let report = wasmsched_clusterbench::run(api.client("bench"), &config).await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        report
    };

    // A crash every ~seconds/5 (at least 5 s apart), a policy swap every ~seconds/7.
    let crash_every = Duration::from_secs((seconds / 5).max(5));
    let swap_every = Duration::from_secs((seconds / 7).max(3));
    let (mut next_crash, mut next_swap) = (Instant::now() + crash_every, Instant::now() + swap_every);
    let (mut crashes, mut takeovers, mut swaps) = (0, 0, 0);
    let mut awaiting_takeover: Option<Instant> = None;
    let policies = policies();
    let chaos = async {
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Some(since) = awaiting_takeover
                && replicas.iter().any(Replica::leads)
            {
                takeovers += 1;
                assert!(since.elapsed() < Duration::from_secs(15), "a new leader took {:?}", since.elapsed());
                awaiting_takeover = None;
                // The crashed replica's replacement joins as the new standby, as a Deployment's new
                // pod comes up after the standby took over (one that started during the gap could
                // not know the runs that ended before it: docs/usage.md).
                replicas.push(Replica::launch(&api, &format!("r{launched}"), &dir));
                launched += 1;
            }
            if Instant::now() >= next_swap {
                let fetched = policies[swaps % 2].clone();
                let registries: Vec<Arc<Registry>> = replicas.iter().map(|r| r.registry.clone()).collect();
                tokio::task::spawn_blocking(move || {
                    for registry in registries {
                        registry.offer(&fetched, preparer()).expect("the policy prepares");
                    }
                })
                .await
                .unwrap();
                swaps += 1;
                next_swap += swap_every;
            }
            if Instant::now() >= next_crash && awaiting_takeover.is_none() {
                if let Some(at) = replicas.iter().position(Replica::leads) {
                    let leader = replicas.swap_remove(at);
                    tracing::info!(replica = %leader.id, "crashing the leader");
                    leader.crash();
                    crashes += 1;
                    awaiting_takeover = Some(Instant::now());
                }
                next_crash += crash_every;
            }
        }
        (replicas, crashes, takeovers, swaps)
    };
    let (report, (replicas, crashes, takeovers, swaps)) = tokio::join!(bench, chaos);
    let report = report.unwrap();
    // The last measured pods end; the leader publishes how (the fillers run on).
    let measured_left = || {
        api.objects(Kind::Pod)
            .iter()
            .filter(|p| p["metadata"]["labels"]["wasmsched.io/bench-role"] == "measured")
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while measured_left() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Quiet: no bind and no pod coming or going for 3 s (fillers replaced late still bind).
    let state = || (api.binds().len(), api.objects(Kind::Pod).len());
    let (mut last, mut since) = (state(), Instant::now());
    while since.elapsed() < Duration::from_secs(3) && Instant::now() < deadline + Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if state() != last {
            (last, since) = (state(), Instant::now());
        }
    }
    for replica in replicas {
        assert!(replica.events.flush(Duration::from_secs(10)), "events of {} written", replica.id);
        replica.crash();
    }
    let running = api.objects(Kind::Pod).iter().filter(|p| p["spec"]["nodeName"].is_string()).count() as u64;

    assert!(report.complete(), "every pod bound through the crashes: {report}");
    assert_eq!((report.overcommit.times, report.overcommit.most), (0, 0), "{report}");
    let mut bound: Vec<String> = api.binds().into_iter().filter(|b| b.status == 201).map(|b| b.pod).collect();
    let binds = bound.len();
    bound.sort();
    bound.dedup();
    assert_eq!(bound.len(), binds, "a pod was bound twice");
    assert!(report.refilled > 0 && report.ended > 0, "the churn preempted and ended pods: {report}");
    assert!(crashes >= 2 && takeovers >= crashes - 1, "{crashes} crashes, {takeovers} takeovers");
    assert!(swaps >= 2, "{swaps} policy swaps");

    // Usage from every replica's events: one run per successful bind, and the runs still going on
    // exactly the pods still bound — none left open by a crash.
    let usage = usage_of(&dir);
    assert_eq!(measured_left(), 0, "the measured pods all ended");
    assert_eq!(
        (usage.total.runs, usage.total.running_at_end),
        (binds as u64, running),
        "runs and runs going on at the end, against the binds and the pods bound now"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The usage report of every replica's events in `dir`, to now.
fn usage_of(dir: &Path) -> wasmsched_usage::Report {
    let mut ledger = wasmsched_usage::Ledger::new();
    let files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    for file in &files {
        wasmsched_usage::journal::read_file(file, &mut ledger).unwrap();
    }
    let now = wasmsched_events::Timestamp::now().millis();
    ledger.report(&wasmsched_usage::Query { to: Some(now), ..Default::default() })
}
