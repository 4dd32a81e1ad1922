//! Headless Chromium through chromedriver (WebDriver), for tests and screenshots of the pages:
//! Debian's `chromium` and `chromium-driver`, which `.ci/run` installs.

use std::time::{Duration, Instant};

pub use fantoccini::Locator;

/// Why no browser session could be had.
#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    /// chromedriver could not be started.
    #[error("cannot start chromedriver (Debian's chromium-driver): {0}")]
    Driver(std::io::Error),
    /// No session within 20 s.
    #[error("no WebDriver session from chromedriver: {0}")]
    Session(String),
}

/// One headless Chromium session; chromedriver is stopped with it.
pub struct Browser {
    driver: std::process::Child,
    /// The WebDriver client.
    pub client: fantoccini::Client,
}

impl Browser {
    /// Starts chromedriver on a free loopback port and opens a session in a 1400×1000 window.
    pub async fn start() -> Result<Browser, BrowserError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(BrowserError::Driver)?
            .port();
        let mut driver = std::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(BrowserError::Driver)?;
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({"binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--hide-scrollbars", "--window-size=1400,1000"]}),
        );
        let started = Instant::now();
        loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match fantoccini::ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(client) => return Ok(Browser { driver, client }),
                Err(_) if started.elapsed() < Duration::from_secs(20) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    let _ = driver.kill();
                    return Err(BrowserError::Session(e.to_string()));
                }
            }
        }
    }

    /// The text of the first element `css` selects, once there is one (within 20 s).
    pub async fn text_of(&self, css: &str) -> Result<String, fantoccini::error::CmdError> {
        let el = self.client.wait().at_most(Duration::from_secs(20)).for_element(Locator::Css(css)).await?;
        el.text().await
    }

    /// Waits (at most 20 s) until the text of `css` passes `want`; panics with `what` and the
    /// last text otherwise.
    pub async fn eventually(&self, what: &str, css: &str, want: impl Fn(&str) -> bool) {
        let started = Instant::now();
        loop {
            let t = self.text_of(css).await.unwrap_or_else(|e| format!("<{e}>"));
            if want(&t) {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "{what}: {css} shows {t:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks the first element `css` selects.
    pub async fn click(&self, css: &str) -> Result<(), fantoccini::error::CmdError> {
        self.fresh(css, |el| async move { el.click().await }).await
    }

    /// Sends `keys` (e.g. `"\u{E007}"`, Enter) to the first element `css` selects.
    pub async fn send_keys(&self, css: &str, keys: &str) -> Result<(), fantoccini::error::CmdError> {
        self.fresh(css, |el| async move { el.send_keys(keys).await }).await
    }

    /// The texts of every element `css` selects, read from one rendering of the page (read again
    /// when a redraw made them stale midway).
    pub async fn texts(&self, css: &str) -> Result<Vec<String>, fantoccini::error::CmdError> {
        let mut tries = 0;
        'again: loop {
            let mut out = Vec::new();
            for el in self.client.find_all(Locator::Css(css)).await? {
                match el.text().await {
                    Ok(t) => out.push(t),
                    Err(e) if e.is_stale_element_reference() && tries < 5 => {
                        tries += 1;
                        continue 'again;
                    }
                    Err(e) => return Err(e),
                }
            }
            return Ok(out);
        }
    }

    /// Does `act` on the first element `css` selects as the page shows it now. The pages redraw
    /// every second, so an element found just before a redraw is stale when acted on; a person
    /// would act on the one on screen, so it is found again (a few times at most).
    async fn fresh<F, Fut>(&self, css: &str, act: F) -> Result<(), fantoccini::error::CmdError>
    where
        F: Fn(fantoccini::elements::Element) -> Fut,
        Fut: std::future::Future<Output = Result<(), fantoccini::error::CmdError>>,
    {
        let mut tries = 0;
        loop {
            match act(self.client.find(Locator::Css(css)).await?).await {
                Err(e) if e.is_stale_element_reference() && tries < 5 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                done => return done,
            }
        }
    }

    /// Replaces the text of the input `css` selects with `text`, as a person types it.
    pub async fn type_into(&self, css: &str, text: &str) -> Result<(), fantoccini::error::CmdError> {
        let input = self.client.find(Locator::Css(css)).await?;
        input.clear().await?;
        if !text.is_empty() {
            input.send_keys(text).await?;
        }
        Ok(())
    }

    /// Ends the session and chromedriver.
    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A page following the decision stream of the dashboard at `addr` from now on, without a
/// browser: every `decision` event it receives, parsed, in order. It panics on `lagged` or
/// `skipped`, which a test that compares the stream with an event file must not see.
pub async fn follow_decisions(addr: &str) -> std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("the dashboard listens");
    stream.write_all(b"GET /api/v1/events HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("request sent");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let into = seen.clone();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stream).lines();
        let mut kind = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(k) = line.strip_prefix("event: ") {
                kind = k.to_string();
            } else if let Some(data) = line.strip_prefix("data: ") {
                assert_eq!(kind, "decision", "the page was not sent every event: {kind} {data}");
                let event = serde_json::from_str(data).expect("each decision is a JSON event");
                into.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(event);
            }
        }
    });
    seen
}
