//! `simulate --serve` and `replay --serve`: the dashboard over a replay of the embedded openb
//! trace and over a time-driven scenario with queues, gangs and a rollout, read through its API
//! and in Debian's headless Chromium; the process ends cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmsched_dashboard::browser::{Browser, Locator};

async fn get(addr: &str, path: &str) -> Value {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    serde_json::from_str(body).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_serves_the_replay_and_its_pages_show_what_the_api_says() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(["simulate", "--serve", "127.0.0.1:0", "--pace", "0", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The address it chose, on stderr; the placed count, on stdout.
    let addr = address_of(&mut child);
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let child = Served(child);
    let (placed_tx, placed_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("placed ") {
                let n: u64 = rest.split(',').next().and_then(|n| n.parse().ok()).unwrap_or(0);
                let _ = placed_tx.send(n);
            }
        }
    });
    let placed = placed_rx.recv_timeout(Duration::from_secs(180)).expect("the replay's summary on stdout");
    let cluster = finished_view(&addr, Duration::from_secs(30)).await;
    // The API agrees with the replay: openb's 1,213 nodes and 6,212 GPUs, every pod it placed.
    assert_eq!((cluster["cluster"]["nodes"].as_u64(), cluster["cluster"]["gpus"].as_u64()), (Some(1213), Some(6212)));
    assert_eq!(cluster["cluster"]["placed"].as_u64(), Some(placed));
    let mut gpus = 0;
    for offset in (0..1213).step_by(1000) {
        let page = get(&addr, &format!("/api/v1/nodes?offset={offset}&limit=1000")).await;
        gpus += page["nodes"].as_array().unwrap().iter().map(|n| n["gpus"].as_array().unwrap().len()).sum::<usize>();
    }
    assert_eq!(gpus, 6212);
    let series = cluster["series"].as_array().unwrap();
    assert!(series.len() > 100, "allocation by arrived percent, 0–130");
    // The pages show the same.
    let browser = Browser::start().await.expect("headless Chromium (.ci/run installs chromium and chromium-driver)");
    browser.client.goto(&format!("http://{addr}/")).await.unwrap();
    browser.eventually("nodes", "#node-count", |t| t == "1213").await;
    browser.eventually("GPUs", "#gpu-count", |t| t == "6212").await;
    browser.eventually("placed", "#placed-count", |t| t == placed.to_string()).await;
    browser.eventually("all rows listed", "#shown-count", |t| t == "1213 shown").await;
    let rows = browser.client.find_all(Locator::Css(".node-row")).await.unwrap();
    assert!(!rows.is_empty() && rows.len() < 100, "only the rows in view are drawn: {}", rows.len());
    browser.click("#tab-pending").await.unwrap();
    browser.eventually("unplaced pods and why", "#workload-rows .reason", |t| t.contains("nodes available")).await;
    browser.click("#tab-policies").await.unwrap();
    browser.eventually("the policy set", "#plugin-rows", |t| t.contains("resource-fit") && t.contains("fgd")).await;
    browser.close().await;
    // SIGTERM ends it, cleanly.
    stop_serving(child);
}

/// Ends a command serving the dashboard with SIGTERM, as a service manager would: it exits 0.
/// The cluster view once the replay served on `addr` has finished, waiting at most `within`.
async fn finished_view(addr: &str, within: Duration) -> Value {
    let started = Instant::now();
    loop {
        let c = get(addr, "/api/v1/cluster").await;
        if c["source"].as_str().is_some_and(|s| s.ends_with("replay finished")) {
            return c;
        }
        assert!(started.elapsed() < within, "the final view: {c}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A serving command, killed if a test fails before [`stop_serving`] (no process outlives it).
struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// SIGTERM ends a serving command, cleanly.
fn stop_serving(mut served: Served) {
    let child = &mut served.0;
    assert!(Command::new("kill").arg(child.id().to_string()).status().unwrap().success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// `wasmsched ARGS --serve 127.0.0.1:0 --quiet` in the repository's root, and the address it serves on.
fn serving(args: &[&str]) -> (Served, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(args)
        .args(["--serve", "127.0.0.1:0", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = address_of(&mut child);
    (Served(child), addr)
}

/// The dashboard's address, printed on stderr by a command started with `--serve 127.0.0.1:0`.
fn address_of(child: &mut std::process::Child) -> String {
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("dashboard: http://").and_then(|u| u.split('/').next()) {
                let _ = tx.send(url.to_string());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60)).expect("the dashboard's address on stderr")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_serves_a_scenario_in_virtual_time_with_its_queues_waiting_gangs_and_a_rollout() {
    let dir = tempfile::tempdir().unwrap();
    let set =
        Command::new(env!("CARGO_BIN_EXE_wasmsched")).args(["policy", "builtin", "most-allocated"]).output().unwrap();
    assert!(set.status.success());
    std::fs::write(dir.path().join("policy.yaml"), &set.stdout).unwrap();
    let rollout = format!("300={}", dir.path().join("policy.yaml").display());
    // 1,520 virtual seconds at 400 per second: at least 3.8 s.
    let started = Instant::now();
    let scenario = "examples/scenarios/queues-gangs-preemption.yaml";
    let file = dir.path().join("events.jsonl");
    let (child, addr) = serving(&[
        "replay",
        "--scenario",
        scenario,
        "--rollout",
        &rollout,
        "--speed",
        "400",
        "--events",
        file.to_str().unwrap(),
    ]);
    let page = wasmsched_dashboard::browser::follow_decisions(&addr).await;
    // Followed once the server counts the page (its first view is there before it listens).
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Mid-replay views: the virtual clock moves, and the page follows it.
    let mut clocks = Vec::new();
    let finished = loop {
        let c = get(&addr, "/api/v1/cluster").await;
        if c["source"].as_str().is_some_and(|s| s.ends_with("replay finished")) {
            break c;
        }
        if let Some(at) = c["atSeconds"].as_u64() {
            clocks.push(at);
        }
        assert!(started.elapsed() < Duration::from_secs(120), "the final view: {c}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(started.elapsed() >= Duration::from_millis(3800), "paced: {:?}", started.elapsed());
    let between: Vec<u64> = clocks.iter().copied().filter(|&t| t > 0 && t < 1520).collect();
    assert!(between.len() >= 5 && between.windows(2).all(|w| w[0] <= w[1]), "a clock that moves: {clocks:?}");
    // The last job ends at 1520; the clock runs on while the gang that never fits times out and
    // is submitted again, until nothing has changed for twice the longest timeout.
    assert!(finished["atSeconds"].as_u64().is_some_and(|t| t >= 1520), "{finished}");
    assert_eq!((finished["cluster"]["nodes"].as_u64(), finished["cluster"]["gpus"].as_u64()), (Some(2), Some(8)));
    // FGD's fragmentation over virtual time, for the scenario's job shapes (4 and 2 GPUs): its
    // jobs fill nodes whole or pair up, so no idle GPU is ever left that a shape could not use.
    let series = finished["series"].as_array().unwrap();
    let fragmented: Vec<f64> = series.iter().map(|p| p["fragmentation_percent"].as_f64().unwrap()).collect();
    assert!(series.len() > 5 && fragmented.iter().all(|&f| f == 0.0), "{fragmented:?}");
    // The queue tree with its quotas, fair shares and order of service.
    let queues = get(&addr, "/api/v1/queues").await;
    let queues = queues["queues"].as_array().unwrap();
    let names: Vec<&str> = queues.iter().map(|q| q["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["org", "prod", "batch"]);
    let batch = &queues[2];
    assert_eq!((batch["parent"].as_str(), batch["capability_gpu_milli"].as_u64()), (Some("org"), Some(8000)));
    assert!(queues.iter().any(|q| q["deserved_gpu_milli"].as_u64().is_some()), "fair share answered: {queues:?}");
    // The gang that can never fit its queue's quota waits (timed out, or submitted again after its
    // timeout), saying why.
    let workloads = get(&addr, "/api/v1/workloads").await;
    let too_big = workloads["workloads"].as_array().unwrap().iter().find(|w| w["name"] == "too-big").cloned();
    let too_big = too_big.unwrap_or_else(|| panic!("{workloads}"));
    assert!(matches!(too_big["phase"].as_str(), Some("TimedOut" | "Pending")), "{too_big}");
    assert_eq!(too_big["members"].as_u64(), Some(3));
    assert!(too_big["reason"].as_str().unwrap().contains("queue batch at capability"), "{too_big}");
    // The rollout at 300 s: the set live at the end is the one rolled out, version 2.
    let policies = get(&addr, "/api/v1/policies").await;
    assert_eq!(
        (policies["policies"]["name"].as_str(), policies["policies"]["version"].as_u64()),
        (Some("most-allocated"), Some(2))
    );
    // The pages show the same.
    let browser = Browser::start().await.expect("headless Chromium (.ci/run installs chromium and chromium-driver)");
    browser.client.goto(&format!("http://{addr}/")).await.unwrap();
    browser.eventually("nodes", "#node-count", |t| t == "2").await;
    browser.click("#tab-queues").await.unwrap();
    browser.eventually("the queue tree", "#queue-rows", |t| t.contains("prod") && t.contains("batch")).await;
    browser.click("#tab-pending").await.unwrap();
    browser
        .eventually("the timed-out gang", "#workload-rows", |t| t.contains("too-big") && t.contains("capability"))
        .await;
    browser.click("#tab-policies").await.unwrap();
    browser.eventually("the rolled-out set", "#policy-name", |t| t == "most-allocated v2").await;
    browser.close().await;
    stop_serving(child);
    // The decision stream is the event file's outbox: from the moment the page connected, every
    // event the file got, in its order, stamped in virtual time.
    let written: Vec<Value> =
        std::fs::read_to_string(&file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let seen = page.lock().unwrap().clone();
    assert!(seen.len() > 20, "{} of {} events streamed", seen.len(), written.len());
    assert_eq!(seen[..], written[written.len() - seen.len()..], "the stream is the file's tail");
    let kinds: std::collections::BTreeSet<&str> = seen.iter().filter_map(|e| e["type"].as_str()).collect();
    for kind in ["task.scheduled", "task.ended", "group.timed-out", "policy.swapped", "queue.share-changed"] {
        assert!(kinds.contains(format!("io.wasmsched.{kind}.v1").as_str()), "{kind} in {kinds:?}");
    }
    assert!(seen.iter().all(|e| e["time"].as_str().is_some_and(|t| t.starts_with("1970-01-01"))), "virtual time");
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_plots_the_fragmentation_a_small_job_leaves_for_the_popular_shape() {
    // One 4-GPU node; two of the three jobs want all four GPUs, so FGD's target workload is
    // 2/3 the 4-GPU shape and 1/3 the 1-GPU one. While the small job runs (0–100 s) its node's
    // three idle GPUs are fragmented for the 4-GPU shape: 2/3 of 3 of 4 GPUs = 50 %.
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("small-then-big.yaml");
    let job = |name: &str, arrival: u32, gpus: u32| {
        format!(
            "  - {{name: {name}, queue: q, arrival: {arrival}, duration: 10, cpu_milli: 1000, gpus: {gpus}, gpu_milli: 1000}}\n"
        )
    };
    let text = format!(
        "nodes:\n  - {{name: n0, cpu_milli: 64000, memory_mib: 65536, gpus: 4, model: A100}}\nqueues:\n  - name: q\njobs:\n{}{}{}",
        job("small", 0, 1).replace("duration: 10", "duration: 100"),
        job("big-1", 150, 4),
        job("big-2", 170, 4)
    );
    std::fs::write(&scenario, text).unwrap();
    let (child, addr) = serving(&["replay", "--scenario", scenario.to_str().unwrap(), "--speed", "200"]);
    let finished = finished_view(&addr, Duration::from_secs(60)).await;
    stop_serving(child);
    let points: Vec<(f64, f64, f64)> = finished["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let f = p["fragmentation_percent"].as_f64().expect("measured");
            (p["at"].as_f64().unwrap(), p["allocation_percent"].as_f64().unwrap(), f)
        })
        .collect();
    let while_small = points.iter().find(|p| p.0 < 100.0 && p.1 == 25.0).unwrap_or_else(|| panic!("{points:?}"));
    assert!((while_small.2 - 50.0).abs() < 1e-9, "{points:?}");
    // A big job on the node leaves nothing idle; after the last one, nothing is fragmented.
    assert!(points.iter().filter(|p| p.1 == 100.0).all(|p| p.2 == 0.0), "{points:?}");
    assert_eq!(points.last().map(|p| (p.1, p.2)), Some((0.0, 0.0)), "{points:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn experiment_serves_its_progress_then_its_table_and_curves() {
    let out = tempfile::tempdir().unwrap();
    let grid = ["experiment", "--native", "--traces", "default", "--policies", "best-fit,fgd", "--seeds", "42,43"];
    let (child, addr) = serving(&[&grid[..], &["--jobs", "2", "--out", out.path().to_str().unwrap()]].concat());
    let started = Instant::now();
    let grid = loop {
        let x = get(&addr, "/api/v1/experiments").await;
        let x = &x["experiments"];
        assert_eq!(x["total"].as_u64(), Some(4), "{x}");
        if !x["rows"].as_array().unwrap().is_empty() {
            break x.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(300), "the grid's end: {x}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(grid["done"].as_u64(), Some(4));
    // The API's table is the one the command wrote (`table.csv`: mean at 130 %, two decimals there).
    let table = std::fs::read_to_string(out.path().join("table.csv")).unwrap();
    let rows = grid["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        let policy = row["policy"].as_str().unwrap();
        let line = table.lines().find(|l| l.starts_with(&format!("default,{policy},"))).unwrap();
        let written: f64 = line.split(',').nth(5).unwrap().parse().unwrap();
        let served = row["at_130"][0].as_f64().unwrap();
        assert!((served - written).abs() < 0.01, "{policy}: {served} vs {written}");
        let curve = row["allocation"].as_array().unwrap();
        assert_eq!(curve.len(), 131, "one point per arrived percent, 0–130");
        assert!(curve[130].as_f64().is_some_and(|v| (v - served).abs() < 1e-9));
    }
    // The page opens on the grid: a row per trace, a column per policy, the best in bold, a line
    // per policy.
    let browser = Browser::start().await.expect("headless Chromium (.ci/run installs chromium and chromium-driver)");
    browser.client.goto(&format!("http://{addr}/")).await.unwrap();
    browser.eventually("the grid", "#experiment-progress", |t| t.contains("1 traces × 2 policies × 2 seeds")).await;
    browser.eventually("the table", "#experiment-rows", |t| t.starts_with("default") && t.contains("±")).await;
    let best = browser.text_of("#experiment-rows td.best").await.unwrap();
    let fgd = rows.iter().find(|r| r["policy"] == "fgd").unwrap()["at_130"][0].as_f64().unwrap();
    let best_fit = rows.iter().find(|r| r["policy"] == "best-fit").unwrap()["at_130"][0].as_f64().unwrap();
    let shown: f64 = best.split(' ').next().unwrap().parse().unwrap();
    assert!((shown - fgd.max(best_fit)).abs() <= 0.005 + 1e-9, "{best}: fgd {fgd}, best-fit {best_fit}");
    // A line per policy in the vendored chart: its legend names the axis, then each policy.
    browser
        .eventually("a line per policy", "#experiment-chart .u-legend", |t| t.contains("best-fit") && t.contains("fgd"))
        .await;
    let lines = browser.client.find_all(Locator::Css("#experiment-chart .u-legend .u-series")).await.unwrap();
    assert_eq!(lines.len(), 3, "the axis and two policies");
    browser.eventually("what runs", "#source", |t| t.starts_with("experiment: 1 traces × 2 policies × 2 seeds")).await;
    browser.eventually("the axes", "#experiment-axes", |t| t.contains("capacity arrived (%, 80–130)")).await;
    browser.close().await;
    stop_serving(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_shows_the_dra_devices_a_claim_holds_while_its_job_runs() {
    let (child, addr) = serving(&["replay", "--scenario", "examples/scenarios/dra.yaml", "--native", "--speed", "100"]);
    // `finetune` holds four A100s of one PCIe root of a DGX from t=0 to t=600 (6 s at this speed).
    let started = Instant::now();
    let held = loop {
        let page = get(&addr, "/api/v1/nodes").await;
        let held: Vec<(String, String, Vec<Value>)> = page["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|n| {
                n["devices"].as_array().unwrap().iter().filter(|d| d["held_by"] != serde_json::json!([])).map(|d| {
                    (
                        n["name"].as_str().unwrap().to_string(),
                        d["id"].as_str().unwrap().to_string(),
                        d["held_by"].as_array().unwrap().clone(),
                    )
                })
            })
            .collect();
        if !held.is_empty() {
            break held;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no device held: {page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(held.len(), 4, "{held:?}");
    assert!(
        held.iter().all(|(node, _, by)| node.starts_with("dgx-a100") && by == &[serde_json::json!("finetune")]),
        "{held:?}"
    );
    let page = get(&addr, "/api/v1/nodes").await;
    let devices: usize = page["nodes"].as_array().unwrap().iter().map(|n| n["devices"].as_array().unwrap().len()).sum();
    assert_eq!(devices, 20, "two DGX A100s of 8 and an H100 node of 4, as examples/dra/cluster.yaml publishes");
    // Once the replay is over every run has ended: every device free again.
    finished_view(&addr, Duration::from_secs(60).saturating_sub(started.elapsed())).await;
    let page = get(&addr, "/api/v1/nodes").await;
    let still: Vec<&Value> = page["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["devices"].as_array().unwrap())
        .filter(|d| d["held_by"] != serde_json::json!([]))
        .collect();
    assert!(still.is_empty(), "{still:?}");
    stop_serving(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comparison_serves_both_replays_side_by_side_and_its_result_is_the_printed_one() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = "examples/scenarios/topology.json";
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(["replay", "--native", "--quiet", "--json", "--scenario", scenario, "--policy", "gpu-topology"])
        .args(["--compare", "best-fit", "--serve", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = address_of(&mut child);
    let mut stdout = child.stdout.take().unwrap();
    let child = Served(child);
    // The printed comparison (stdout closes only when the process ends: read until the JSON parses).
    let (printed_tx, printed_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut stdout, &mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            if let Ok(v) = serde_json::from_slice::<Value>(&out) {
                let _ = printed_tx.send(v);
            }
        }
    });
    let printed = printed_rx.recv_timeout(Duration::from_secs(120)).expect("the comparison on stdout");
    let started = Instant::now();
    let x = loop {
        let x = get(&addr, "/api/v1/comparison").await["comparison"].clone();
        if !x["result"].is_null() {
            break x;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the final comparison: {x}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The served comparison is the printed one, with each side's curve beside it.
    assert_eq!(x["result"], printed);
    assert_eq!(x["jobs"], printed["jobs"]);
    // Each side's curve is the allocation its own replay reports, instant by instant.
    for (i, policy) in ["gpu-topology", "best-fit"].into_iter().enumerate() {
        let side = &x["sides"][i];
        assert_eq!((side["set"].as_str(), side["finished"].as_bool()), (Some(policy), Some(true)));
        let out = dir.path().join(policy);
        let o = Command::new(env!("CARGO_BIN_EXE_wasmsched"))
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .args(["replay", "--native", "--quiet", "--json", "--scenario", scenario, "--policy", policy])
            .args(["--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let report: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(side["at_seconds"], report["horizon_seconds"], "{policy}");
        assert_eq!(side["arrived"], report["jobs"], "{policy}: every job arrived");
        // The replay's own utilisation, as each instant finally left it.
        let csv = std::fs::read_to_string(out.join("utilisation.csv")).unwrap();
        let mut reported: Vec<(u64, f64)> = Vec::new();
        for line in csv.lines().skip(1) {
            let (t, p) = line.split_once(',').unwrap();
            let row = (t.parse().unwrap(), p.parse().unwrap());
            match reported.last_mut() {
                Some(last) if last.0 == row.0 => *last = row,
                _ => reported.push(row),
            }
        }
        let series: Vec<(u64, f64)> = side["series"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["at"].as_f64().unwrap() as u64, p["allocation_percent"].as_f64().unwrap()))
            .collect();
        assert!(series.len() > 2, "{policy}: {series:?}");
        // Every point shown is the replay's; every change the replay saw is shown.
        for (at, shown) in &series {
            let own = reported.iter().find(|r| r.0 == *at).unwrap_or_else(|| panic!("{policy}: no instant {at}"));
            assert!((shown - own.1).abs() < 1e-6, "{policy} at {at}: {shown} vs {}", own.1);
        }
        for pair in reported.windows(2).filter(|w| (w[0].1 - w[1].1).abs() > 1e-6) {
            assert!(series.iter().any(|p| p.0 == pair[1].0), "{policy}: the change at {} is not shown", pair[1].0);
        }
    }
    // The page opens on the comparison: the figures side by side, a line per set, what differs.
    let browser = Browser::start().await.expect("headless Chromium (.ci/run installs chromium and chromium-driver)");
    browser.client.goto(&format!("http://{addr}/")).await.unwrap();
    browser
        .eventually("what ran", "#compare-progress", |t| t.contains("replayed with A = gpu-topology and B = best-fit"))
        .await;
    let started = |i: usize| printed["figures"][0][["a", "b"][i]].as_f64().unwrap();
    browser
        .eventually("the figures", "#compare-figures tr:first-child", |t| {
            t.starts_with("jobs started")
                && t.contains(&format!("{}", started(0)))
                && t.contains(&format!("{}", started(1)))
        })
        .await;
    browser
        .eventually("a line per set", "#compare-chart .u-legend", |t| {
            t.contains("A: gpu-topology") && t.contains("B: best-fit")
        })
        .await;
    let lines = browser.client.find_all(Locator::Css("#compare-chart .u-legend .u-series")).await.unwrap();
    assert_eq!(lines.len(), 3, "the axis and two sets");
    let differ = printed["placements_differ"].as_u64().unwrap();
    browser
        .eventually("how many differ", "#compare-placements", |t| t.starts_with(&format!("Placements: {differ} of ")))
        .await;
    let rows = browser.client.find_all(Locator::Css("#compare-differing tr.difference")).await.unwrap();
    assert_eq!(rows.len(), printed["differing"].as_array().unwrap().len());
    assert!(!rows.is_empty());
    browser.close().await;
    stop_serving(child);
}
