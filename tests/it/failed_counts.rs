//! The overview's dead, failed and cancelled counts (`sql::FAILED_COUNTS`):
//! each queue and state counted up to a cap, from
//! `workflow_status_failed_queue` alone, so that the read stays short
//! however many such jobs retention keeps (ten million took 1.7 s of the
//! dashboard's 2 s per shard when every one was counted).

use crate::common;

use shardq::client::{ListState, OverviewOptions};
use shardq::store::sql;
use shardq::Client;
use tokio_postgres::types::Type;

/// `count` jobs of `queue` in `state` (`dead` or `cancelled`), finished.
fn finished(queue: &str, state: &str, count: i64) -> String {
    format!(
        "INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at) \
         SELECT 7, '{queue}', 'noop', '{state}', 1, now() FROM generate_series(1, {count});"
    )
}

/// Ten queues, each with its own number of dead and cancelled jobs, at a
/// cap of 5: every queue and state is found (the skip from one pair to
/// the next misses none), counted exactly up to the cap (5 itself is not
/// "more"), and past it shown as the cap and marked as at least that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_queue_and_state_is_counted_up_to_the_cap_and_marked_past_it() {
    let (shards, set) = crate::ready_floors::shard().await;
    let db = set.get(0).client().await.unwrap();
    let mut fill = String::new();
    for n in 0..10i64 {
        fill += &finished(&format!("q{n}"), "dead", n + 1);
        if n > 0 {
            fill += &finished(&format!("q{n}"), "cancelled", n);
        }
    }
    db.batch_execute(&(fill + "ANALYZE workflow_status;"))
        .await
        .unwrap();
    let client = Client::from_shards(set.clone(), shards.config("").limits.clone());
    let options = OverviewOptions {
        failed_count_cap: 5,
        // Counts, not speed: room for a loaded host.
        deadline: std::time::Duration::from_secs(10),
        ..OverviewOptions::default()
    };
    let page = client.overview(&options).await.remove(0);
    assert!(page.error.is_none(), "{:?}", page.error);
    assert_eq!(page.queues.len(), 10, "every queue is found");
    for n in 0..10i64 {
        let q = page
            .queues
            .iter()
            .find(|q| q.queue == format!("q{n}"))
            .unwrap_or_else(|| panic!("q{n}"));
        for (state, jobs) in [(ListState::Dead, n + 1), (ListState::Cancelled, n)] {
            assert_eq!(q.count(state), jobs.min(5), "q{n} {state:?}");
            assert_eq!(
                q.at_least.contains(state.as_str()),
                jobs > 5,
                "q{n} {state:?}: {:?}",
                q.at_least
            );
        }
    }
}

/// 20,000 dead jobs in one queue and 3 cancelled in another: counting up
/// to 101 (a cap of 100 and one more) the read meets at most a few entries
/// past that per pair of the index, where counting every job (the read
/// before the cap) meets all 20,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capped_count_reads_about_the_cap_however_many_jobs_are_kept() {
    let (_shards, set) = crate::ready_floors::shard().await;
    let mut object = set.get(0).client().await.unwrap();
    let db: &mut tokio_postgres::Client = &mut object;
    db.batch_execute(&format!(
        "{}{}",
        finished("big", "dead", 20_000),
        finished("small", "cancelled", 3)
    ))
    .await
    .unwrap();
    // As autovacuum leaves it: the visibility map set (index-only scans).
    db.batch_execute("VACUUM ANALYZE workflow_status")
        .await
        .unwrap();
    let index = ["workflow_status_failed_queue"];
    let limit = 101i64;
    let tx = db.transaction().await.unwrap();
    let before = common::xact_stat(&tx, "tuples_returned", &index).await;
    let rows = tx
        .query_typed(sql::FAILED_COUNTS, &[(&limit, Type::INT8)])
        .await
        .unwrap();
    let capped_met = common::xact_stat(&tx, "tuples_returned", &index).await - before;
    let counts: Vec<(String, String, i64)> = rows
        .iter()
        .map(|r| (r.get("queue"), r.get("state"), r.get("count")))
        .collect();
    assert_eq!(
        counts,
        vec![
            ("big".to_string(), "dead".to_string(), limit),
            ("small".to_string(), "cancelled".to_string(), 3),
        ]
    );
    let before = common::xact_stat(&tx, "tuples_returned", &index).await;
    let all: i64 = tx
        .query_one(
            "SELECT count(*) FROM workflow_status \
             WHERE status IN ('dead', 'failed', 'cancelled') AND queue = 'big'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let all_met = common::xact_stat(&tx, "tuples_returned", &index).await - before;
    tx.rollback().await.unwrap();
    assert_eq!(all, 20_000);
    assert!(
        all_met >= 20_000,
        "counting every job met {all_met} entries (the measure works)"
    );
    assert!(
        capped_met <= 2 * (limit + 1) + 3,
        "the capped count met {capped_met} entries for two pairs counted up to {limit}"
    );
}
