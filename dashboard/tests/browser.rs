//! The dashboard in a real browser: headless Chromium driven through
//! chromedriver (WebDriver), against a dashboard over two real shards.
//! Loads the overview and checks each shard's counts, opens a dead job,
//! retries it through the confirmation page, runs a worker, and sees the
//! job succeed on the page. With `SHARDQ_DASHBOARD_SCREENSHOT=FILE` it
//! saves the overview as a PNG (docs/dashboard.png is made this way).
//!
//! Needs `chromium` and `chromium-driver` (Debian packages; `.ci/run`
//! installs them). Without them the test fails and says so: it is never
//! skipped silently.

mod common;

use common::{loopback, serve, Handlers, Shards};
use fantoccini::{Client as Browser, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const CHROMIUM: &[&str] = &[
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/usr/bin/google-chrome",
];
const CHROMEDRIVER: &[&str] = &["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"];

fn first_present(candidates: &[&str]) -> Option<PathBuf> {
    candidates.iter().map(PathBuf::from).find(|p| p.exists())
}

/// chromedriver on a free port, killed on drop.
struct Driver {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start_driver(driver: &Path) -> Driver {
    let port = free_port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "chromedriver did not listen on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Driver {
        child,
        port,
        _profile: tempfile::tempdir().unwrap(),
    }
}

async fn open_browser(driver: &Driver, chromium: &Path) -> Browser {
    let profile = format!("--user-data-dir={}", driver._profile.path().display());
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
        profile.as_str(),
    ];
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({ "binary": chromium.display().to_string(), "args": args }),
    );
    ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a chromium session through chromedriver")
}

/// The element at `css`, waiting for it (a click's navigation may still be
/// under way).
async fn find(browser: &Browser, css: &str) -> fantoccini::elements::Element {
    browser
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no element {css}: {e}"))
}

async fn text_of(browser: &Browser, css: &str) -> String {
    browser
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no element {css}: {e}"))
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_the_counts_retries_a_dead_job_and_sees_it_succeed() {
    let (Some(chromium), Some(driver)) = (first_present(CHROMIUM), first_present(CHROMEDRIVER))
    else {
        panic!(
            "this test drives headless Chromium and needs it installed: \
             apt-get install -y chromium chromium-driver (looked for {CHROMIUM:?} and {CHROMEDRIVER:?})"
        );
    };
    let shards = Shards::start(2).await;
    let handlers = Handlers::new();
    let (fixture, worker, stop_worker) =
        common::jobs_in_every_state(&shards, &handlers, true).await;
    let (addr, _stop) = serve(shards.client.clone(), loopback()).await;
    let driver = start_driver(&driver).await;
    let browser = open_browser(&driver, &chromium).await;

    browser.goto(&format!("http://{addr}/")).await.unwrap();
    let expected = shards.counts().await;
    let states = [
        "ready",
        "scheduled",
        "running",
        "retrying",
        "dead",
        "cancelled",
    ];
    let want = |s: usize, queue: &str, state: &str| {
        expected[s]
            .get(&(queue.to_string(), state.to_string()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(
        text_of(&browser, "#shards-up").await,
        format!(
            "{n} of {n} shards answered (each shard).",
            n = expected.len()
        )
    );
    // One row per queue, summed over the shards.
    for state in states {
        for queue in ["dash", "idle"] {
            let total: i64 = (0..expected.len()).map(|s| want(s, queue, state)).sum();
            let css = format!("#queues td[data-queue=\"{queue}\"][data-state=\"{state}\"]");
            assert_eq!(
                text_of(&browser, &css).await,
                total.to_string(),
                "{queue} {state}"
            );
        }
    }
    // Each queue's page: its row on each shard.
    for queue in ["dash", "idle"] {
        browser.goto(&format!("http://{addr}/")).await.unwrap();
        find(
            &browser,
            &format!("#queues tr[data-queue=\"{queue}\"] td a"),
        )
        .await
        .click()
        .await
        .unwrap();
        for s in 0..expected.len() {
            for state in states {
                let css = format!(
                    "td[data-shard=\"s{s}\"][data-queue=\"{queue}\"][data-state=\"{state}\"]"
                );
                assert_eq!(
                    text_of(&browser, &css).await,
                    want(s, queue, state).to_string(),
                    "s{s} {queue} {state}"
                );
            }
        }
    }
    browser.goto(&format!("http://{addr}/")).await.unwrap();
    // The running worker shows, once per shard, from its heartbeats; a later
    // beat carries its counters (each shard wrote outcomes).
    let started = Instant::now();
    loop {
        let workers = browser
            .find_all(Locator::Css("#workers tr[data-worker]"))
            .await
            .unwrap();
        assert_eq!(workers.len(), 2);
        let mut completed = Vec::new();
        for s in 0..2 {
            let css = format!("#workers tr[data-shard=\"s{s}\"] td.completed");
            completed.push(text_of(&browser, &css).await.parse::<u64>().unwrap());
        }
        if completed.iter().all(|&n| n > 0) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no heartbeat brought the worker's counters: {completed:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        browser.refresh().await.unwrap();
    }
    if let Ok(path) = std::env::var("SHARDQ_DASHBOARD_SCREENSHOT") {
        let png = browser.screenshot().await.unwrap();
        std::fs::write(&path, png).expect("write the screenshot");
    }
    handlers.release.add_permits(1);
    stop_worker.cancel();
    worker.await.unwrap();

    // The queue's page -> shard 0's dead jobs -> the dead job -> retry -> confirm.
    browser
        .goto(&format!("http://{addr}/queues/dash"))
        .await
        .unwrap();
    find(
        &browser,
        "td[data-shard=\"s0\"][data-queue=\"dash\"][data-state=\"dead\"] a",
    )
    .await
    .click()
    .await
    .unwrap();
    let id = fixture.dead_on_0.to_string();
    find(&browser, &format!("tr.job[data-id=\"{id}\"] a"))
        .await
        .click()
        .await
        .unwrap();
    assert_eq!(text_of(&browser, "#status").await, "dead");
    assert!(text_of(&browser, "#error")
        .await
        .contains("failed on purpose"));
    find(&browser, "#action-retry").await.click().await.unwrap();
    find(&browser, "#confirm").await.click().await.unwrap();
    assert!(text_of(&browser, "#done").await.starts_with("Retried"));
    assert_eq!(text_of(&browser, "#status").await, "queued");
    assert_eq!(shards.status_of(fixture.dead_on_0).await, "queued");

    // A worker whose flaky handler works now runs it.
    handlers.failing.store(false, Ordering::SeqCst);
    let (worker, stop_worker) = common::start_worker(&shards, handlers.registry());
    let started = Instant::now();
    loop {
        browser.refresh().await.unwrap();
        if text_of(&browser, "#status").await == "succeeded" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the retried job did not succeed on the page"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(text_of(&browser, "#output").await.contains("fine now"));
    stop_worker.cancel();
    worker.await.unwrap();
    browser.close().await.unwrap();
}

/// Sixteen shards and a seventeenth that never answers, three queues, in
/// Chromium: the overview comes within its deadline, shows each queue once
/// with its totals and the frozen shard as unreachable; a queue's name
/// opens its page with a row per shard that holds its jobs; the shards
/// page lists all seventeen, the frozen one first, and each of the others
/// with its claim time once a worker claims there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_sixteen_shards_an_operator_reads_each_queue_once_and_opens_one() {
    const SHARDS: usize = 16;
    let (Some(chromium), Some(driver)) = (first_present(CHROMIUM), first_present(CHROMEDRIVER))
    else {
        panic!("this test drives headless Chromium: apt-get install -y chromium chromium-driver");
    };
    let shards = Shards::start(SHARDS).await;
    let mut jobs: Vec<shardq::NewJob> = (0..160)
        .map(|_| shardq::NewJob::new("emails", "ok", serde_json::json!({})))
        .collect();
    jobs.extend((0..48).map(|_| {
        shardq::NewJob::new("reports", "ok", serde_json::json!({})).delay(Duration::from_secs(3600))
    }));
    jobs.extend((0..32).map(|i| {
        shardq::NewJob::new("billing", "ok", serde_json::json!({})).group(format!("t{i}"))
    }));
    shards.client.enqueue_many(jobs).await.unwrap();
    // A seventeenth shard that accepts connections and never answers.
    let frozen = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut urls = shards.urls.clone();
    urls.push(format!(
        "postgres://postgres@127.0.0.1:{}/shardq",
        frozen.local_addr().unwrap().port()
    ));
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = frozen.accept().await {
            held.push(socket);
        }
    });
    let config = shardq::Config::from_toml(&common::toml(&urls, "")).unwrap();
    let mut options = loopback();
    options.trend_interval = Duration::from_secs(1);
    options.shard_deadline = Duration::from_secs(8);
    let (addr, _stop) = serve(shardq::Client::new(&config).unwrap(), options).await;
    let driver = start_driver(&driver).await;
    let browser = open_browser(&driver, &chromium).await;

    let asked = Instant::now();
    browser.goto(&format!("http://{addr}/")).await.unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(15),
        "the overview waited {:?} on the frozen shard (its deadline is 8 s)",
        asked.elapsed()
    );
    assert_eq!(
        text_of(&browser, "#shards-up").await,
        format!("{SHARDS} of {} shards answered (each shard).", SHARDS + 1)
    );
    find(
        &browser,
        &format!("#shards tr[data-shard=\"s{SHARDS}\"] td[data-state=\"unreachable\"]"),
    )
    .await;
    // The limits are on every shard: those that answered tell them.
    let source = browser.source().await.unwrap();
    assert!(source.contains("No queue is limited"), "{source}");
    let rows = browser
        .find_all(Locator::Css("#queues tr[data-queue]"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 3, "one row per queue");
    for (queue, state, want) in [
        ("emails", "ready", 160),
        ("reports", "scheduled", 48),
        ("billing", "ready", 32),
    ] {
        let css = format!("#queues td[data-queue=\"{queue}\"][data-state=\"{state}\"]");
        assert_eq!(text_of(&browser, &css).await, want.to_string(), "{queue}");
    }
    if let Ok(path) = std::env::var("SHARDQ_DASHBOARD_SCREENSHOT_16") {
        let png = browser.screenshot().await.unwrap();
        std::fs::write(&path, png).expect("write the screenshot");
    }
    find(&browser, "#queues tr[data-queue=\"emails\"] td a")
        .await
        .click()
        .await
        .unwrap();
    find(&browser, "#queue-shards").await;
    let holding = shards
        .counts()
        .await
        .iter()
        .filter(|c| c.keys().any(|(q, _)| q == "emails"))
        .count();
    let per_shard = browser
        .find_all(Locator::Css("#queue-shards tr[data-shard]"))
        .await
        .unwrap();
    assert_eq!(per_shard.len(), holding, "a row per shard with emails jobs");
    assert!(text_of(&browser, "#unanswered")
        .await
        .contains(&format!("s{SHARDS}")));
    browser
        .goto(&format!("http://{addr}/shards"))
        .await
        .unwrap();
    let listed = browser
        .find_all(Locator::Css("#shard-rows tr[data-shard]"))
        .await
        .unwrap();
    assert_eq!(listed.len(), SHARDS + 1);
    assert_eq!(
        listed[0].attr("data-shard").await.unwrap().as_deref(),
        Some(format!("s{SHARDS}").as_str()),
        "the frozen shard on top"
    );

    // A worker claims on every shard; its heartbeats bring each shard's
    // claim time to the page (two beats, 5 s apart, after the first sample).
    let (worker, stop_worker) = common::start_worker(&shards, Handlers::new().registry());
    let started = Instant::now();
    loop {
        browser.refresh().await.unwrap();
        let timed = browser
            .find_all(Locator::Css("#shard-rows td.claim-time[data-us]"))
            .await
            .unwrap();
        if timed.len() == SHARDS {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the claim time of every shard: {} of {SHARDS}",
            timed.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if let Ok(path) = std::env::var("SHARDQ_DASHBOARD_SCREENSHOT_SHARDS") {
        let png = browser.screenshot().await.unwrap();
        std::fs::write(&path, png).expect("write the screenshot");
    }
    stop_worker.cancel();
    worker.await.unwrap();
    browser.close().await.unwrap();
}
