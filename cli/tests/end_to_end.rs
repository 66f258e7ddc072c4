//! The `shardq` binary end to end against real servers.

use shardq_harness::test_shards::TestShards;
use std::process::{Command, Output};

fn shardq(config: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardq"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run shardq")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "shardq failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_enqueue_and_drain_through_the_cli() {
    let shards = TestShards::databases(2).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml("[worker]\nqueues = [\"cli\"]\n")).unwrap();

    let out = shardq(&path, &["worker", "--until-empty"]);
    assert!(!out.status.success(), "an unmigrated shard is refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("shardq migrate"));

    ok(&shardq(&path, &["migrate"]));
    assert!(ok(&shardq(&path, &["migrate"])).contains("up to date"));
    let out = ok(&shardq(
        &path,
        &[
            "enqueue",
            "--queue",
            "cli",
            "--count",
            "500",
            "--payload",
            "{\"n\":1}",
        ],
    ));
    assert!(out.contains("enqueued 500 jobs"), "{out}");

    let out = ok(&shardq(&path, &["worker", "--until-empty", "--json"]));
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["stats"]["succeeded"], 500, "{report}");

    let status: serde_json::Value =
        serde_json::from_str(&ok(&shardq(&path, &["status", "--json"]))).unwrap();
    let succeeded: i64 = status["shards"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["counts"].as_array().unwrap().clone())
        .filter(|c| c["status"] == "succeeded")
        .map(|c| c["count"].as_i64().unwrap())
        .sum();
    assert_eq!(succeeded, 500);
    assert_eq!(status["queues"][0]["counts"]["succeeded"], 500, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_a_non_zero_exit() {
    let shards = TestShards::databases(1).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml("")).unwrap();
    ok(&shardq(&path, &["migrate"]));

    let out = shardq(&path, &["enqueue", "--payload", "{not json"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--payload is not valid JSON"));

    std::fs::write(&path, shards.toml("[dequeue]\nslots_per_shard = 0\n")).unwrap();
    let out = shardq(&path, &["status"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("dequeue.slots_per_shard"));

    // An unreachable shard is reported, not fatal, in status.
    std::fs::write(
        &path,
        "[[shards]]\nname = \"gone\"\nurl = \"postgres://postgres@127.0.0.1:1/shardq\"\n",
    )
    .unwrap();
    let out = ok(&shardq(&path, &["status"]));
    assert!(out.contains("gone") && out.contains("no answer"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_show_cancel_retry_and_status_counts_through_the_cli() {
    let shards = TestShards::databases(2).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml("")).unwrap();
    ok(&shardq(&path, &["migrate"]));
    let out = ok(&shardq(
        &path,
        &["enqueue", "--delay-ms", "600000", "--print-ids"],
    ));
    let id = out.lines().next().unwrap().trim().to_string();

    let show: serde_json::Value =
        serde_json::from_str(&ok(&shardq(&path, &["job", "show", &id]))).unwrap();
    assert_eq!(show["status"], "scheduled");
    let status = ok(&shardq(&path, &["status", "--shards"]));
    assert!(status.contains("delayed"), "{status}");

    assert!(ok(&shardq(&path, &["job", "cancel", &id])).contains("cancelled"));
    let again = shardq(&path, &["job", "cancel", &id]);
    assert!(
        !again.status.success(),
        "a finished job cannot be cancelled"
    );
    assert!(ok(&shardq(&path, &["job", "retry", &id])).contains("queued again"));
    let show: serde_json::Value =
        serde_json::from_str(&ok(&shardq(&path, &["job", "show", &id]))).unwrap();
    assert_eq!(show["status"], "queued");

    let bad = shardq(&path, &["job", "show", "not-an-id"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("SHARDKEY-ID"));
}

/// One HTTP/1.1 GET to `addr`, the whole response as text.
async fn http_get(addr: &str, path: &str, bearer: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_command_refuses_an_open_address_and_serves_with_a_token() {
    use tokio::io::AsyncBufReadExt;
    let shards = TestShards::databases(1).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml("")).unwrap();
    ok(&shardq(&path, &["migrate"]));

    let out = shardq(&path, &["dashboard", "--listen", "0.0.0.0:0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("without authentication") && err.contains("SHARDQ_DASHBOARD_TOKEN"),
        "{err}"
    );

    let token = dir.path().join("token");
    std::fs::write(&token, "cli-t0ken\n").unwrap();
    let mut child = shardq_harness::exe::shardq_command(&path)
        .args(["dashboard", "--listen", "127.0.0.1:0", "--token-file"])
        .arg(&token)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines
        .next_line()
        .await
        .unwrap()
        .expect("the listening line");
    let addr = line
        .strip_prefix("dashboard listening on http://")
        .and_then(|rest| rest.strip_suffix('/'))
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    assert!(http_get(&addr, "/", None).await.starts_with("HTTP/1.1 401"));
    let page = http_get(&addr, "/", Some("cli-t0ken")).await;
    assert!(
        page.starts_with("HTTP/1.1 200") && page.contains("Overview"),
        "{page}"
    );
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_show_prints_the_map_and_unfinished_jobs_per_range() {
    let shards = TestShards::databases(2).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml("")).unwrap();
    ok(&shardq(&path, &["migrate"]));
    ok(&shardq(
        &path,
        &["enqueue", "--queue", "map", "--count", "40"],
    ));

    let text = ok(&shardq(&path, &["shards", "show"]));
    assert!(text.contains("shard map epoch 1 (2 shards)"), "{text}");
    assert!(text.contains("0..32768 → s0"), "{text}");
    assert!(text.contains("32768..65536 → s1"), "{text}");

    let report: serde_json::Value =
        serde_json::from_str(&ok(&shardq(&path, &["shards", "show", "--json"]))).unwrap();
    assert_eq!(report["epoch"], 1, "{report}");
    let ranges = report["ranges"].as_array().unwrap();
    assert_eq!(ranges.len(), 2, "{report}");
    let mut total = 0;
    for (range, shard) in ranges.iter().zip(["s0", "s1"]) {
        assert_eq!(range["shard"], shard, "{report}");
        // Every unfinished job of a range is on the range's own shard.
        for (on, n) in range["unfinished"].as_object().unwrap() {
            assert_eq!(on, shard, "{report}");
            total += n.as_i64().unwrap();
        }
    }
    assert_eq!(total, 40, "every enqueued job counted once: {report}");
}
