//! The job-state check's read under a share of the check's deadline: its
//! windows of ready jobs from each index's start ([`sql::CHECK_JOB_STATE`])
//! walk, while a long transaction holds the horizon, the dead entry of
//! every job claimed since; past the share the read is made again from
//! the floors alone ([`sql::CHECK_JOB_STATE_FROM_FLOORS`], `capped`), so
//! that the check of every other invariant still answers.

use super::check::{finding, Finding, Invariant};
use super::sql::{self, Param};
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::Transaction;

/// The share of the check's deadline the full read may take (1 / this).
pub(super) const BUDGET_SHARE: u32 = 2;

/// The job-state finding, read inside `tx` (the check's snapshot, whose
/// statement timeout is `deadline`) with `params`.
pub(super) async fn read(
    tx: &mut Transaction<'_>,
    params: &[Param<'_>],
    deadline: Duration,
) -> Result<Finding, tokio_postgres::Error> {
    let reads = [sql::CHECK_JOB_STATE, sql::CHECK_JOB_STATE_FROM_FLOORS];
    read_with(tx, reads, params, deadline).await
}

/// [`read`] with its two reads: `full` within its share of `deadline`,
/// else `fallback`.
async fn read_with(
    tx: &mut Transaction<'_>,
    [full, fallback]: [&str; 2],
    params: &[Param<'_>],
    deadline: Duration,
) -> Result<Finding, tokio_postgres::Error> {
    let ms = |d: Duration| d.as_millis().max(1).to_string();
    let (budget_ms, deadline_ms) = (ms(deadline / BUDGET_SHARE), ms(deadline));
    let savepoint = tx.savepoint("job_state").await?;
    savepoint
        .query_typed(sql::CHECK_TIMEOUT, &[(&budget_ms, Type::TEXT)])
        .await?;
    match savepoint.query_typed_one(full, params).await {
        Ok(row) => {
            savepoint
                .query_typed(sql::CHECK_TIMEOUT, &[(&deadline_ms, Type::TEXT)])
                .await?;
            savepoint.commit().await?;
            Ok(finding(Invariant::JobState, &row))
        }
        Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => {
            // Rolled back to the savepoint, its timeout with it; the
            // snapshot stays the check's.
            savepoint.rollback().await?;
            let row = tx.query_typed_one(fallback, params).await?;
            Ok(Finding {
                capped: true,
                ..finding(Invariant::JobState, &row)
            })
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardq_local::EphemeralServer;
    use tokio_postgres::IsolationLevel;

    /// A row of the check statements' shape that says it read `$1` rows.
    const READ_ROWS: &str = "SELECT 0::int8 AS broken, false AS capped, $1::int8 AS scanned, \
        '{}'::int[] AS ex_shard_key, '{}'::int8[] AS ex_id, '{}'::text[] AS ex_queue, \
        '{}'::text[] AS ex_key, '{}'::text[] AS ex_detail";
    /// The same, after sleeping past any share of a deadline under a minute.
    const SLOW: &str = "SELECT 0::int8 AS broken, false AS capped, $1::int8 AS scanned, \
        '{}'::int[] AS ex_shard_key, '{}'::int8[] AS ex_id, '{}'::text[] AS ex_queue, \
        '{}'::text[] AS ex_key, '{}'::text[] AS ex_detail FROM pg_sleep(60)";
    const DEADLINE: Duration = Duration::from_millis(2_000);

    /// A read past its share: the fallback's finding, capped, in the same
    /// snapshot (a row committed meanwhile stays unseen), and the check's
    /// own statement timeout after it. A read within it: its finding.
    #[tokio::test]
    async fn a_full_read_past_its_share_falls_back_in_the_same_snapshot() {
        let server = EphemeralServer::start().await.expect("server");
        let (mut db, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        let (other, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        db.batch_execute("CREATE TABLE seen (n int)").await.unwrap();
        let mut tx = db
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .start()
            .await
            .unwrap();
        tx.batch_execute("SET LOCAL statement_timeout = 2000; SELECT count(*) FROM seen")
            .await
            .unwrap();
        other
            .batch_execute("INSERT INTO seen VALUES (1)")
            .await
            .unwrap();

        let (fallback_rows, full_rows) = (3i64, 7i64);
        let started = std::time::Instant::now();
        let found = read_with(
            &mut tx,
            [SLOW, READ_ROWS],
            &[(&fallback_rows, Type::INT8)],
            DEADLINE,
        )
        .await
        .expect("answered");
        assert!(started.elapsed() < DEADLINE, "{:?}", started.elapsed());
        assert!(found.capped, "{found:?}");
        assert_eq!(found.scanned, 3, "the fallback's finding");
        let seen: i64 = tx
            .query_one("SELECT count(*) FROM seen", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(seen, 0, "the check's snapshot");
        let timeout: String = tx
            .query_one("SHOW statement_timeout", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(timeout, "2s");

        let found = read_with(
            &mut tx,
            [READ_ROWS, SLOW],
            &[(&full_rows, Type::INT8)],
            DEADLINE,
        )
        .await
        .expect("answered");
        assert!(!found.capped && found.scanned == 7, "{found:?}");
        let timeout: String = tx
            .query_one("SHOW statement_timeout", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(timeout, "2s");
    }
}
