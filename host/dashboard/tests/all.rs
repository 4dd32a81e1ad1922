//! The dashboard over real HTTP on loopback (a raw client, so malformed and never-reading clients
//! can be made), and its pages in Debian's headless Chromium through chromedriver (WebDriver).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wasmsched_dashboard::browser::{Browser, Locator};
use wasmsched_dashboard::view::{
    BudgetView, Cluster, DeviceView, DomainView, FaultCount, GpuView, NodeTask, NodeView, PartitionCount, PluginView,
    PolicyView, QueueView, SeriesPoint, SharePoint, StageCalls, WorkloadView,
};
use wasmsched_dashboard::{Publisher, Server, View};

fn node(name: &str, model: &str, used: &[u32]) -> NodeView {
    let rack = if name.starts_with("gpu") { "r1" } else { "r2" };
    NodeView {
        name: name.into(),
        model: model.into(),
        kind: if used.is_empty() { String::new() } else { "nvidia".into() },
        labels: vec![("kubernetes.io/hostname".into(), name.into()), ("rack".into(), rack.into())],
        gpus: used
            .iter()
            .enumerate()
            .map(|(i, u)| GpuView {
                index: i as u32,
                used_milli: *u,
                memory_bytes: 80 << 30,
                numa_node: Some(0),
                health: "Healthy",
            })
            .collect(),
        cpu_milli: 96_000,
        // cpu-d runs nothing: its rack is a whole domain.
        cpu_used_milli: if name == "cpu-d" { 0 } else { 8_000 },
        unschedulable: false,
        // gpu-a runs research's work, gpu-b prod's and research's.
        tasks: match name {
            "gpu-a" => vec![NodeTask { name: "ml/train-0".into(), queue: "research".into() }],
            "gpu-b" => vec![
                NodeTask { name: "web/serve-0".into(), queue: "prod".into() },
                NodeTask { name: "ml/eval-1".into(), queue: "research".into() },
            ],
            _ => vec![],
        },
        // gpu-c's driver publishes it through DRA: a whole GPU and a MIG partition, one held.
        devices: match name {
            "gpu-c" => vec![
                DeviceView {
                    id: "gpu.nvidia.com/gpu-c/gpu-0".into(),
                    model: Some("NVIDIA H100 80GB HBM3".into()),
                    kind: Some("gpu".into()),
                    profile: None,
                    held_by: vec![],
                },
                DeviceView {
                    id: "gpu.nvidia.com/gpu-c/gpu-1-mig-1g.10gb-0".into(),
                    model: Some("NVIDIA H100 80GB HBM3".into()),
                    kind: Some("mig".into()),
                    profile: Some("1g.10gb".into()),
                    held_by: vec!["ml/infer-claim".into()],
                },
            ],
            _ => vec![],
        },
        // gpu-b also has an A100 its device plugin splits into MIG partitions (mixed strategy).
        partitions: match name {
            "gpu-b" => vec![PartitionCount { profile: "1g.10gb".into(), total: 7, used: 2 }],
            _ => vec![],
        },
    }
}

fn lent(mut queues: Vec<QueueView>) -> Vec<QueueView> {
    QueueView::lend(&mut queues);
    queues
}

fn sample() -> View {
    let nodes = vec![
        node("gpu-a", "A100", &[1000, 500, 0, 0]),
        node("gpu-b", "A100", &[0, 0, 0, 0]),
        node("gpu-c", "H100", &[1000; 8]),
        node("cpu-d", "", &[]),
    ];
    View {
        source: "test".into(),
        at_seconds: 42,
        cluster: Cluster::of(&nodes, 7, 1),
        domains: DomainView::of(&nodes, &["rack".to_string()]),
        nodes,
        // What prod lends is what research borrows, within prod's lending limit.
        queues: lent(vec![
            QueueView { name: "all".into(), weight: 1, allocated_gpu_milli: 9_000, ..QueueView::default() },
            QueueView {
                name: "research".into(),
                parent: Some("all".into()),
                weight: 1,
                allocated_gpu_milli: 6_000,
                deserved_gpu_milli: Some(4_000),
                guarantee_gpu_milli: 4_000,
                borrowed_gpu_milli: 2_000,
                served: Some(2),
                allocated_cpu_milli: 48_000,
                deserved_cpu_milli: Some(40_000),
                allocated_memory_bytes: 96 << 30,
                deserved_memory_bytes: Some(64 << 30),
                guarantee_cpu_milli: 32_000,
                capability_cpu_milli: Some(64_000),
                capability_memory_bytes: Some(128 << 30),
                borrowed_cpu_milli: 16_000,
                pending: 4,
                ..QueueView::default()
            },
            QueueView {
                name: "prod".into(),
                parent: Some("all".into()),
                weight: 3,
                allocated_gpu_milli: 3_000,
                deserved_gpu_milli: Some(12_000),
                guarantee_gpu_milli: 8_000,
                capability_gpu_milli: Some(16_000),
                lending_limit_gpu_milli: Some(1_000),
                served: Some(1),
                running: 3,
                ..QueueView::default()
            },
        ]),
        workloads: vec![WorkloadView {
            name: "ml/train".into(),
            queue: "research".into(),
            phase: "Pending".into(),
            members: 4,
            placed: 0,
            min_member: 4,
            reason: Some("gang: 1 of 4 required members fit; <script>alert(1)</script>".into()),
            queue_position: Some(2),
            waiting_seconds: Some(125),
        }],
        policies: Some(PolicyView {
            name: "default".into(),
            version: 3,
            plugins: vec![PluginView {
                name: "fit".into(),
                stages: vec!["Filter".into()],
                digest: "sha256:abc".into(),
                budget: Some(BudgetView { deadline_ms: 10.0, memory_mib: 64, failure: "fail-closed".into() }),
                calls: vec![StageCalls {
                    stage: "Filter".into(),
                    calls: 12_345,
                    faults: vec![FaultCount { kind: "deadline".into(), count: 2 }],
                    mean_us: 41.6,
                    p99_us: 2_097.152,
                }],
            }],
            rollout: None,
        }),
        series: vec![
            SeriesPoint { at: 0.0, allocation_percent: 0.0, fragmentation_percent: Some(0.0) },
            SeriesPoint { at: 1.0, allocation_percent: 50.0, fragmentation_percent: Some(5.0) },
        ],
        series_x: "virtual seconds".into(),
        queue_history: std::sync::Arc::new(
            [(
                "research".to_string(),
                [(0, 2_000, None), (10, 4_000, Some(4_000)), (20, 6_000, Some(4_000))]
                    .map(|(at, allocated_gpu_milli, deserved_gpu_milli)| SharePoint {
                        at,
                        allocated_gpu_milli,
                        deserved_gpu_milli,
                    })
                    .into(),
            )]
            .into(),
        ),
        topologies: std::sync::Arc::new(
            [(
                "gpu-c".to_string(),
                "      GPU0  GPU1\nGPU0     X  NV18\nGPU1  NV18     X\n<b>interconnect: nvlink</b>\n".into(),
            )]
            .into(),
        ),
        experiments: None,
        comparison: None,
    }
}

async fn raw(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await.expect("answered").unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

async fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    let (status, body) = raw(addr, &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

async fn serve() -> (Publisher, Server) {
    let publisher = Publisher::new();
    publisher.publish(sample());
    let server = Server::start("127.0.0.1:0".parse().unwrap(), publisher.clone()).await.unwrap();
    (publisher, server)
}

#[tokio::test]
async fn the_api_answers_from_the_latest_view_with_filters_and_paging() {
    let (publisher, server) = serve().await;
    let addr = server.addr();
    let (s, c) = get(addr, "/api/v1/cluster").await;
    assert_eq!(s, 200);
    assert_eq!((c["cluster"]["nodes"].as_u64(), c["cluster"]["gpus"].as_u64()), (Some(4), Some(16)));
    assert_eq!(c["cluster"]["gpu_milli_used"], 9500);
    // Each rack a domain: r1's three nodes all busy, r2's one idle (whole).
    let domains: Vec<(String, u64, u64, u64, u64)> = c["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let n = |k: &str| d[k].as_u64().unwrap();
            (d["name"].as_str().unwrap().to_string(), n("nodes"), n("idle_nodes"), n("gpus"), n("free_gpu_milli"))
        })
        .collect();
    assert_eq!(domains, [("r1".to_string(), 3, 0, 16, 6500), ("r2".to_string(), 1, 1, 0, 0)]);
    assert_eq!(c["cluster"]["gpus_shared"], 1);
    assert_eq!(c["atSeconds"], 42);
    let (_, all) = get(addr, "/api/v1/nodes").await;
    assert_eq!(all["total"], 4);
    let (_, a100) = get(addr, "/api/v1/nodes?model=A100").await;
    assert_eq!(a100["total"], 2);
    let (_, page) = get(addr, "/api/v1/nodes?model=A100&offset=1&limit=1").await;
    assert_eq!(page["nodes"][0]["name"], "gpu-b");
    let (_, rack) = get(addr, "/api/v1/nodes?label=rack%3Dr1").await;
    assert_eq!(rack["total"], 3, "the GPU nodes are in r1: {rack}");
    let (_, any_rack) = get(addr, "/api/v1/nodes?label=rack").await;
    assert_eq!(any_rack["total"], 4, "a key alone matches any value");
    let (_, research) = get(addr, "/api/v1/nodes?queue=research").await;
    assert_eq!(research["total"], 2, "the nodes running research's work: {research}");
    let (_, prod) = get(addr, "/api/v1/nodes?queue=prod&model=A100").await;
    assert_eq!((prod["total"].as_u64(), prod["nodes"][0]["name"].as_str()), (Some(1), Some("gpu-b")));
    assert_eq!(prod["nodes"][0]["tasks"][1], serde_json::json!({"name": "ml/eval-1", "queue": "research"}));
    let (s, one) = get(addr, "/api/v1/nodes/gpu-c").await;
    assert_eq!((s, one["gpus"].as_array().map(Vec::len)), (200, Some(8)));
    assert_eq!(one["devices"][1]["kind"], "mig");
    assert_eq!(one["devices"][1]["held_by"], serde_json::json!(["ml/infer-claim"]));
    assert!(one["topology"].as_str().is_some_and(|t| t.starts_with("      GPU0  GPU1\nGPU0     X  NV18")), "{one}");
    let (_, other) = get(addr, "/api/v1/nodes/gpu-a").await;
    assert!(other["topology"].is_null(), "no topology published: {other}");
    assert!(all["nodes"][2].get("topology").is_none(), "the list pages stay small: {}", all["nodes"][2]);
    let (s, q) = get(addr, "/api/v1/queues/research").await;
    assert_eq!((s, q["queue"]["weight"].as_u64(), q["history"].as_array().map(Vec::len)), (200, Some(1), Some(3)));
    assert_eq!(q["history"][0], serde_json::json!({"at": 0, "allocated_gpu_milli": 2000, "deserved_gpu_milli": null}));
    let (s, none) = get(addr, "/api/v1/queues/nope").await;
    assert!(s == 404 && none["error"].as_str().unwrap().contains("no queue \"nope\""), "{none}");
    let (_, w) = get(addr, "/api/v1/workloads?queue=research").await;
    assert_eq!(w["workloads"][0]["min_member"], 4);
    let (_, none) = get(addr, "/api/v1/workloads?queue=other").await;
    assert_eq!(none["workloads"], serde_json::json!([]));
    let (_, p) = get(addr, "/api/v1/policies").await;
    assert_eq!(p["policies"]["version"], 3);
    // A scheduler runs no experiment grid: the page hides that tab on `null`.
    let (s, x) = get(addr, "/api/v1/experiments").await;
    assert_eq!((s, x), (200, serde_json::json!({"experiments": null})));
    let (s, x) = get(addr, "/api/v1/comparison").await;
    assert_eq!((s, x), (200, serde_json::json!({"comparison": null})));
    // A new view replaces the old whole.
    let mut next = sample();
    next.nodes.truncate(1);
    next.cluster = Cluster::of(&next.nodes, 0, 0);
    publisher.publish(next);
    let (_, c) = get(addr, "/api/v1/cluster").await;
    assert_eq!(c["cluster"]["nodes"], 1);
}

#[tokio::test]
async fn bad_input_gets_a_clear_error_and_the_server_goes_on() {
    let (_publisher, server) = serve().await;
    let addr = server.addr();
    for (path, status, words) in [
        ("/api/v1/nope", 404, "no such page or API route: /api/v1/nope"),
        ("/etc/passwd", 404, "no such page"),
        ("/api/v1/nodes/ghost", 404, "no node \"ghost\""),
        ("/api/v1/nodes?limit=abc", 400, "bad query"),
        ("/api/v1/nodes?limit=0", 400, "limit must be 1 to 1000"),
        ("/api/v1/nodes?limit=100000", 400, "limit must be 1 to 1000"),
        ("/api/v1/nodes?colour=red", 400, "unknown field"),
        ("/api/v1/workloads?queue=a&queue=b", 400, "bad query"),
        ("/api/v1/nodes?offset=-1", 400, "bad query"),
    ] {
        let (s, body) = get(addr, path).await;
        assert_eq!(s, status, "{path}: {body}");
        let message = body["error"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{path}: {message}");
    }
    // Not HTTP at all: the connection is answered or closed, the server stays up.
    let (s, _) = raw(addr, "HELLO\r\n\r\n").await;
    assert!(s == 0 || s == 400, "{s}");
    assert_eq!(get(addr, "/api/v1/cluster").await.0, 200);
    // Nothing but the API's own fields: no policy component bytes, no configuration (it may hold
    // secrets); budgets and counters only.
    let (_, p) = get(addr, "/api/v1/policies").await;
    let keys: Vec<&String> = p["policies"]["plugins"][0].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["budget", "calls", "digest", "name", "stages"]);
}

#[tokio::test]
async fn events_stream_live_and_a_client_that_never_reads_holds_nothing_back() {
    let (publisher, server) = serve().await;
    let addr = server.addr();
    // A browser that subscribes and then never reads a byte.
    let mut stuck = TcpStream::connect(addr).await.unwrap();
    stuck.write_all(b"GET /api/v1/events HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    // A reading one.
    let mut live = TcpStream::connect(addr).await.unwrap();
    live.write_all(b"GET /api/v1/events HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let started = Instant::now();
    while publisher.watchers() < 2 {
        assert!(started.elapsed() < Duration::from_secs(10), "both subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Far more than the buffer and the socket hold: the source never waits.
    let big = format!("{{\"type\":\"task-scheduled\",\"pad\":\"{}\"}}", "x".repeat(1000));
    for _ in 0..50_000 {
        publisher.event(&big);
    }
    publisher.event("{\"type\":\"task-scheduled\",\"task\":\"ml/last\"}");
    let mut seen = String::new();
    let mut buf = vec![0u8; 1 << 16];
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen.contains("ml/last") {
        assert!(Instant::now() < deadline, "the live client got the last event");
        let n = tokio::time::timeout(Duration::from_secs(20), live.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "stream open");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        if seen.len() > 1 << 20 {
            seen = seen[seen.len() - 4096..].to_string();
        }
    }
    // The API still answers while the stuck client holds its connection.
    assert_eq!(get(addr, "/api/v1/cluster").await.0, 200);
    drop(stuck);
}

/// A scheduler deciding faster than anyone reads: a sink only the dashboard reads wants at most
/// `EVENTS_PER_SECOND` events a second, so no more are built or encoded, and the pages are told
/// how many were left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_decisions_reaches_the_pages_at_a_bounded_rate_the_rest_counted() {
    const BURST: u64 = 3_000;
    let (publisher, server) = serve().await;
    let mut page = TcpStream::connect(server.addr()).await.unwrap();
    page.write_all(b"GET /api/v1/events HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    while publisher.watchers() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let origin = wasmsched_events::Origin { source: "wasmsched/test/scheduler".into(), id_prefix: "r".into() };
    let sink = wasmsched_events::EventSink::tap_only(origin, Default::default(), Arc::new(publisher.clone())).unwrap();
    // As the scheduler does: each event built only if the sink wants it.
    let mut emitted = 0;
    for payload in decisions_of_a_cycle().into_iter().cycle().take(BURST as usize) {
        if sink.wanted() {
            sink.emit(payload);
            emitted += 1;
        }
    }
    let (mut decisions, mut skipped, mut text) = (0u64, 0u64, String::new());
    let mut buf = vec![0u8; 1 << 16];
    let deadline = Instant::now() + Duration::from_secs(20);
    while decisions + skipped < BURST {
        assert!(Instant::now() < deadline, "{decisions} decisions and {skipped} skipped of {BURST}");
        let n = tokio::time::timeout(Duration::from_secs(20), page.read(&mut buf)).await.unwrap().unwrap();
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
        // Whole SSE events only (a blank line ends one).
        while let Some(end) = text.find("\n\n") {
            let event: String = text.drain(..end + 2).collect();
            if event.contains("event: decision") {
                decisions += 1;
            } else if let Some(count) = event.split("data: ").nth(1).filter(|_| event.contains("event: skipped")) {
                skipped += count.trim().parse::<u64>().unwrap();
            }
        }
    }
    // A burst of milliseconds falls in one or two of the budget's tenth-of-a-second windows.
    let tenth = u64::from(wasmsched_dashboard::EVENTS_PER_SECOND) / 10;
    assert!((tenth..=2 * tenth).contains(&decisions), "{decisions} decisions, {skipped} skipped");
    assert_eq!(decisions + skipped, BURST);
    assert_eq!(emitted, decisions, "nothing built that the pages were not sent");
    let stats = sink.close(Duration::from_secs(10));
    assert_eq!((stats.emitted, stats.delivered, stats.lost()), (emitted, emitted, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_render_what_the_api_says_in_a_real_browser() {
    let (publisher, server) = serve().await;
    let url = format!("http://{}/", server.addr());
    let browser = Browser::start().await.expect("headless Chromium (.ci/run installs chromium and chromium-driver)");
    browser.client.goto(&url).await.unwrap();
    let (_, c) = get(server.addr(), "/api/v1/cluster").await;
    let nodes = c["cluster"]["nodes"].to_string();
    let gpus = c["cluster"]["gpus"].to_string();
    browser.eventually("node count", "#node-count", |t| t == nodes).await;
    browser.eventually("GPU count", "#gpu-count", |t| t == gpus).await;
    browser.eventually("allocation", "#allocation", |t| t == "59.4 %").await;
    // Allocation and fragmentation over the source's clock, in the vendored chart.
    browser
        .eventually("the history chart", "#history .u-legend", |t| {
            t.contains("virtual seconds") && t.contains("allocated") && t.contains("fragmented")
        })
        .await;
    browser.eventually("its axis named", "#history-x", |t| t == "virtual seconds").await;
    // The topology domains, a whole one marked; choosing one shows its nodes.
    browser.eventually("the domains", "#domain-rows .domain", |t| t == "rack r1 0 / 3 6.5 / 16").await;
    assert_eq!(
        browser.texts("#domain-rows .domain").await.unwrap(),
        ["rack r1 0 / 3 6.5 / 16", "rack r2 (whole) 1 / 1 0 / 0"]
    );
    browser.click("#domain-rows .domain[data-name='rack=r1']").await.unwrap();
    browser.eventually("the domain's nodes", "#shown-count", |t| t == "3 shown").await;
    browser.click("#domain-rows .domain[data-name='rack=r2']").await.unwrap();
    browser.eventually("the other's", "#shown-count", |t| t == "1 shown").await;
    let clear =
        "const f = document.getElementById('label-filter'); f.value = ''; f.dispatchEvent(new Event('change'));";
    browser.client.execute(clear, vec![]).await.unwrap();
    browser.eventually("back to every node", "#shown-count", |t| t == "4 shown").await;
    // Every node a row, each GPU a cell: 16 GPUs, 2.5 of them used wholly or partly.
    let rows = browser.client.find_all(Locator::Css(".node-row")).await.unwrap();
    assert_eq!(rows.len(), 4);
    let cells = browser.client.find_all(Locator::Css(".node-row .gpus > .gpu:not(.dra)")).await.unwrap();
    assert_eq!(cells.len(), 16);
    // gpu-b's seven MIG partitions, apart from its GPUs.
    assert_eq!(browser.client.find_all(Locator::Css(".node-row .partitions .gpu.mig")).await.unwrap().len(), 7);
    // gpu-c's DRA devices beside its GPUs: the held MIG partition drawn full, the free GPU free.
    assert_eq!(browser.client.find_all(Locator::Css(".node-row .gpu.dra")).await.unwrap().len(), 2);
    assert_eq!(browser.client.find_all(Locator::Css(".node-row .gpu.dra.mig.full")).await.unwrap().len(), 1);
    assert_eq!(browser.client.find_all(Locator::Css(".gpu.part")).await.unwrap().len(), 1);
    // A node's detail on click.
    browser.click(".node-row[data-name='gpu-c']").await.unwrap();
    browser.eventually("node detail", "#node-detail h2", |t| t == "gpu-c").await;
    browser
        .eventually("its topology, as text", "#node-detail pre.topology", |t| {
            t.contains("GPU0     X  NV18") && t.contains("<b>interconnect: nvlink</b>")
        })
        .await;
    browser
        .eventually("its DRA devices and who holds them", "#node-detail .device-list", |t| {
            t == "gpu.nvidia.com/gpu-c/gpu-0 gpu · NVIDIA H100 80GB HBM3: free\n\
                  gpu.nvidia.com/gpu-c/gpu-1-mig-1g.10gb-0 mig · 1g.10gb · NVIDIA H100 80GB HBM3: held by ml/infer-claim"
        })
        .await;
    // What runs on a node, with its queue; and only the nodes running one queue's work.
    browser.click(".node-row[data-name='gpu-b']").await.unwrap();
    browser
        .eventually("the tasks on it", "#node-detail .task-list", |t| t == "web/serve-0 (prod)\nml/eval-1 (research)")
        .await;
    browser.eventually("its MIG partitions", "#node-detail .partition-list", |t| t == "1g.10gb: 2 of 7 in use").await;
    browser.eventually("the cluster's MIG partitions", "#partition-count", |t| t == "1g.10gb 2/7").await;
    let cells =
        browser.client.find_all(Locator::Css(".node-row[data-name='gpu-b'] .partitions .gpu.full")).await.unwrap();
    assert_eq!(cells.len(), 2, "a filled cell per partition in use");
    browser.click("#queue-filter option[value='prod']").await.unwrap();
    browser.eventually("filtered by queue", "#shown-count", |t| t == "1 shown").await;
    browser.click("#queue-filter option[value='']").await.unwrap();
    browser.eventually("filter cleared", "#shown-count", |t| t == "4 shown").await;
    // The pending gang shows its reason, as text (the markup in it is not run).
    // Queues: the leaves in the order fair share serves them, then the inner queue.
    browser.click("#tab-queues").await.unwrap();
    browser.eventually("most underserved first", "#queue-rows .queue td", |t| t == "prod").await;
    let rows = browser.texts("#queue-rows .queue").await.unwrap();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(rows[0].starts_with("prod all 1 3 3 12 8 0 1 (limit 1) 16"), "{rows:?}");
    assert!(
        rows[1].starts_with(
            "research all 2 1 6 4 4 2 0 – 48 / 40 · guaranteed 32 · cap 64 · borrowed 16 96 / 64 · cap 128 4 0"
        ),
        "{rows:?}"
    );
    assert!(rows[2].starts_with("all 1 9 – 0 0 0 –"), "the inner queue last, unserved: {rows:?}");
    // A queue's share over time on click.
    browser.click("#queue-rows .queue[data-name='research']").await.unwrap();
    browser.eventually("queue detail", "#queue-name", |t| t == "research").await;
    browser.eventually("its history", "#queue-span", |t| t == "3 samples over 20 s, up to 6 GPUs").await;
    // Drawn by the vendored chart (its legend names each line; the first entry is the axis).
    browser
        .eventually("allocated and deserved", "#queue-history .u-legend", |t| {
            t.contains("allocated") && t.contains("deserved") && t.contains("seconds")
        })
        .await;
    assert!(browser.client.find(Locator::Css("#queue-history canvas")).await.is_ok(), "drawn on its canvas");
    // And from the keyboard: Enter on a focused row.
    browser.send_keys("#queue-rows .queue[data-name='prod']", "\u{E007}").await.unwrap();
    browser.eventually("queue detail by keyboard", "#queue-name", |t| t == "prod").await;
    // A refresh that changes the rows keeps the keyboard user's place: the focus stays on prod.
    let mut busier = sample();
    busier.queues.iter_mut().find(|q| q.name == "prod").unwrap().running = 4;
    publisher.publish(busier);
    browser.eventually("prod's rows redrawn", "#queue-rows .queue[data-name='prod']", |t| t.ends_with(" 4")).await;
    let focused = browser.client.execute("return document.activeElement.dataset.name ?? null", vec![]).await.unwrap();
    assert_eq!(focused, serde_json::json!("prod"), "the focus survives the redraw");

    browser.click("#tab-pending").await.unwrap();
    browser
        .eventually("pending reason", "#workload-rows .reason", |t| t.contains("gang: 1 of 4 required members fit"))
        .await;
    browser.eventually("pending reason kept as text", "#workload-rows .reason", |t| t.contains("<script>")).await;
    browser.eventually("place in its queue", "#workload-rows .place", |t| t == "2").await;
    browser.eventually("time waiting", "#workload-rows .waiting", |t| t == "2 min 5 s").await;
    // The live set, and a swap appears.
    browser.click("#tab-policies").await.unwrap();
    browser.eventually("policy", "#policy-name", |t| t == "default v3").await;
    browser.eventually("its budget", "#plugin-rows .budget", |t| t == "10 ms CPU · 64 MiB · fail-closed").await;
    browser
        .eventually("calls and latency", "#plugin-rows .calls", |t| {
            t.starts_with("Filter: 12,345 calls · mean 42 µs · p99 2.1 ms")
        })
        .await;
    browser.eventually("its faults, marked", "#plugin-rows .calls .fault", |t| t == "faults: 2 deadline").await;
    assert!(!browser.client.find(Locator::Css("#rollout")).await.unwrap().is_displayed().await.unwrap(), "no registry");
    // A swap to v4, on probation, with v5 in shadow: the rollout as `policy status --json` has it.
    let mut swapped = sample();
    let policies = swapped.policies.as_mut().unwrap();
    policies.version = 4;
    policies.rollout = Some(serde_json::json!({
        "live": "default@4", "live_origin": "file:/etc/policies", "on_probation": true, "last_good": "default@3",
        "live_window": {"decisions": 2000, "fault_rate": 0.0, "unschedulable_rate": 0.125, "p99_ms": 1.5},
        "candidate": "default@5",
        "shadow": {"compared": 840, "identical_share": 0.9712, "fault_rate": 0.0, "mean_score_delta": 3.25, "seconds": 61.4,
                   "recent_differences": [
                       {"task": {"id": "ml/pod-9", "namespace": "ml", "queue": "research"}, "live": "gpu-a", "shadow": "gpu-c",
                        "live_score": 71, "shadow_score": 64},
                       {"task": {"id": "ml/<i>x</i>", "namespace": "ml", "queue": "research"}, "live": "gpu-b", "shadow": null,
                        "live_score": 50, "shadow_score": null}]},
        "source_errors": [],
        "history": [
            {"label": "default@5", "origin": "file:/etc/policies", "outcome": "shadow", "reason": "gates passed", "at": 1.7e9},
            {"label": "default@4", "origin": "file:/etc/policies", "outcome": "probation", "reason": "promoted <b>by hand</b>", "at": 1.7e9 - 60.0}
        ]
    }));
    publisher.publish(swapped);
    browser.eventually("policy swapped", "#policy-name", |t| t == "default v4").await;
    browser
        .eventually("probation and the live window", "#rollout-state", |t| {
            t == "default@4: on probation; rollback restores default@3; last window: 2,000 decisions, 0 % faulted, 12.5 % unschedulable, p99 1.50 ms"
        })
        .await;
    browser
        .eventually("the candidate in shadow", "#rollout-candidate", |t| {
            t == "Candidate default@5 in shadow for 61 s: 840 decisions compared, 97.1 % on the same node, 0 % faulted, mean score difference 3.3"
        })
        .await;
    browser.eventually("history, newest first", "#history-rows .outcome", |t| t == "shadow").await;
    browser
        .eventually("the candidate's different decisions", "#shadow-rows", |t| {
            t == "ml/pod-9 gpu-a (71) gpu-c (64)\nml/<i>x</i> gpu-b (50) unschedulable"
        })
        .await;
    let history = browser.client.find(Locator::Css("#history-rows")).await.unwrap().text().await.unwrap();
    assert!(history.contains("promoted <b>by hand</b>") && history.contains("2023-11-14 22:13:20"), "{history}");
    // Decisions as they happen, read from an event sink's outbox as a JSONL file or JetStream
    // would get them, and filtered by kind, node, queue and task.
    browser.click("#tab-decisions").await.unwrap();
    browser.eventually("stream live", "#event-status", |t| t == "live").await;
    let origin = wasmsched_events::Origin { source: "wasmsched/test/scheduler".into(), id_prefix: "t".into() };
    let sink = wasmsched_events::EventSink::tap_only(origin, Default::default(), Arc::new(publisher.clone())).unwrap();
    for payload in decisions_of_a_cycle() {
        sink.emit(payload);
    }
    browser.eventually("every event shown", "#event-count", |t| t == "4").await;
    let rows = browser.text_of("#event-rows").await.unwrap();
    assert!(
        rows.contains(
            "task-scheduled ml/pod-7 gpu-b research GPUs 0×1, 1×0.5; score 81 of 3 feasible nodes; default@3"
        ),
        "{rows}"
    );
    assert!(
        rows.contains("task-unschedulable ml/<b>big</b> research filter: not enough GPUs (2 nodes) — attempt 2"),
        "{rows}"
    );
    assert!(rows.contains("task-preempted ml/low gpu-a batch priority for ml/<b>big</b>; checkpoint done"), "{rows}");
    assert!(rows.contains("queue-share-changed prod prod deserved 19 → 18 CPU cores; allocated 16 GPUs"), "{rows}");
    browser.click("#event-kind option[value='task-preempted']").await.unwrap();
    browser.eventually("by kind", "#event-count", |t| t == "1").await;
    browser.click("#event-kind option[value='']").await.unwrap();
    browser.type_into("#event-node", "gpu-b").await.unwrap();
    browser.eventually("by node", "#event-rows .task", |t| t == "ml/pod-7").await;
    browser.type_into("#event-node", "").await.unwrap();
    browser.type_into("#event-queue", "research").await.unwrap();
    browser.eventually("by queue", "#event-count", |t| t == "2").await;
    browser.type_into("#event-task", "big").await.unwrap();
    browser.eventually("by task", "#event-rows .kind", |t| t == "task-unschedulable").await;
    assert_eq!(sink.stats().delivered, 4, "the outbox counts what the page was handed");
    // A link names the view.
    browser.client.goto(&format!("{url}#/pending")).await.unwrap();
    browser.eventually("linked view", "#workload-rows", |t| t.contains("ml/train")).await;
    browser.eventually("the header on any tab", "#source", |t| t == "test · t=42s").await;
    let hidden = browser.client.find(Locator::Css("#cluster")).await.unwrap().attr("hidden").await.unwrap();
    assert!(hidden.is_some(), "only the linked view is shown");
    let grid_tab = browser.client.find(Locator::Css("#tab-experiments")).await.unwrap().attr("hidden").await.unwrap();
    assert!(grid_tab.is_some(), "no Experiments tab where no grid runs");
    let compare_tab = browser.client.find(Locator::Css("#tab-compare")).await.unwrap().attr("hidden").await.unwrap();
    assert!(compare_tab.is_some(), "no Compare tab where nothing is compared");
    browser.close().await;
}

/// A cycle's events as the scheduler emits them: a placement, a gang that does not fit (its
/// member's name carrying markup), the victim it preempts, and a share that moved.
fn decisions_of_a_cycle() -> Vec<wasmsched_events::Payload> {
    use wasmsched_events::schema::*;
    let task = |id: &str, queue: &str| TaskRef {
        id: id.into(),
        namespace: "ml".into(),
        queue: queue.into(),
        ..Default::default()
    };
    let set = PolicySetRef { name: "default".into(), version: 3 };
    vec![
        Payload::TaskScheduled(TaskScheduled {
            task: task("ml/pod-7", "research"),
            node: "gpu-b".into(),
            gpus: vec![GpuShare { gpu: 0, milli: 1000 }, GpuShare { gpu: 1, milli: 500 }],
            score: ScoreSummary { total: 81, feasible: 3, evaluated: 4 },
            policy_set: set.clone(),
            attempt: 1,
            ..Default::default()
        }),
        Payload::TaskUnschedulable(TaskUnschedulable {
            task: task("ml/<b>big</b>", "research"),
            reasons: vec![StageReason { stage: Stage::Filter, reason: "not enough GPUs".into(), nodes: 2 }],
            policy_set: set,
            attempt: 2,
        }),
        Payload::TaskPreempted(TaskPreempted {
            victim: task("ml/low", "batch"),
            node: "gpu-a".into(),
            preemptor: task("ml/<b>big</b>", "research"),
            reason: PreemptReason::Priority,
            checkpoint: CheckpointOutcome::Done,
            grace_seconds: 600,
            reclaim: None,
        }),
        // Fair share moved prod's CPU, not its GPUs.
        Payload::QueueShareChanged(QueueShareChanged {
            queue: "prod".into(),
            deserved: Quantity { cpu_milli: 18_000, memory_bytes: 0, gpu_milli: 18_667 },
            previous: Quantity { cpu_milli: 19_000, memory_bytes: 0, gpu_milli: 18_667 },
            allocated: Quantity { cpu_milli: 14_000, memory_bytes: 0, gpu_milli: 16_000 },
        }),
    ]
}
