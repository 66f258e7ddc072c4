//! A handler runs inside a `job` span that carries its job id, queue, shard
//! and attempt, so whatever it logs says which job it was about.

use crate::common;

use common::TestShards;
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use std::io::Write;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// Everything the subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_handler_logs_carries_its_job_id_queue_shard_and_attempt() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();

    let shards = TestShards::databases(2).await;
    let config = shards.config("[worker]\nqueues = [\"spans\"]\nretry_backoff_min_ms = 10\nretry_backoff_max_ms = 20\nmaintenance_interval_ms = 100\n");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let id = client
        .enqueue(NewJob::new("spans", "flaky", serde_json::json!({})).max_attempts(2))
        .await
        .unwrap();

    let mut handlers = HandlerRegistry::with_builtins();
    handlers.register("flaky", |ctx| async move {
        tracing::info!("handler says hello");
        if ctx.attempt == 1 {
            return Err("first attempt fails".into());
        }
        Ok(serde_json::Value::Null)
    });
    let report = Worker::new(config, set.clone(), handlers)
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    assert_eq!(report.stats.succeeded, 1);

    let shard = &set.get(shardq::router::shard_index(id.shard_key, 2)).name;
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    for attempt in [1, 2] {
        let span =
            format!("job{{id={id} queue=spans shard={shard} attempt={attempt} handler=flaky}}");
        assert!(
            text.lines()
                .any(|l| l.contains(&span) && l.contains("handler says hello")),
            "no line with {span} in:\n{text}"
        );
    }
}
