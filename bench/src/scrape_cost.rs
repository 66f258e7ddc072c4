//! `shardq-bench scrape-cost`: what one scrape of `shardq metrics` costs a
//! shard that holds a long history. Fills one fresh shard with finished rows
//! (`INSERT … SELECT generate_series`, then `VACUUM ANALYZE`) and some ready
//! ones, times repeated reads of its backlog through shardq's own pool, and
//! prints the plan with its buffers (`EXPLAIN (ANALYZE, BUFFERS)`), next to
//! a plain count of the table for contrast.

use anyhow::{Context, Result};
use clap::Args;
use shardq::shards::Shard;
use shardq::{Client, NewJob};
use std::time::{Duration, Instant};

/// Finished rows written per `INSERT … SELECT` (one transaction each), so
/// the fill reports progress and no single transaction grows huge.
const FILL_CHUNK: i64 = 1_000_000;

/// Writes finished rows $1 .. $2 (exclusive), spread over four queues and
/// every shard key, finished in the last day (inside default retention).
const FILL_FINISHED: &str = "INSERT INTO workflow_status \
    (shard_key, queue, handler, status, attempts, created_at, run_at, started_at, finished_at) \
    SELECT (g % 65536)::int, 'q' || (g % 4), 'noop', \
        CASE WHEN g % 100 = 0 THEN 'dead' ELSE 'succeeded' END, 1, \
        now() - interval '1 day' + g * interval '1 microsecond', \
        now() - interval '1 day' + g * interval '1 microsecond', \
        now() - interval '1 day' + g * interval '1 microsecond', \
        now() - interval '1 day' + g * interval '2 microsecond' \
    FROM generate_series($1::bigint, $2::bigint - 1) AS g";

/// Statement deadline of the bench's own connections.
const UNHURRIED: &str = "[database]\nstatement_timeout_ms = 3600000\n";

/// What a scrape that walked the history would read: every row.
const COUNT_ALL: &str = "SELECT queue, status, count(*) FROM workflow_status GROUP BY 1, 2";

/// Flags of `scrape-cost`.
#[derive(Debug, Args)]
pub struct ScrapeCostArgs {
    /// Finished rows to fill the shard with.
    #[arg(long, default_value_t = 10_000_000)]
    finished: i64,
    /// Ready jobs (half of them keyed), over four queues.
    #[arg(long, default_value_t = 10_000)]
    ready: usize,
    /// Scrapes to time.
    #[arg(long, default_value_t = 50)]
    scrapes: usize,
}

/// Runs the measurement and prints it.
pub async fn run(args: ScrapeCostArgs) -> Result<()> {
    // The fill and VACUUM of millions of rows outlast the default deadline.
    let one = shardq_harness::one_shard("scrape-0", UNHURRIED).await?;
    let shard = one.shards.get(0);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "scrape-cost: one local PostgreSQL shard on {cores} cores (shared with other work), \
         {} finished rows, {} ready jobs, {} scrapes",
        args.finished, args.ready, args.scrapes
    );

    let started = Instant::now();
    fill_finished(shard, args.finished).await?;
    let client = Client::from_shards(one.shards.clone(), one.config.limits.clone());
    let ready: Vec<NewJob> = (0..args.ready)
        .map(|i| {
            let job = NewJob::new(format!("q{}", i % 4), "noop", serde_json::json!({}));
            if i % 2 == 0 {
                job.ordering_key(format!("key-{i}"))
            } else {
                job
            }
        })
        .collect();
    for chunk in ready.chunks(20_000) {
        client.enqueue_many(chunk.to_vec()).await?;
    }
    let db = shard.client().await?;
    db.batch_execute("VACUUM ANALYZE workflow_status")
        .await
        .context("VACUUM ANALYZE failed")?;
    let size: String = db
        .query_one(
            "SELECT pg_size_pretty(pg_total_relation_size('workflow_status'))",
            &[],
        )
        .await?
        .get(0);
    println!(
        "filled in {:.1} s; workflow_status with its indexes: {size}",
        started.elapsed().as_secs_f64()
    );

    // Warm once, then time the scrapes as the exporter runs them.
    let rows = shardq::store::backlog::read(shard, None).await?;
    let mut took = Vec::with_capacity(args.scrapes);
    for _ in 0..args.scrapes {
        let t = Instant::now();
        shardq::store::backlog::read(shard, None).await?;
        took.push(t.elapsed());
    }
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "backlog read (one statement, shardq's pool): median {:.2} ms, p90 {:.2} ms, max {:.2} ms over {} scrapes",
        ms(took[took.len() / 2]),
        ms(took[took.len() * 9 / 10]),
        ms(took[took.len() - 1]),
        took.len()
    );
    for row in rows.iter().filter(|r| r.depth.queued > 0) {
        println!(
            "  {} queued: {} ready, oldest ready {:.1} s",
            row.queue,
            row.depth.queued,
            row.oldest_ready_s.unwrap_or(0.0)
        );
    }
    let t = Instant::now();
    let text = shardq::prometheus::backlog::scrape(
        &one.shards,
        &["q0".to_string()],
        Duration::from_secs(10),
    )
    .await;
    println!(
        "whole scrape (read + exposition): {:.2} ms, {} bytes of text",
        ms(t.elapsed()),
        text.len()
    );

    println!("\nEXPLAIN (ANALYZE, BUFFERS) of the backlog statement (shardq's session settings):");
    print_plan(shard, shardq::store::sql::QUEUE_BACKLOG).await?;
    println!("\nFor contrast, a count that walks the history ({COUNT_ALL}):");
    let t = Instant::now();
    db.query(COUNT_ALL, &[]).await?;
    println!("took {:.0} ms", ms(t.elapsed()));
    print_plan(shard, COUNT_ALL).await?;
    Ok(())
}

async fn fill_finished(shard: &Shard, rows: i64) -> Result<()> {
    let db = shard.client().await?;
    let mut from = 0;
    while from < rows {
        let to = (from + FILL_CHUNK).min(rows);
        let t = Instant::now();
        db.execute(FILL_FINISHED, &[&from, &to])
            .await
            .context("filling finished rows failed")?;
        eprintln!(
            "filled {to} of {rows} finished rows ({:.1} s for this chunk)",
            t.elapsed().as_secs_f64()
        );
        from = to;
    }
    Ok(())
}

/// Prints the plan and the buffers its nodes touched, on one of shardq's
/// own connections (they carry its planner settings).
async fn print_plan(shard: &Shard, statement: &str) -> Result<()> {
    let db = shard.client().await?;
    let explain = format!("EXPLAIN (ANALYZE, BUFFERS) {statement}");
    for row in db.query(explain.as_str(), &[]).await? {
        let line: String = row.get(0);
        println!("  {line}");
    }
    Ok(())
}
