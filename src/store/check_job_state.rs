//! The job-state check's read under a share of the check's deadline: its
//! windows from each index's start ([`sql::CHECK_JOB_STATE`]: of ready,
//! waiting and scheduled jobs) walk, while a long transaction holds the
//! horizon, the dead entry of every job that left the state since; past
//! the share the read is made again without them
//! ([`sql::CHECK_JOB_STATE_FROM_FLOORS`], `capped`), so
//! that the check of every other invariant still answers. `store::check`
//! makes the finding of the row.

use super::sql::{self, Param};
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Row, Transaction};

/// The share of the check's time left that the full read may take
/// (1 / this): the fallback has the rest.
pub(super) const BUDGET_SHARE: u32 = 2;

/// The job-state read's row, and whether it is the fallback's (a bounded
/// read), inside `tx` (the check's snapshot) with `params`, with `left`
/// of the check's deadline to go: the full read within its share of it,
/// else the read from the floors within the rest. The check's statement
/// timeout is `left` after a full read, the rest after a fallback.
pub(super) async fn read(
    tx: &mut Transaction<'_>,
    params: &[Param<'_>],
    left: Duration,
) -> Result<(Row, bool), tokio_postgres::Error> {
    let reads = [sql::CHECK_JOB_STATE, sql::CHECK_JOB_STATE_FROM_FLOORS];
    read_with(tx, reads, params, left).await
}

/// [`read`] with its two reads: `full`, else `fallback`.
async fn read_with(
    tx: &mut Transaction<'_>,
    [full, fallback]: [&str; 2],
    params: &[Param<'_>],
    left: Duration,
) -> Result<(Row, bool), tokio_postgres::Error> {
    let started = std::time::Instant::now();
    let ms = |d: Duration| d.as_millis().max(1).to_string();
    let (budget_ms, deadline_ms) = (ms(left / BUDGET_SHARE), ms(left));
    let savepoint = tx.savepoint("job_state").await?;
    savepoint
        .query_typed(sql::LOCAL_STATEMENT_TIMEOUT, &[(&budget_ms, Type::TEXT)])
        .await?;
    match savepoint.query_typed_one(full, params).await {
        Ok(row) => {
            savepoint
                .query_typed(sql::LOCAL_STATEMENT_TIMEOUT, &[(&deadline_ms, Type::TEXT)])
                .await?;
            savepoint.commit().await?;
            Ok((row, false))
        }
        Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => {
            // Rolled back to the savepoint, its timeout with it; the
            // snapshot stays the check's. The fallback has what is left.
            savepoint.rollback().await?;
            let rest = ms(left.saturating_sub(started.elapsed()));
            tx.query_typed(sql::LOCAL_STATEMENT_TIMEOUT, &[(&rest, Type::TEXT)])
                .await?;
            let row = tx.query_typed_one(fallback, params).await?;
            Ok((row, true))
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
    /// snapshot (a row committed meanwhile stays unseen), with what was
    /// left of the deadline as its timeout. A read within it: its finding,
    /// and the check's own timeout after it.
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
        let (row, bounded) = found;
        assert!(bounded, "the fallback answered");
        assert_eq!(row.get::<_, i64>("scanned"), 3, "the fallback's row");
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
        assert!(timeout.ends_with("ms"), "what was left of 2 s: {timeout}");

        let found = read_with(
            &mut tx,
            [READ_ROWS, SLOW],
            &[(&full_rows, Type::INT8)],
            DEADLINE,
        )
        .await
        .expect("answered");
        let (row, bounded) = found;
        assert!(
            !bounded && row.get::<_, i64>("scanned") == 7,
            "the full read's row"
        );
        let timeout: String = tx
            .query_one("SHOW statement_timeout", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(timeout, "2s");
    }
}
