//! `simulate --serve`: the dashboard over a replay of the embedded openb trace, read through its
//! API and in Debian's headless Chromium; the process ends cleanly on SIGTERM.

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
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("dashboard: http://").and_then(|u| u.split('/').next()) {
                let _ = tx.send(url.to_string());
            }
        }
    });
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (placed_tx, placed_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("placed ") {
                let n: u64 = rest.split(',').next().and_then(|n| n.parse().ok()).unwrap_or(0);
                let _ = placed_tx.send(n);
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).expect("the dashboard's address on stderr");
    let placed = placed_rx.recv_timeout(Duration::from_secs(180)).expect("the replay's summary on stdout");
    let started = Instant::now();
    let cluster = loop {
        let c = get(&addr, "/api/v1/cluster").await;
        if c["source"].as_str().is_some_and(|s| s.ends_with("replay finished")) {
            break c;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the final view: {c}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
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
    assert!(Command::new("kill").arg(child.id().to_string()).status().unwrap().success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}
