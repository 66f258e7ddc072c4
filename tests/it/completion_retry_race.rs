//! A completion write retried while its first try is still running on the
//! server: what a frozen shard does (`bench scale --disturb freeze`). The
//! worker gave up on the first try at its deadline and sent the write again;
//! when the server resumed, both ran at once: the first wrote the rows, the
//! retry waited for their locks, then found them written. The retry must
//! count them as written by an earlier try (`already`), not as fenced out:
//! the worker counts fenced completions as lost to another claim, so the
//! bench's own count of completed jobs (and the worker's metrics) stayed
//! four short of the jobs done, and the run failed after 600 s.

use crate::common;

use common::TestShards;
use shardq::config::Backoff;
use shardq::job::{Completion, JobId, Outcome};
use shardq::store::jobs::{self, CompleteMany};
use std::time::{Duration, Instant};

const OWNER: &str = "worker-1";
const FENCE: i64 = 7;

/// The completion statement the worker sends, with the values of one job.
const COMPLETE_ONE: &str = "SELECT * FROM shardq_complete_many($1::int[], $2::bigint[], \
    $3::bigint[], ARRAY[$4::text], ARRAY['{\"ok\": true}'::jsonb], $5::text, \
    ARRAY[NULL::text], 1000::float8, 1000::float8)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_completion_that_waited_for_its_first_try_counts_it_as_written() {
    for (status, outcome) in [
        (
            "succeeded",
            Outcome::Succeeded(serde_json::json!({ "ok": true })),
        ),
        ("failed", Outcome::Failed("boom".into())),
    ] {
        let shards = TestShards::databases(1).await;
        let config = shards.config("");
        let set = shards.migrated(&config).await;
        let shard = set.get(0);
        let db = shard.client().await.unwrap();
        // One job, running under OWNER's claim FENCE.
        let row = db
            .query_one(
                "INSERT INTO workflow_status (shard_key, queue, handler, status, owner, fence, \
                     attempts, started_at, lease_expires_at) \
                 VALUES (5, 'q', 'h', 'running', $1, $2, 1, now(), now() + interval '1 hour') \
                 RETURNING id",
                &[&OWNER, &FENCE],
            )
            .await
            .unwrap();
        let id = JobId {
            shard_key: 5,
            id: row.get(0),
        };

        // The first try, held inside its transaction: its row lock is taken.
        let mut first = shard.client().await.unwrap();
        let tx = first.transaction().await.unwrap();
        let first_written = tx
            .query_one(
                COMPLETE_ONE,
                &[
                    &vec![id.shard_key],
                    &vec![id.id],
                    &vec![FENCE],
                    &status,
                    &OWNER,
                ],
            )
            .await
            .unwrap();
        let first_total: i64 = (0..5).map(|i| first_written.get::<_, i64>(i)).sum();
        assert_eq!(first_total, 1, "{status}: the first try writes the row");

        // The retry: the same write, through the library.
        let retry = {
            let set = set.clone();
            let outcome = outcome.clone();
            tokio::spawn(async move {
                let done = [Completion {
                    id,
                    shard: 0,
                    fence: FENCE,
                    key: None,
                    outcome,
                    finished: Instant::now(),
                    credited: true,
                }];
                jobs::complete_many(
                    set.get(0),
                    CompleteMany {
                        owner: OWNER,
                        retry: Backoff {
                            min: Duration::from_secs(1),
                            max: Duration::from_secs(1),
                        },
                        done: &done,
                    },
                )
                .await
            })
        };
        // It waits for the first try's row lock: its snapshot is older than
        // the first try's commit.
        common::wait_until(
            Duration::from_secs(30),
            "the retry waits for the first try's lock",
            || async {
                let waiting: i64 = db
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity \
                         WHERE wait_event_type = 'Lock' AND datname = current_database()",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                waiting > 0
            },
        )
        .await;
        tx.commit().await.unwrap();
        let written = retry.await.unwrap().unwrap();
        assert_eq!(
            written.fenced, 0,
            "{status}: the retry found its own first try, not another claim: {written:?}"
        );
        assert_eq!(written.already, 1, "{status}: {written:?}");
        assert_eq!(written.total(), 1, "{status}: {written:?}");
    }
}
