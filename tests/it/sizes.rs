//! Field sizes are checked before anything is written: an oversized queue,
//! handler, ordering key or deduplication id in an `enqueue_many` that spans
//! every shard is refused whole, naming the field and its limit, and no
//! shard gets any of the batch (the database would refuse the oversized row
//! only after the other shards' parts were committed). Fields at their
//! limits fit the database's indexes.

use crate::common;

use common::TestShards;
use shardq::job::{MAX_DEDUP_ID_BYTES, MAX_HANDLER_BYTES, MAX_ORDERING_KEY_BYTES, MAX_QUEUE_BYTES};
use shardq::{router, Client, ClientError, InvalidJob, NewJob};

const SHARDS: usize = 4;

/// `len` bytes of text that does not compress (PostgreSQL compresses long
/// index entries, so a repeated character would fit where real data does not).
fn incompressible(len: usize, seed: u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ALPHABET[(state >> 33) as usize % ALPHABET.len()] as char
        })
        .collect()
}

/// Keyed jobs, ten on each shard, so a partial write would show.
fn spread() -> Vec<NewJob> {
    let mut per_shard = [0; SHARDS];
    (0..)
        .map(|i| format!("k-{i}"))
        .filter(|key| {
            let shard = router::shard_index(router::shard_key_for(key), SHARDS);
            per_shard[shard] += 1;
            per_shard[shard] <= 10
        })
        .take(10 * SHARDS)
        .map(|key| NewJob::new("q", "noop", serde_json::json!({})).ordering_key(key))
        .collect()
}

/// Jobs on all shards, any status.
async fn rows(set: &shardq::ShardSet) -> i64 {
    let mut total = 0;
    for shard in set.all() {
        let db = shard.client().await.unwrap();
        let row = db
            .query_one("SELECT count(*) FROM workflow_status", &[])
            .await
            .unwrap();
        total += row.get::<_, i64>(0);
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_field_refuses_the_whole_batch_on_every_shard() {
    let shards = TestShards::databases(SHARDS).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let big = |max: usize| incompressible(8_000.max(max + 1), max as u64);
    let base = || NewJob::new("q", "noop", serde_json::json!({}));
    let cases = [
        (
            NewJob::new(big(MAX_QUEUE_BYTES), "noop", serde_json::json!({})),
            "queue",
            MAX_QUEUE_BYTES,
        ),
        (
            NewJob::new("q", big(MAX_HANDLER_BYTES), serde_json::json!({})),
            "handler",
            MAX_HANDLER_BYTES,
        ),
        (
            base().ordering_key(big(MAX_ORDERING_KEY_BYTES)),
            "ordering key",
            MAX_ORDERING_KEY_BYTES,
        ),
        (
            base().dedup(big(MAX_DEDUP_ID_BYTES), shardq::OnDuplicate::Error),
            "deduplication id",
            MAX_DEDUP_ID_BYTES,
        ),
    ];
    for (bad, field, max) in cases {
        let mut batch = spread();
        let index = batch.len();
        batch.push(bad.clone());
        match client.enqueue_many(batch).await {
            Err(ClientError::Invalid {
                index: i,
                reason:
                    InvalidJob::TooLong {
                        field: f,
                        size,
                        max: m,
                    },
            }) => {
                assert_eq!((i, f, m), (index, field, max));
                assert!(size > max, "{size}");
                let text = ClientError::Invalid {
                    index: i,
                    reason: InvalidJob::TooLong {
                        field: f,
                        size,
                        max: m,
                    },
                }
                .to_string();
                assert!(
                    text.contains(field) && text.contains(&max.to_string()),
                    "{text}"
                );
            }
            other => panic!("{field}: expected a size rejection, got {other:?}"),
        }
        assert_eq!(rows(&set).await, 0, "{field}: nothing written on any shard");
        // The one-job paths refuse it the same way.
        assert!(
            matches!(
                client.enqueue(bad.clone()).await,
                Err(ClientError::Invalid { .. })
            ),
            "{field}: enqueue"
        );
        if bad.dedup_id.is_none() {
            assert!(
                matches!(client.route(bad), Err(ClientError::Invalid { .. })),
                "{field}: transactional route"
            );
        }
    }
    assert_eq!(rows(&set).await, 0, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_at_their_limits_are_written() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let queue = incompressible(MAX_QUEUE_BYTES, 1);
    let handler = incompressible(MAX_HANDLER_BYTES, 2);
    let keyed = NewJob::new(&queue, &handler, serde_json::json!({}))
        .ordering_key(incompressible(MAX_ORDERING_KEY_BYTES, 3));
    let deduplicated = NewJob::new(&queue, &handler, serde_json::json!({})).dedup(
        incompressible(MAX_DEDUP_ID_BYTES, 4),
        shardq::OnDuplicate::Error,
    );
    let ids = client
        .enqueue_many(vec![keyed, deduplicated])
        .await
        .expect("fields at their limits fit the indexes");
    assert_eq!(ids.len(), 2);
    assert_eq!(rows(&set).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_refuses_an_oversized_key_naming_it_and_writes_nothing() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml("")).unwrap();
    let key = incompressible(MAX_ORDERING_KEY_BYTES + 1, 5);
    let out = std::process::Command::new(shardq_harness::exe::shardq())
        .arg("--config")
        .arg(&path)
        .args(["enqueue", "--count", "3", "--key", &key])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run shardq");
    assert!(!out.status.success(), "an oversized key is refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "ordering key is {} bytes, over the limit of {MAX_ORDERING_KEY_BYTES} bytes",
        key.len()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert_eq!(rows(&set).await, 0, "nothing written");
}
