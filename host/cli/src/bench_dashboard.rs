//! `bench --dashboard-clients N`: what a dashboard with N pages open costs the scheduling thread.
//! Each repetition runs the same pods with the dashboard live and without, in alternating order;
//! live means what `run --dashboard` does — the loop hands the pods' shape counts and a
//! copy-on-write snapshot of the node table to a builder thread every second of scheduling (which
//! measures fragmentation and publishes the view; the second is counted across the live runs, each
//! far shorter than it) — plus every decision's
//! event, emitted into an event sink whose only reader is the dashboard (as `run --dashboard`
//! without `--events` does; its drainer encodes them for the pages), while N clients do what an
//! open page does: poll the cluster and every node page, and follow the event stream.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;
use wasmsched_api::fragmentation::{self, TypicalPod};
use wasmsched_core::{NodeTable, PolicySet};
use wasmsched_dashboard::view::{Cluster, NodeView, SeriesPoint, TARGET_POPULARITY_PERCENT, TARGET_SHAPES};
use wasmsched_dashboard::{Publisher, Server, View};

use crate::bench::{Publish, Scenario, run_with};

/// How often the live side snapshots the table for the view: the scheduler's interval.
const VIEW_EVERY: Duration = Duration::from_secs(1);

/// The dashboard's cost for one runtime.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct DashboardCost {
    pub runtime: &'static str,
    pub clients: usize,
    /// Pods/s with the dashboard live over pods/s without, over all runs (the views fall in some
    /// live runs, as they fall once a second in a scheduler's).
    pub on_over_off: f64,
    /// The same per pair of runs.
    pub pair_min: f64,
    pub pair_max: f64,
    /// Share of the live runs' time spent handing snapshots to the builder on the scheduling
    /// thread, percent (emitting the events is inside the runs and the ratio): the rest of any
    /// difference is the events, the sink's drainer, the server and the builder competing for
    /// this machine's cores.
    pub on_thread_percent: f64,
    /// Views published and API answers given during the live runs.
    pub views: u64,
    pub answers: u64,
}

/// An HTTP/1.1 GET, its body (the test of a page's requests, not of the client).
async fn get(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// One open page: the cluster and every node page every 2 s (the page's refresh), and the
/// event stream read as it comes.
async fn page(addr: std::net::SocketAddr, answers: std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::spawn(async move {
        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else { return };
        let _ = s.write_all(b"GET /api/v1/events HTTP/1.1\r\nHost: bench\r\n\r\n").await;
        let mut buf = vec![0u8; 1 << 16];
        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
    });
    loop {
        if get(addr, "/api/v1/cluster").await.is_some() {
            answers.fetch_add(1, Ordering::Relaxed);
        }
        let mut offset = 0;
        while let Some(body) = get(addr, &format!("/api/v1/nodes?offset={offset}&limit=1000")).await {
            answers.fetch_add(1, Ordering::Relaxed);
            // Only what paging needs is read: a browser parses the rows on its own machine, and
            // building them here would bill the scheduler's machine for the page's work.
            #[derive(serde::Deserialize, Default)]
            struct Page {
                total: u64,
                nodes: Vec<serde::de::IgnoredAny>,
            }
            let v: Page = serde_json::from_str(&body).unwrap_or_default();
            let (total, got) = (v.total, v.nodes.len() as u64);
            offset += got;
            if got == 0 || offset >= total {
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Measures `set` on `s` with and without a live dashboard of `clients` open pages.
pub(crate) fn measure(
    set: &PolicySet,
    s: &Scenario,
    runtime: &'static str,
    repeat: usize,
    clients: usize,
) -> anyhow::Result<DashboardCost> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let publisher = Publisher::new();
    let server = rt.block_on(Server::start("127.0.0.1:0".parse()?, publisher.clone()))?;
    let answers = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    for _ in 0..clients {
        rt.spawn(page(server.addr(), answers.clone()));
    }
    // The builder: snapshots in, views out, off the scheduling thread.
    let (tx, rx) = mpsc::sync_channel::<(NodeTable, Vec<TypicalPod>)>(1);
    let builder_publisher = publisher.clone();
    let builder = std::thread::spawn(move || {
        let mut views = 0u64;
        for (table, typical) in rx {
            let mut nodes: Vec<NodeView> = table.slots().filter_map(|s| table.get(s)).map(NodeView::from).collect();
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
            let cluster = Cluster::of(&nodes, 0, 0);
            let fragmented = fragmentation::of_cluster(&typical, table.slots().filter_map(|s| table.get(s)));
            let series = vec![SeriesPoint {
                at: 0.0,
                allocation_percent: 100.0 * cluster.gpu_milli_used as f64 / cluster.gpu_milli_total.max(1) as f64,
                fragmentation_percent: Some(100.0 * fragmented.fragmented / cluster.gpu_milli_total.max(1) as f64),
            }];
            builder_publisher.publish(View { source: "bench".into(), cluster, nodes, series, ..View::default() });
            views += 1;
        }
        views
    });
    // Pages connected before anything is measured.
    let started = Instant::now();
    while publisher.watchers() < clients && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let origin = wasmsched_events::Origin { source: "wasmsched/bench/scheduler".into(), id_prefix: "b".into() };
    let sink =
        wasmsched_events::EventSink::tap_only(origin, Default::default(), std::sync::Arc::new(publisher.clone()))?;
    let mut shapes: std::collections::BTreeMap<fragmentation::Spec, u64> = Default::default();
    for pod in &s.pods {
        *shapes.entry(fragmentation::Spec::of(pod)).or_default() += 1;
    }
    let mut ratios = Vec::with_capacity(repeat);
    let (mut in_tap, mut live_seconds, mut off_seconds) = (Duration::ZERO, 0.0f64, 0.0f64);
    // Scheduling time since the last view, carried from one live run to the next: a run (~0.2 s
    // natively) is far shorter than the interval, and a view in every run published them five
    // times as often as a scheduler does. The first live run starts with one.
    let mut since_view = VIEW_EVERY;
    for r in 0..repeat {
        let mut off = || {
            let rate = run_with(set, s, None, Publish::Never, runtime, &mut |_, _, _| {}).0.pods_per_second;
            off_seconds += s.pods.len() as f64 / rate.max(1e-9);
            rate
        };
        let mut on = || {
            let started = Instant::now();
            let carried = since_view;
            let mut last: Option<Instant> = None;
            let mut spent = Duration::ZERO;
            let mut tap = |table: &NodeTable, _: &wasmsched_api::Task, _: bool| {
                let t0 = Instant::now();
                let due = match last {
                    Some(at) => at.elapsed() >= VIEW_EVERY,
                    None => carried + started.elapsed() >= VIEW_EVERY,
                };
                if due {
                    last = Some(Instant::now());
                    // FGD's target workload from the pods' shapes, counted as they arrived (as
                    // `run --dashboard` keeps them).
                    let typical =
                        fragmentation::typical_of_counts(shapes.clone(), TARGET_POPULARITY_PERCENT, TARGET_SHAPES);
                    // Never waits: a builder still busy with the last snapshot skips this one.
                    let _ = tx.try_send((table.snapshot(), typical));
                }
                spent += t0.elapsed();
            };
            let m = run_with(set, s, Some(&sink), Publish::Always, runtime, &mut tap).0;
            since_view = last.map_or(carried + started.elapsed(), |at| at.elapsed());
            in_tap += spent;
            live_seconds += s.pods.len() as f64 / m.pods_per_second.max(1e-9);
            m.pods_per_second
        };
        let (a, b) = if r % 2 == 0 {
            let a = off();
            (a, on())
        } else {
            let b = on();
            (off(), b)
        };
        ratios.push(b / a);
    }
    drop(tx);
    let views = builder.join().unwrap_or(0);
    server.stop();
    let answers = answers.load(std::sync::atomic::Ordering::Relaxed);
    rt.shutdown_timeout(Duration::from_secs(1));
    let mut sorted = ratios.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(DashboardCost {
        runtime,
        clients,
        on_over_off: off_seconds / live_seconds.max(1e-9),
        pair_min: sorted[0],
        pair_max: sorted[sorted.len() - 1],
        on_thread_percent: 100.0 * in_tap.as_secs_f64() / live_seconds.max(1e-9),
        views,
        answers,
    })
}
