//! The per-batch statements keep their primary-key plans when the statistics
//! are stale: analyzed after a bulk enqueue (nothing running, no owner), then
//! most rows claimed. With such statistics the planner estimated `owner = $1`
//! at one row and scanned every running row, or the whole table, once per
//! completed job; `shardq bench scale` found it as completions taking seconds.

use crate::common;

use common::TestShards;
use serde_json::Value;
use shardq::{Client, NewJob};

const QUEUED: usize = 15_000;
const RUNNING: i64 = 4_000;
const BATCH: i64 = 2_000;

/// The completion (inside `shardq_complete_many`,
/// migrations/functions/shardq_complete_many.sql) keeps one
/// generic plan per connection, and that plan probes the primary key per
/// batch row whatever the statistics say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_use_the_primary_key_whatever_the_statistics_say() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    for _ in 0..QUEUED / 5_000 {
        let jobs = (0..5_000)
            .map(|_| NewJob::new("q", "noop", serde_json::json!({})))
            .collect();
        client.enqueue_many(jobs).await.unwrap();
    }
    // A connection of shardq's own pool: it carries the planner settings.
    let db = set.get(0).client().await.unwrap();
    db.batch_execute("ANALYZE workflow_status").await.unwrap();
    db.execute(
        "UPDATE workflow_status SET status = 'running', owner = 'w1', attempts = 1, fence = 1 \
         WHERE id IN (SELECT id FROM workflow_status ORDER BY id LIMIT $1)",
        &[&RUNNING],
    )
    .await
    .unwrap();
    let rows = db
        .query(
            "SELECT shard_key, id FROM workflow_status WHERE owner = 'w1' ORDER BY id LIMIT $1",
            &[&BATCH],
        )
        .await
        .unwrap();
    let keys: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    let ids: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
    let n = keys.len();
    let fences = vec![1i64; n];
    let statuses = vec!["succeeded"; n];
    let outputs = vec![Value::Null; n];
    let errors: Vec<Option<&str>> = vec![None; n];
    // The statement inside shardq_complete_many, as the server planned it,
    // on the second call (the plan it keeps). Nothing is written: the
    // owner does not match, so both calls plan and run the same way.
    let (db, plans) = session_showing_plans(&shards.urls[0], "json").await;
    for _ in 0..2 {
        db.query_one(
            shardq::store::sql::JOB_COMPLETE_MANY,
            &[
                &keys,
                &ids,
                &fences,
                &statuses,
                &outputs,
                &"someone else",
                &errors,
                &1000.0f64,
                &60_000.0f64,
            ],
        )
        .await
        .unwrap();
    }
    drop(db);
    let completions = plans_containing(plans, "ModifyTable").await;
    assert_eq!(completions.len(), 2, "one plan per call: {completions:#?}");
    let logged: Value =
        serde_json::from_str(&completions[1][completions[1].find('{').unwrap()..]).unwrap();
    let plan = &logged["Plan"];
    // A plan made for this call's arrays knows their length; the kept one
    // does not.
    let batch_rows = plan["Plans"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["Subplan Name"] == "CTE batch"))
        .map(|n| n["Plan Rows"].as_f64().unwrap());
    assert!(
        batch_rows.is_some_and(|rows| rows != n as f64),
        "the completion was planned for this call's {n} jobs, not once: {plan}"
    );
    let text = plan.to_string();
    let mut scans = Vec::new();
    table_scans(plan, &mut scans);
    assert!(!scans.is_empty(), "no scan of workflow_status in {text}");
    for scan in scans {
        assert_eq!(
            scan["Index Name"], "workflow_status_pkey",
            "every lookup must use the primary key: {text}"
        );
        assert!(
            scan.get("Index Cond").is_some(),
            "a primary-key scan without a key condition walks the whole index: {text}"
        );
    }
    for bad in ["Hash Join", "Merge Join"] {
        assert!(
            !text.contains(bad),
            "the completion plan uses {bad}: {text}"
        );
    }
}

/// Asserts that every read of `workflow_status` in `plan` goes through one of
/// `indexes`; returns how many reads there are.
fn reads_only(plan: &Value, indexes: &[&str], what: &str) -> usize {
    let mut scans = Vec::new();
    table_scans(plan, &mut scans);
    for scan in &scans {
        let index = scan["Index Name"].as_str().unwrap_or("no index");
        assert!(indexes.contains(&index), "{what} reads {index}: {plan}");
    }
    scans.len()
}

/// Every plan node that reads `workflow_status`.
fn table_scans<'a>(node: &'a Value, out: &mut Vec<&'a Value>) {
    match node {
        Value::Object(map) => {
            if map.get("Relation Name").and_then(Value::as_str) == Some("workflow_status")
                && map.get("Node Type").and_then(Value::as_str) != Some("ModifyTable")
            {
                out.push(node);
            }
            map.values().for_each(|v| table_scans(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| table_scans(v, out)),
        _ => {}
    }
}

/// The worker's idle-time question ("is anything left?") is asked every
/// 200 ms: each of its tests must be answered by a partial index, never by a
/// scan of finished rows, nor by a walk of other queues' scheduled rows (the
/// promotion index has no queue). Running rows are walked through the lease
/// index (bounded by what the fleet holds). Splitting the dequeue index by key made a plain
/// `status = 'queued'` test a full table scan (found by `cargo bench --bench
/// history`: 0.74 of the no-history rate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pending_check_reads_only_partial_indexes() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let db = set.get(0).client().await.unwrap();
    db.batch_execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at) \
         SELECT g % 65536, 'q', 'noop', 'succeeded', now() FROM generate_series(1, 20000) g; \
         INSERT INTO workflow_status (shard_key, queue, handler, status, owner, started_at, \
             lease_expires_at) \
         SELECT g % 65536, 'other', 'noop', 'running', 'w', now(), now() + interval '1 hour' \
         FROM generate_series(1, 20000) g; \
         INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, run_at) \
         SELECT g % 65536, 'other', 'noop', 'scheduled', 1, now() + interval '1 day' \
         FROM generate_series(1, 20000) g; \
         ANALYZE workflow_status",
    )
    .await
    .unwrap();
    let explain = format!(
        "EXPLAIN (FORMAT JSON) {}",
        shardq::store::sql::QUEUE_HAS_PENDING
    );
    let plan: Value = db
        .query_one(explain.as_str(), &[&"q"])
        .await
        .unwrap()
        .get(0);
    let scans = reads_only(
        &plan,
        &[
            "workflow_status_dequeue_plain",
            "workflow_status_ready_plain",
            "workflow_status_ready_grouped",
            "workflow_status_group_lines",
            "workflow_status_key",
            "workflow_status_lease",
            "workflow_status_scheduled_by_kind",
        ],
        "the pending check",
    );
    assert_eq!(scans, 5, "{plan}");
}

/// `shardq status` on a shard with many finished rows: unfinished jobs are
/// counted from their partial indexes only, and the finished ones come from
/// the table's statistics instead of a scan of every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_partial_indexes_and_estimates_history() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let db = set.get(0).client().await.unwrap();
    db.batch_execute(
        "SET statement_timeout = 0; \
         INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at) \
         SELECT g % 65536, 'q', 'noop', 'succeeded', now() FROM generate_series(1, 300000) g; \
         ANALYZE workflow_status",
    )
    .await
    .unwrap();
    let jobs = (0..5)
        .map(|_| NewJob::new("q", "noop", serde_json::json!({})))
        .collect();
    client.enqueue_many(jobs).await.unwrap();

    // `status` counts unfinished jobs with the queue-depth read (all queues).
    let explain = format!(
        "EXPLAIN (FORMAT JSON) {}",
        shardq::store::sql::QUEUE_BACKLOG
    );
    let all: Option<&str> = None;
    let plan: Value = db
        .query_typed_one(
            explain.as_str(),
            &[(&all, tokio_postgres::types::Type::TEXT)],
        )
        .await
        .unwrap()
        .get(0);
    reads_only(
        &plan,
        &[
            "workflow_status_ready_plain",
            "workflow_status_ready_keyed",
            "workflow_status_ready_grouped",
            "workflow_status_group_lines",
            "workflow_status_pkey",
            "workflow_status_key",
            "workflow_status_scheduled",
            "workflow_status_lease",
            "workflow_status_scheduled_by_kind",
        ],
        "status",
    );

    let counts = client.status().await[0].counts.clone().unwrap();
    let queued = counts.iter().find(|c| c.status == "queued").unwrap();
    assert_eq!((queued.count, queued.estimated), (5, false));
    let finished = counts.iter().find(|c| c.status == "finished").unwrap();
    assert!(finished.estimated, "{counts:?}");
    assert!(
        (250_000..=350_000).contains(&finished.count),
        "estimate {}",
        finished.count
    );
}

/// shardq's connections turn seq scans off, which prices a scan of a small
/// table (`shardq_workers`, the shard map) at 10^10; with the server's JIT
/// on, every such statement was compiled by LLVM on each call (30 ms instead
/// of 0.02 on an idle server, most of four servers' CPU under `shardq bench
/// scale`). On shardq's own connections no statement is JIT-compiled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_statement_is_jit_compiled_on_shardqs_connections() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let shard = set.get(0);
    // The expiry of silent workers' rows, as the server ran it: whether it
    // was JIT-compiled.
    async fn expiry_jit(db: &impl tokio_postgres::GenericClient) -> (Option<Value>, Value) {
        let explain = format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) {}",
            shardq::store::sql::WORKERS_SILENT
        );
        let plan: Value = db
            .query_one(explain.as_str(), &[&"w", &60_000i64])
            .await
            .unwrap()
            .get(0);
        (plan[0].get("JIT").cloned(), plan)
    }

    // The server's own settings with seq scans off, as shardq sets them: the
    // expiry is JIT-compiled (so this test can tell).
    let mut mine = shard.user_client().await.unwrap();
    let tx = mine.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL enable_seqscan = off")
        .await
        .unwrap();
    let (jit, plan) = expiry_jit(&*tx).await;
    assert!(
        jit.is_some(),
        "the server does not JIT this plan, so the test cannot tell: {plan}"
    );
    tx.rollback().await.unwrap();

    let own = shard.client().await.unwrap();
    let (jit, plan) = expiry_jit(&***own).await;
    assert_eq!(jit, None, "JIT-compiled on shardq's connection: {plan}");
}

/// The claim function's probes and its unkeyed claim keep one generic plan
/// per connection (`force_generic_plan`, migrations/functions/shardq_claim.sql) instead of being planned on every call
/// (about 0.2 ms of server CPU per claim), and that plan is still the index
/// walk: the dequeue index, then each locked row by its tuple id, on a table
/// of 300,000 finished and 50,000 queued rows. auto_explain shows the plans
/// of the statements inside the function as the server ran them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unkeyed_claim_keeps_one_index_plan() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    set.get(0)
        .client()
        .await
        .unwrap()
        .batch_execute(
            "SET statement_timeout = 0; \
             INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at) \
             SELECT g % 65536, 'q', 'noop', 'succeeded', now() FROM generate_series(1, 300000) g; \
             INSERT INTO workflow_status (shard_key, queue, handler) \
             SELECT g % 65536, 'q', 'noop' FROM generate_series(1, 50000) g; \
             ANALYZE workflow_status",
        )
        .await
        .unwrap();

    let (db, plans) = session_showing_plans(&shards.urls[0], "text").await;
    for _ in 0..3 {
        let rows = db
            .query(
                "SELECT * FROM shardq_claim(1, 0, 'q', 500, 'w', 60000)",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 500);
    }
    drop(db);
    let plans = plans_containing(plans, "").await;
    let containing =
        |node: &str| -> Vec<&String> { plans.iter().filter(|p| p.contains(node)).collect() };
    let locks = containing("LockRows");
    assert_eq!(locks.len(), 3, "one lock plan per call: {locks:#?}");
    let updates = containing("Update on workflow_status");
    assert_eq!(updates.len(), 3, "one update plan per call: {updates:#?}");
    for plan in updates {
        assert!(
            plan.contains("Tid Scan on workflow_status"),
            "the claim must update by tuple id: {plan}"
        );
    }
    for plan in locks {
        assert!(
            plan.contains("Index Scan using workflow_status_ready_plain on workflow_status"),
            "the claim must walk the ready index from its floor: {plan}"
        );
        assert!(
            plan.contains("(queue = $"),
            "the claim was planned for this call's values, not once: {plan}"
        );
    }
}

/// What marks the statements that read the groups' lines: the heads'
/// walk (its two branches) and each group's run in the limited claim.
const LINE_MARKERS: [&str; 3] = [
    "hashtext(w.job_group) >= ",
    "hashtext(w.job_group), w.job_group) >",
    "hashtext(g.name)",
];

/// Each grouped index serves only its own statements
/// (migrations/0043_grouped_index_roles.sql, 0046_one_group_line_index.sql).
/// The ready probes (the claim's choice of path and its walk, the move of
/// the rounds, the probe for jobs without a turn) read queued grouped jobs
/// by turn only (`workflow_status_ready_grouped`); a new job's turn, and
/// the heads and runs of groups that a claim under group limits takes, are
/// read from the groups' lines only (`workflow_status_group_lines`). With
/// statistics taken when few jobs were queued the planner chose among the
/// indexes by chance: a probe walked the dead entries of the line index
/// (45,000 buffers under a held horizon), and a bulk enqueue read the turn
/// index backward past every job queued before it. Shown by taking each
/// index away in a transaction: the statements meant for it then do not
/// use the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_grouped_index_serves_only_its_statements() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let _set = shards.migrated(&config).await;
    let (db, plans) = session_showing_plans(&shards.urls[0], "text").await;
    db.batch_execute(
        "BEGIN; \
         INSERT INTO workflow_status (shard_key, queue, handler, job_group) \
         SELECT g % 65536, 'q', 'noop', 'g' || (g % 50) FROM generate_series(1, 200) g; \
         INSERT INTO shardq_group_queues (queue) VALUES ('q'); \
         INSERT INTO shardq_group_round_moves (queue, move_seq, round, floor_turn, noted_round) \
         VALUES ('q', 0, 1, 0, 1); \
         DROP INDEX workflow_status_ready_grouped; \
         SELECT shardq_queue_has_ready('q', p_plain => false, p_keyed => false); \
         SELECT shardq_grouped_ready_turn('q'); \
         SELECT shardq_move_group_rounds(1000000, true); \
         SELECT count(*) FROM shardq_claim_grouped('q', 10, 'w', 60000); \
         ROLLBACK; \
         BEGIN; \
         DROP INDEX workflow_status_group_lines; \
         INSERT INTO workflow_status (shard_key, queue, handler, job_group) \
         SELECT g % 65536, 'q', 'noop', 'g' || (g % 50) FROM generate_series(1, 200) g; \
         ROLLBACK",
    )
    .await
    .unwrap();
    // Claims under group limits: the group heads' walk and each group's run.
    let limited = "INSERT INTO workflow_status (shard_key, queue, handler, job_group) \
         SELECT g % 65536, 'q', 'noop', 'g' || (g % 50) FROM generate_series(1, 200) g; \
         INSERT INTO shardq_queue_limits (queue, group_concurrency, revision) VALUES ('q', 5, 1); \
         SELECT count(*) FROM shardq_claim_grouped('q', 10, 'w', 60000); \
         SELECT count(*) FROM shardq_claim_grouped('q', 200, 'w', 60000); \
         ROLLBACK";
    // One call each: a plan's query text is its whole call's.
    for batch in [
        format!("BEGIN; {limited}"),
        "SELECT count(*) FROM workflow_status WHERE id = -4242".to_string(),
        format!("BEGIN; DROP INDEX workflow_status_group_lines; {limited}"),
    ] {
        db.batch_execute(&batch).await.unwrap();
    }
    drop(db);
    let plans = plans_containing(plans, "workflow_status").await;
    fn reading(plan: &str, indexes: &[&'static str]) -> Option<&'static str> {
        indexes
            .iter()
            .find(|index| plan.contains(&format!("{index} ")))
            .copied()
    }
    let probes: Vec<&String> = plans
        .iter()
        .filter(|p| {
            p.contains("job_group IS NOT NULL")
                && (p.contains("turn IS NULL") || p.contains("turn >= "))
                && !LINE_MARKERS.iter().any(|marker| p.contains(marker))
        })
        .collect();
    // The has-ready probe (both parts), the first ready turn's read (both
    // parts), the move's two first-ready reads and its probe for jobs
    // without a turn, the claim's walk. (Those that read the groups' lines
    // are checked below.)
    let statements: std::collections::BTreeSet<String> = probes
        .iter()
        .filter_map(|p| p.split("Query Text: ").nth(1))
        .map(|text| text.chars().take(120).collect())
        .collect();
    assert!(statements.len() >= 7, "probes seen: {statements:#?}");
    for plan in probes {
        let other = reading(plan, &["workflow_status_group_lines"]);
        assert_eq!(other, None, "a grouped probe reads {other:?}: {plan}");
    }
    let turns: Vec<&String> = plans
        .iter()
        .filter(|p| p.contains("hashtext(w.job_group) = hashtext(NEW.job_group)"))
        .collect();
    // 200 in each transaction; the line index is dropped in the second
    // and the fourth.
    assert_eq!(turns.len(), 800, "plans of new jobs' turns");
    for (n, plan) in turns.iter().enumerate() {
        let other = reading(plan, &["workflow_status_ready_grouped"]);
        assert_eq!(other, None, "a new job's turn reads {other:?}: {plan}");
        if n < 200 || (400..600).contains(&n) {
            assert!(
                plan.contains("workflow_status_group_lines"),
                "a new job's turn is read from its group's line: {plan}"
            );
        }
    }
    // The limited claims' group heads and runs, with the line index (before
    // the marker) and without it.
    let marker = plans
        .iter()
        .position(|p| p.contains("-4242"))
        .expect("the marker's plan");
    // A heads walk's whole plan; of the take, its runs' part (the heads it
    // found are read by tuple id).
    let lines: Vec<(usize, &str)> = plans
        .iter()
        .enumerate()
        .filter_map(|(n, p)| {
            if p.contains(LINE_MARKERS[0]) || p.contains(LINE_MARKERS[1]) {
                Some((n, p.as_str()))
            } else if p.contains(LINE_MARKERS[2]) {
                let runs = p.split("CTE runs").nth(1)?.split("CTE plain").next()?;
                Some((n, runs))
            } else {
                None
            }
        })
        .collect();
    let (with_index, without): (Vec<_>, Vec<_>) = lines.iter().partition(|(n, _)| *n < marker);
    assert!(
        with_index.len() >= 3 && without.len() >= 3,
        "heads and runs: {} with the index, {} without",
        with_index.len(),
        without.len()
    );
    for (_, plan) in &with_index {
        assert!(
            plan.contains("Index Scan using workflow_status_group_lines")
                && !plan.contains("Bitmap"),
            "group heads and runs walk the groups' lines in order: {plan}"
        );
    }
    for (_, plan) in lines {
        let other = reading(plan, &["workflow_status_ready_grouped"]);
        assert_eq!(other, None, "group heads or runs read {other:?}: {plan}");
    }
}

/// A claim under group limits locks each group's head by its tuple id (a
/// TID scan), whatever the statistics and the plan its connection keeps
/// (`force_generic_plan`, migrations/functions/shardq_claim_grouped.sql).
/// Written as a join of the heads' ids to the table, its generic plan
/// walked every ready job of the queue instead, with the join as a filter
/// (with the statistics of a table never analyzed, as here): 14-28 ms a
/// claim of one job with 20,000 jobs of one group ready
/// (bench/results/round31).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_limited_claim_locks_its_heads_by_tuple_id() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    set.get(0)
        .client()
        .await
        .unwrap()
        .batch_execute(
            "ALTER TABLE workflow_status SET (autovacuum_enabled = off); \
             INSERT INTO shardq_queue_limits \
                 (queue, group_rate_count, group_rate_period_ms, revision) \
             VALUES ('tenants', 100000000, 1000, 1); \
             SELECT shardq_enqueue('tenants', 'noop', p_group => 'g') \
             FROM generate_series(1, 3000)",
        )
        .await
        .unwrap();

    let (db, plans) = session_showing_plans(&shards.urls[0], "text").await;
    for _ in 0..3 {
        let rows = db
            .query(
                "SELECT id FROM shardq_claim(1, 0, 'tenants', 1, 'w', 60000) \
                 WHERE id IS NOT NULL",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
    }
    drop(db);
    let heads: Vec<String> = plans_containing(plans, "CTE heads_only")
        .await
        .iter()
        .map(|plan| {
            let from = plan.find("CTE heads_only").unwrap();
            let to = plan[from..]
                .find("CTE runs")
                .map_or(plan.len(), |at| from + at);
            plan[from..to].to_string()
        })
        .collect();
    assert_eq!(heads.len(), 3, "one plan per claim: {heads:#?}");
    for plan in heads {
        assert!(
            plan.contains("Tid Scan on workflow_status") && !plan.contains("Index"),
            "the heads must be locked by tuple id: {plan}"
        );
    }
}

/// A session with shardq's planner settings (src/shards.rs) that receives
/// every plan the server runs, nested statements too, as a notice in
/// `format` (auto_explain).
async fn session_showing_plans(
    url: &str,
    format: &str,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use futures_util::StreamExt;
    let (db, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (notices, plans) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notice(notice) = message {
                let _ = notices.send(notice.message().to_string());
            }
        }
    });
    db.batch_execute(&format!(
        "SET plan_cache_mode = force_custom_plan; SET enable_seqscan = off; \
         SET enable_hashjoin = off; SET enable_mergejoin = off; SET jit = off; \
         LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; \
         SET auto_explain.log_nested_statements = on; SET auto_explain.log_level = notice; \
         SET auto_explain.log_format = {format}"
    ))
    .await
    .unwrap();
    (db, plans)
}

/// The plans received until the session closed that contain `node`.
async fn plans_containing(
    mut plans: tokio::sync::mpsc::UnboundedReceiver<String>,
    node: &str,
) -> Vec<String> {
    let mut found = Vec::new();
    while let Some(plan) = plans.recv().await {
        if plan.contains(node) {
            found.push(plan);
        }
    }
    found
}

/// A bulk enqueue of every kind of job (plain, keyed, grouped, delayed,
/// deduplicated; then the deduplicated ones again, each found taken) on a
/// user's connection (the server's planner settings: shardq's own are not
/// sent on it) right after the statistics said the table was empty scans
/// no table of jobs: a probe per job planned on those statistics
/// (`shardq_take_turn`'s before schema 52) scanned the whole table once
/// per job, and kept doing so for the rest of the statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_enqueue_of_every_kind_scans_no_job_table_on_empty_statistics() {
    let shards = TestShards::databases(1).await;
    shards.migrated(&shards.config("")).await;
    let db = common::connect(&shards.urls[0]).await;
    db.batch_execute("VACUUM ANALYZE workflow_status, shardq_key_floors, shardq_group_round_moves")
        .await
        .unwrap();
    let mut jobs = Vec::new();
    let mut dedup = Vec::new();
    for i in 0..3_000 {
        let job = match i % 5 {
            0 => serde_json::json!({"queue": "bulk", "handler": "noop"}),
            1 => serde_json::json!({"queue": "bulk", "handler": "noop",
                                    "ordering_key": format!("k{}", i % 100)}),
            2 => serde_json::json!({"queue": "bulk", "handler": "noop",
                                    "group": format!("g{}", i % 50)}),
            3 => serde_json::json!({"queue": "bulk", "handler": "noop",
                                    "run_at": "2999-01-01T00:00:00Z"}),
            _ => {
                let job = serde_json::json!({"queue": "bulk", "handler": "noop",
                                             "dedup_id": format!("d{i}")});
                dedup.push(job.clone());
                job
            }
        };
        jobs.push(job);
    }
    let scans = "SELECT coalesce(sum(pg_stat_get_xact_numscans(c.oid)), 0)::bigint \
                 FROM pg_class c \
                 WHERE c.relname IN ('workflow_status', 'shardq_key_floors', \
                                     'shardq_group_round_moves')";
    let enqueue = "SELECT count(*) FILTER (WHERE is_new) FROM shardq_enqueue_many($1::jsonb)";
    db.batch_execute("BEGIN").await.unwrap();
    let before: i64 = db.query_one(scans, &[]).await.unwrap().get(0);
    let all = Value::Array(jobs);
    let written: i64 = db.query_one(enqueue, &[&all]).await.unwrap().get(0);
    let again = Value::Array(dedup);
    let written_again: i64 = db.query_one(enqueue, &[&again]).await.unwrap().get(0);
    let after: i64 = db.query_one(scans, &[]).await.unwrap().get(0);
    db.batch_execute("COMMIT").await.unwrap();
    assert_eq!((written, written_again), (3_000, 0));
    assert_eq!(after - before, 0, "sequential scans of the job tables");
}
