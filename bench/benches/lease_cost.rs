//! What do lease extensions and cancellation polls cost the database? Times
//! the statements shardq used to run (by `owner = $1` over every running row
//! of the shard) against the ones it runs now (by the ids the process holds:
//! one primary-key probe per job), side by side in the same run, on one fresh
//! local shard holding `--rows` running jobs spread over `--owners` owners.
//!
//! Every call is for one owner's jobs (about rows / owners of them). Rounds
//! alternate which statement goes first, so machine drift favours neither.
//! Extensions run inside a transaction that is rolled back, so every round
//! sees the same rows, and the table is vacuumed (untimed) after each round
//! so rolled-back row versions do not pile up. The statements run prepared,
//! on a connection from shardq's own pool, which carries shardq's planner
//! settings (no seq scans, hash or merge joins): how the worker runs them.
//! Besides the client's wall time, the server's CPU time per call is read
//! from `/proc` (the backend's, plus its parallel workers', which the
//! postmaster reaps before the statement returns): the local server shares
//! the machine with whatever else runs, and CPU time is what a fleet pays.
//! Each statement is also run once under `EXPLAIN (ANALYZE, BUFFERS)` for the
//! server's own time and buffer count.
//!
//! Run: `cargo bench -p shardq-bench --bench lease_cost` (or
//! `-- --rows 200000 --owners 100 --rounds 50`).

#[path = "support.rs"]
mod support;
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use support::{flag, one_shard};
use tokio_postgres::types::ToSql;
use tokio_postgres::Statement;

/// Running rows on the shard.
const DEFAULT_ROWS: usize = 200_000;
/// Owners (worker processes) the running rows are spread over.
const DEFAULT_OWNERS: usize = 100;
/// Measurements per statement.
const DEFAULT_ROUNDS: usize = 50;
/// The worker's default lease; it extends every third of it.
const LEASE_MS: i64 = 60_000;
const EXTENSIONS_PER_LEASE: f64 = 3.0;
/// The worker polls for cancellations every second.
const POLLS_PER_SECOND: f64 = 1.0;
/// `/proc/<pid>/stat` counts CPU time in USER_HZ ticks, 100 per second on Linux.
const TICKS_PER_SECOND: f64 = 100.0;

/// The extension shardq ran before: every running row of the owner, found by
/// walking the shard's running rows. Params: owner, lease ms.
const OLD_EXTEND_LEASES: &str = "UPDATE workflow_status w \
    SET lease_expires_at = now() + $2::bigint * interval '1 millisecond' \
    FROM (SELECT shard_key, id FROM workflow_status \
        WHERE status = 'running' AND owner = $1 FOR UPDATE SKIP LOCKED) AS held \
    WHERE w.shard_key = held.shard_key AND w.id = held.id";

/// The cancellation poll shardq ran before. Param: owner.
const OLD_CANCEL_REQUESTED: &str = "SELECT shard_key, id FROM workflow_status \
    WHERE status = 'running' AND owner = $1 AND cancel_requested";

/// `$1` running jobs held by `$2` owners, round robin, every 997th with its
/// cancellation asked (a few per owner, so the polls find something).
const ADD_RUNNING: &str = "INSERT INTO workflow_status \
    (shard_key, queue, handler, payload, status, owner, attempts, fence, \
     lease_expires_at, started_at, run_at, cancel_requested) \
    SELECT (g % 65536)::int, 'bench', 'noop', '{}', 'running', 'owner-' || (g % $2::bigint), \
        1, 1, now() + interval '1 hour', now(), now(), g % 997 = 0 \
    FROM generate_series(1, $1::bigint) AS g";

const HELD_BY_OWNER: &str = "SELECT owner, array_agg(shard_key ORDER BY id), \
    array_agg(id ORDER BY id), array_agg(fence ORDER BY id) \
    FROM workflow_status WHERE status = 'running' GROUP BY owner";

/// What the pool's connections are expected to carry, as the worker runs.
const PLANNER_SETTINGS: &[(&str, &str)] = &[
    ("enable_seqscan", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
    ("plan_cache_mode", "force_custom_plan"),
];

/// The jobs one owner holds, as the worker passes them.
struct Held {
    keys: Vec<i32>,
    ids: Vec<i64>,
    fences: Vec<i64>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    ExtendBefore,
    ExtendAfter,
    PollBefore,
    PollAfter,
}

impl Kind {
    const ALL: [Kind; 4] = [
        Kind::ExtendBefore,
        Kind::ExtendAfter,
        Kind::PollBefore,
        Kind::PollAfter,
    ];

    fn index(self) -> usize {
        self as usize
    }

    fn label(self) -> &'static str {
        match self {
            Kind::ExtendBefore => "extend, before (owner=$1)",
            Kind::ExtendAfter => "extend, after (held ids)",
            Kind::PollBefore => "poll, before (owner=$1)",
            Kind::PollAfter => "poll, after (held ids)",
        }
    }

    fn sql(self) -> &'static str {
        match self {
            Kind::ExtendBefore => OLD_EXTEND_LEASES,
            Kind::ExtendAfter => shardq::store::sql::JOB_EXTEND_LEASES,
            Kind::PollBefore => OLD_CANCEL_REQUESTED,
            Kind::PollAfter => shardq::store::sql::JOB_CANCEL_REQUESTED,
        }
    }

    fn modifies(self) -> bool {
        matches!(self, Kind::ExtendBefore | Kind::ExtendAfter)
    }
}

/// The server processes whose CPU time a statement costs: the backend serving
/// our connection, and the postmaster, whose reaped children (the parallel
/// workers) add to its `cutime`/`cstime`.
struct Server {
    backend: i32,
    postmaster: i32,
}

/// Fields of `/proc/<pid>/stat` after the command name (field 3 onwards).
fn stat_fields(pid: i32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    // Field 3 (the state) is a letter; keep positions by reading it as 0.
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

impl Server {
    fn find(backend: i32) -> Option<Server> {
        // Field 4, the parent: the postmaster.
        let postmaster = *stat_fields(backend)?.get(1)? as i32;
        Some(Server {
            backend,
            postmaster,
        })
    }

    /// CPU ticks so far: the backend's own (utime + stime, fields 14, 15)
    /// and the postmaster's reaped children (cutime + cstime, fields 16, 17).
    fn ticks(&self) -> Option<u64> {
        let b = stat_fields(self.backend)?;
        let p = stat_fields(self.postmaster)?;
        Some(b.get(11)? + b.get(12)? + p.get(13)? + p.get(14)?)
    }
}

/// One call: wall time, server CPU ticks (when readable), rows changed or returned.
struct Call {
    wall: Duration,
    ticks: Option<u64>,
    rows: u64,
}

/// The statement's parameters for this owner.
fn params<'a>(kind: Kind, owner: &'a String, held: &'a Held) -> Vec<&'a (dyn ToSql + Sync)> {
    match kind {
        Kind::ExtendBefore => vec![owner, &LEASE_MS],
        Kind::ExtendAfter => vec![&held.keys, &held.ids, &held.fences, owner, &LEASE_MS],
        Kind::PollBefore => vec![owner],
        Kind::PollAfter => vec![&held.keys, &held.ids],
    }
}

/// Runs `kind` once for `owner`. An extension is rolled back (its BEGIN and
/// ROLLBACK are outside the measurement).
async fn run_once(
    db: &tokio_postgres::Client,
    server: Option<&Server>,
    stmt: &Statement,
    kind: Kind,
    owner: &String,
    held: &Held,
) -> Result<Call> {
    let params = params(kind, owner, held);
    if kind.modifies() {
        db.batch_execute("BEGIN").await?;
    }
    let cpu_before = server.and_then(Server::ticks);
    let started = Instant::now();
    let rows = if kind.modifies() {
        db.execute(stmt, &params).await
    } else {
        db.query(stmt, &params).await.map(|r| r.len() as u64)
    };
    let wall = started.elapsed();
    let cpu_after = server.and_then(Server::ticks);
    if kind.modifies() {
        db.batch_execute("ROLLBACK").await?;
    }
    Ok(Call {
        wall,
        ticks: cpu_before.zip(cpu_after).map(|(b, a)| a.saturating_sub(b)),
        rows: rows.context(kind.label())?,
    })
}

/// What `EXPLAIN (ANALYZE, BUFFERS)` says of one run of `kind`.
struct Explained {
    planning_ms: f64,
    execution_ms: f64,
    shared_hit: u64,
    shared_read: u64,
    /// "Index Scan on <index>: N rows out, M removed by filter", per scan.
    scans: Vec<String>,
}

impl Explained {
    fn server_ms(&self) -> f64 {
        self.planning_ms + self.execution_ms
    }
}

async fn explain(
    db: &tokio_postgres::Client,
    kind: Kind,
    owner: &String,
    held: &Held,
) -> Result<Explained> {
    let params = params(kind, owner, held);
    let sql = format!(
        "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {}",
        kind.sql()
    );
    db.batch_execute("BEGIN").await?;
    let row = db.query_one(sql.as_str(), &params).await;
    db.batch_execute("ROLLBACK").await?;
    let out: serde_json::Value = row.context(kind.label())?.get(0);
    let top = &out[0];
    let plan = &top["Plan"];
    let mut scans = Vec::new();
    collect_scans(plan, &mut scans);
    Ok(Explained {
        planning_ms: top["Planning Time"].as_f64().unwrap_or(0.0),
        execution_ms: top["Execution Time"]
            .as_f64()
            .context("no Execution Time in EXPLAIN")?,
        shared_hit: plan["Shared Hit Blocks"].as_u64().unwrap_or(0),
        shared_read: plan["Shared Read Blocks"].as_u64().unwrap_or(0),
        scans,
    })
}

/// One line per scan of `workflow_status` (or one of its indexes) and per
/// parallel gather in the plan. Row counts are EXPLAIN's per-loop averages
/// (rounded) times the loops.
fn collect_scans(node: &serde_json::Value, out: &mut Vec<String>) {
    let node_type = node["Node Type"].as_str().unwrap_or("?");
    if let Some(launched) = node["Workers Launched"].as_u64() {
        out.push(format!("{node_type}: {launched} parallel workers launched"));
    }
    if node["Relation Name"].as_str() == Some("workflow_status") || node["Index Name"].is_string() {
        let loops = node["Actual Loops"].as_f64().unwrap_or(1.0);
        // Per-loop averages, rounded by EXPLAIN: approximate over many loops.
        let about = if loops > 1.0 { "~" } else { "" };
        let rows = node["Actual Rows"].as_f64().unwrap_or(0.0) * loops;
        let removed = node["Rows Removed by Filter"].as_f64().unwrap_or(0.0) * loops;
        let mut line = node_type.to_string();
        if let Some(index) = node["Index Name"].as_str() {
            line.push_str(&format!(" using {index}"));
        }
        line.push_str(&format!(
            ": {about}{rows:.0} rows out in {loops:.0} loop(s)"
        ));
        if removed > 0.0 {
            line.push_str(&format!(", {about}{removed:.0} removed by filter"));
        }
        out.push(line);
    }
    if let Some(children) = node["Plans"].as_array() {
        for child in children {
            collect_scans(child, out);
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median and 90th percentile (nearest rank), in ms.
fn median_p90(times: &mut [Duration]) -> (f64, f64) {
    times.sort();
    let n = times.len();
    let p90 = times[((n * 9).div_ceil(10)).max(1) - 1];
    (ms(times[n / 2]), ms(p90))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rows = flag(&args, "--rows", DEFAULT_ROWS)?;
    let owners = flag(&args, "--owners", DEFAULT_OWNERS)?;
    let rounds = flag(&args, "--rounds", DEFAULT_ROUNDS)?;
    anyhow::ensure!(
        rows > 0 && owners > 0 && rounds > 0,
        "all flags must be > 0"
    );

    let (_server, _config, shards) = one_shard("").await?;
    let db = shards.get(0).client().await?;

    println!(
        "lease cost benchmark: {rows} running rows over {owners} owners on 1 local shard, \
         one owner's jobs per call, {rounds} rounds, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // The planner settings the pool hands out, which the worker runs with.
    let mut seen = Vec::new();
    for (name, want) in PLANNER_SETTINGS {
        let got: String = db.query_one(&format!("SHOW {name}"), &[]).await?.get(0);
        if got != *want {
            // shardq no longer sets it per connection: set it here, as shardq
            // runs its own statements with it.
            db.batch_execute(&format!("SET {name} = {want}")).await?;
            seen.push(format!("{name}={got} (set to {want} here)"));
        } else {
            seen.push(format!("{name}={got}"));
        }
    }
    println!("connection from shardq's pool: {}", seen.join(", "));
    let backend: i32 = db.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    let cpu = Server::find(backend).filter(|s| s.ticks().is_some());
    if cpu.is_none() {
        println!("server CPU time: not readable from /proc here; left out");
    }

    let setup = Instant::now();
    db.execute(ADD_RUNNING, &[&(rows as i64), &(owners as i64)])
        .await?;
    // Vacuumed after every round by the bench; no autovacuum worker's CPU in
    // the postmaster's reaped children.
    db.batch_execute("ALTER TABLE workflow_status SET (autovacuum_enabled = off)")
        .await?;
    db.batch_execute("VACUUM ANALYZE workflow_status").await?;
    let mut held: HashMap<String, Held> = HashMap::new();
    for row in db.query(HELD_BY_OWNER, &[]).await? {
        held.insert(
            row.get(0),
            Held {
                keys: row.get(1),
                ids: row.get(2),
                fences: row.get(3),
            },
        );
    }
    let per_owner = held.values().map(|h| h.ids.len()).sum::<usize>() / held.len().max(1);
    println!(
        "setup: {rows} rows inserted, vacuumed, analyzed in {:.1} s; ~{per_owner} jobs per owner",
        setup.elapsed().as_secs_f64()
    );

    let mut stmts = Vec::new();
    for kind in Kind::ALL {
        stmts.push(db.prepare(kind.sql()).await.context(kind.label())?);
    }
    let owner_of = |round: usize| format!("owner-{}", round % owners);

    // One untimed warm-up round, then the measured ones.
    let mut walls: Vec<Vec<Duration>> = vec![Vec::new(); Kind::ALL.len()];
    let mut ticks: Vec<Option<u64>> = vec![Some(0); Kind::ALL.len()];
    let mut counts = [0u64; 4];
    for round in 0..=rounds {
        let owner = owner_of(round);
        let mine = held.get(&owner).context("an owner without jobs")?;
        let order = if round % 2 == 0 {
            [
                Kind::PollBefore,
                Kind::PollAfter,
                Kind::ExtendBefore,
                Kind::ExtendAfter,
            ]
        } else {
            [
                Kind::PollAfter,
                Kind::PollBefore,
                Kind::ExtendAfter,
                Kind::ExtendBefore,
            ]
        };
        let mut got = [0u64; 4];
        for kind in order {
            let i = kind.index();
            let call = run_once(&db, cpu.as_ref(), &stmts[i], kind, &owner, mine).await?;
            got[i] = call.rows;
            if round > 0 {
                walls[i].push(call.wall);
                ticks[i] = ticks[i].zip(call.ticks).map(|(t, c)| t + c);
            }
        }
        // Before and after must do the same work.
        let (eb, ea) = (
            got[Kind::ExtendBefore.index()],
            got[Kind::ExtendAfter.index()],
        );
        anyhow::ensure!(
            eb == ea && ea == mine.ids.len() as u64,
            "{owner}: extended {eb} (before) vs {ea} (after) of {}",
            mine.ids.len()
        );
        let (pb, pa) = (got[Kind::PollBefore.index()], got[Kind::PollAfter.index()]);
        anyhow::ensure!(
            pb == pa,
            "{owner}: poll found {pb} (before) vs {pa} (after)"
        );
        if round == 1 {
            counts = got;
        }
        db.batch_execute("VACUUM workflow_status").await?;
    }

    let owner = owner_of(1);
    let mine = &held[&owner];
    let mut explained = Vec::new();
    for kind in Kind::ALL {
        // Each on a freshly vacuumed table, as in the timed rounds.
        db.batch_execute("VACUUM workflow_status").await?;
        explained.push(explain(&db, kind, &owner, mine).await?);
    }

    println!();
    println!(
        "per call ({rounds} calls each, prepared; extensions rolled back; \
         server CPU = backend + parallel workers, mean)"
    );
    println!(
        "{:<28} {:>5} {:>10} {:>8} {:>9} | {:>9} {:>10} {:>11}",
        "statement",
        "rows",
        "wall med",
        "wall p90",
        "CPU mean",
        "EXPLAIN",
        "shared hit",
        "shared read"
    );
    let mut medians = [0f64; 4];
    let mut cpu_ms = [0f64; 4];
    for kind in Kind::ALL {
        let i = kind.index();
        let (median, p90) = median_p90(&mut walls[i]);
        medians[i] = median;
        cpu_ms[i] = ticks[i].map_or(f64::NAN, |t| {
            t as f64 * 1e3 / TICKS_PER_SECOND / rounds as f64
        });
        let e = &explained[i];
        println!(
            "{:<28} {:>5} {:>10.2} {:>8.2} {:>9.2} | {:>9.2} {:>10} {:>11}",
            kind.label(),
            counts[i],
            median,
            p90,
            cpu_ms[i],
            e.server_ms(),
            e.shared_hit,
            e.shared_read
        );
    }
    println!(
        "(all in ms; EXPLAIN = planning + execution of one EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) \
         run for {owner}, buffers of the whole plan)"
    );
    println!();
    println!("scans in those plans:");
    for kind in Kind::ALL {
        println!("  {}:", kind.label());
        for scan in &explained[kind.index()].scans {
            println!("    {scan}");
        }
    }

    let servers = Kind::ALL.map(|k| explained[k.index()].server_ms());
    let columns = [
        ("wall med", &medians),
        ("CPU mean", &cpu_ms),
        ("EXPLAIN", &servers),
    ];
    println!();
    print!("{:<28}", "before / after, per call");
    for (name, _) in &columns {
        print!(" {name:>10}");
    }
    println!();
    for (label, b, a) in [
        ("extend", Kind::ExtendBefore, Kind::ExtendAfter),
        ("poll", Kind::PollBefore, Kind::PollAfter),
    ] {
        print!("{label:<28}");
        for (_, v) in &columns {
            print!(" {:>9.1}x", v[b.index()] / v[a.index()]);
        }
        println!();
    }

    // The fleet: every owner extends every lease/3 and polls every second.
    let extends_per_s = 1e3 / (LEASE_MS as f64 / EXTENSIONS_PER_LEASE);
    let fleet = |v: &[f64; 4], extend: Kind, poll: Kind| {
        owners as f64 * (v[extend.index()] * extends_per_s + v[poll.index()] * POLLS_PER_SECOND)
    };
    println!();
    println!(
        "fleet: {owners} owners, each extending every {:.0} s (lease {} s / 3) and polling every {:.0} s",
        LEASE_MS as f64 / EXTENSIONS_PER_LEASE / 1e3,
        LEASE_MS / 1000,
        1.0 / POLLS_PER_SECOND
    );
    print!("{:<28}", "database ms per second");
    for (name, _) in &columns {
        print!(" {name:>10}");
    }
    println!();
    let mut before = [0f64; 3];
    let mut after = [0f64; 3];
    for (c, (_, v)) in columns.iter().enumerate() {
        before[c] = fleet(v, Kind::ExtendBefore, Kind::PollBefore);
        after[c] = fleet(v, Kind::ExtendAfter, Kind::PollAfter);
    }
    for (label, v) in [("before", &before), ("after", &after)] {
        print!("{label:<28}");
        for x in v.iter() {
            print!(" {x:>10.1}");
        }
        println!();
    }
    print!("{:<28}", "before / after");
    for (b, a) in before.iter().zip(after.iter()) {
        print!(" {:>9.1}x", b / a);
    }
    println!();
    println!("(1000 ms per second = one server core kept busy)");
    Ok(())
}
