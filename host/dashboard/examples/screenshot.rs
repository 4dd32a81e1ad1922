//! Screenshots of each dashboard page, for the docs: `cargo run -p wasmsched-dashboard --example
//! screenshot -- http://127.0.0.1:8080/ docs/dashboard [TAB…]` (Debian's chromium and
//! chromium-driver). Without tabs: the cluster page's time to first render, then the five pages
//! every source has; with tabs (`experiments` under `experiment --serve`): those pages only.

#![allow(clippy::print_stdout)]

use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "http://127.0.0.1:8080/".into());
    let out = std::path::PathBuf::from(args.next().unwrap_or_else(|| "docs/dashboard".into()));
    let tabs: Vec<String> = args.collect();
    std::fs::create_dir_all(&out)?;
    let browser = wasmsched_dashboard::browser::Browser::start().await?;
    let client = &browser.client;
    if !tabs.is_empty() {
        for tab in &tabs {
            client.goto(&format!("{url}#/{tab}")).await?;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let path = out.join(format!("{tab}.png"));
            std::fs::write(&path, client.screenshot().await?)?;
            println!("{}", path.display());
        }
        browser.close().await;
        return Ok(());
    }
    // Time to first render of the cluster page: navigation to every node listed and its rows drawn.
    let mut took = Vec::new();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        client.goto(&format!("{url}#/cluster")).await?;
        loop {
            let total = browser.text_of("#node-count").await?;
            let shown = browser.text_of("#shown-count").await?;
            let rows = client.find_all(wasmsched_dashboard::browser::Locator::Css(".node-row")).await?.len();
            if shown == format!("{total} shown") && rows > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        took.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    took.sort_by(f64::total_cmp);
    println!(
        "cluster page, first render: {:.0} / {:.0} / {:.0} ms (min / median / max of 5)",
        took[0], took[2], took[4]
    );
    for tab in ["cluster", "queues", "pending", "policies", "decisions"] {
        client.goto(&format!("{url}#/{tab}")).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let png = client.screenshot().await?;
        let path = out.join(format!("{tab}.png"));
        std::fs::write(&path, png)?;
        println!("{}", path.display());
    }
    browser.close().await;
    Ok(())
}
