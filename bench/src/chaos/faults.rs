//! The faults themselves (the schedules are in `schedule`). Each fault runs on its own
//! connection (not a shardq pool), under an application name that the
//! connection-killing fault leaves alone.

use super::cluster::{Cluster, SHARDS};
use super::fleet::Fleet;
pub use super::schedule::{longest_period, Fault, When};
use super::sql;
use anyhow::Result;
use futures_util::future::join_all;
use rand::Rng;
use serde::Serialize;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use tokio_postgres::NoTls;

/// The application name of shardq's pools (set in `shardq::shards`): the
/// backends that the terminate fault kills.
const SHARDQ_APPLICATION: &str = "shardq";

/// The application name of the faults' own connections.
const FAULT_APPLICATION: &str = "shardq-chaos";

/// Connect timeout of a fault's connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Shortest hold of the faults that last a share of the phase: long enough
/// to outlast every deadline of the workers (1 s statements, 2 s connects).
const SHORTEST_HOLD: Duration = Duration::from_secs(3);

impl Fault {
    /// The shard this fault disturbs: its own, a random one, or none (the
    /// whole fleet).
    fn pick_shard(&self) -> Option<usize> {
        match *self {
            Fault::CrashRestart(shard)
            | Fault::VacuumFull(shard)
            | Fault::LockQueueTable { shard, .. }
            | Fault::FreezeShard { shard, .. }
            | Fault::Wire { shard, .. } => Some(shard),
            Fault::TerminateBackends | Fault::CompletionStall { .. } => {
                Some(rand::thread_rng().gen_range(0..SHARDS))
            }
            Fault::KillWorker | Fault::LoseReplies { .. } | Fault::StopWorker { .. } => None,
        }
    }
}

/// What one firing did.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Seconds since the fault phase began.
    pub at_s: f64,
    /// When it ended (seconds since the fault phase began).
    pub until_s: f64,
    /// [`Fault::name`].
    pub fault: &'static str,
    /// The shard it disturbed; `None` for faults of the whole fleet.
    pub shard: Option<usize>,
    /// What happened.
    pub detail: String,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

/// Runs `schedule` for `phase` from `started` and returns what happened, in
/// firing order. A fault in progress at the end of the phase is finished.
pub async fn run(
    cluster: &Cluster,
    fleet: &Mutex<Fleet>,
    schedule: &[(When, Fault)],
    started: Instant,
    phase: Duration,
) -> Vec<Event> {
    let end = started + phase;
    let events = std::sync::Mutex::new(Vec::new());
    let fire_and_record = |fault: Fault| {
        let events = &events;
        async move {
            let at_s = started.elapsed().as_secs_f64();
            let shard = fault.pick_shard();
            let result = fire(fault, shard.unwrap_or(0), cluster, fleet, phase).await;
            let event = Event {
                at_s,
                until_s: started.elapsed().as_secs_f64(),
                fault: fault.name(),
                shard,
                detail: result.as_ref().map(String::clone).unwrap_or_default(),
                error: result.err().map(|e| format!("{e:#}")),
            };
            match &event.error {
                None => tracing::info!(
                    at_s = format!("{at_s:.1}"),
                    "{}: {}",
                    event.fault,
                    event.detail
                ),
                Some(err) => {
                    tracing::warn!(at_s = format!("{at_s:.1}"), "{} failed: {err}", event.fault)
                }
            }
            events.lock().expect("events").push(event);
        }
    };
    let timelines = schedule.iter().map(|&(when, fault)| {
        let fire_and_record = &fire_and_record;
        async move {
            match when {
                When::Every(period) => {
                    let mut next = started + period;
                    while next < end {
                        tokio::time::sleep_until(next.into()).await;
                        fire_and_record(fault).await;
                        next += period;
                    }
                }
                When::At(fraction) => {
                    tokio::time::sleep_until((started + phase.mul_f64(fraction)).into()).await;
                    fire_and_record(fault).await;
                }
            }
        }
    });
    join_all(timelines).await;
    let mut events = events.into_inner().expect("events");
    events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    events
}

/// Injects one fault (on `shard`, for a fault of one shard); returns what it did.
async fn fire(
    fault: Fault,
    shard: usize,
    cluster: &Cluster,
    fleet: &Mutex<Fleet>,
    phase: Duration,
) -> Result<String> {
    match fault {
        Fault::KillWorker => {
            let (killed, started) = fleet.lock().await.kill_random().await?;
            Ok(format!("killed pid {killed}, started pid {started}"))
        }
        Fault::TerminateBackends => {
            let db = connect(&cluster.url(shard)).await?;
            let rows = db
                .query(sql::TERMINATE_BACKENDS, &[&SHARDQ_APPLICATION])
                .await?;
            let killed = rows.iter().filter(|row| row.get::<_, bool>(0)).count();
            Ok(format!("shard {shard}: terminated {killed} connections"))
        }
        Fault::CrashRestart(shard) => {
            let down = cluster.crash_restart(shard).await?;
            Ok(format!(
                "shard {shard}: stopped (immediate) and back after {:.1} s",
                down.as_secs_f64()
            ))
        }
        Fault::LockQueueTable { shard, hold } => {
            let mut db = connect(&cluster.url(shard)).await?;
            let tx = db.transaction().await?;
            let asked = Instant::now();
            tx.batch_execute(sql::LOCK_QUEUE_TABLE).await?;
            let waited = asked.elapsed();
            tokio::time::sleep(hold).await;
            tx.commit().await?;
            Ok(format!(
                "shard {shard}: held ACCESS EXCLUSIVE on workflow_status for {:.1} s (waited {:.2} s for it)",
                hold.as_secs_f64(),
                waited.as_secs_f64()
            ))
        }
        Fault::FreezeShard { shard, share } => {
            let hold = phase.mul_f64(share).max(SHORTEST_HOLD);
            let processes = cluster.freeze(shard, hold).await?;
            Ok(format!(
                "shard {shard}: {processes} server processes stopped for {:.1} s, then continued",
                hold.as_secs_f64()
            ))
        }
        Fault::LoseReplies { probability, share } => {
            let hold = phase.mul_f64(share);
            let before = cluster.replies_lost();
            cluster.lose_replies(probability);
            tokio::time::sleep(hold).await;
            cluster.lose_replies(0.0);
            Ok(format!(
                "every shard: {} replies after commit lost in {:.1} s (chance {probability})",
                cluster.replies_lost() - before,
                hold.as_secs_f64()
            ))
        }
        Fault::CompletionStall { min, max } => {
            let hold = rand::thread_rng().gen_range(min..=max);
            let mut db = connect(&cluster.url(shard)).await?;
            let tx = db.transaction().await?;
            let rows = tx.execute(sql::LOCK_RUNNING_ROWS, &[]).await?;
            tokio::time::sleep(hold).await;
            tx.commit().await?;
            Ok(format!(
                "shard {shard}: held the row locks of {rows} running jobs for {:.1} s",
                hold.as_secs_f64()
            ))
        }
        Fault::StopWorker { hold, past_lease } => {
            let pid = fleet.lock().await.pause_random(past_lease)?;
            tokio::time::sleep(hold).await;
            let resumed = fleet.lock().await.resume(pid);
            Ok(format!(
                "pid {pid}: stopped (SIGSTOP) for {:.1} s, then {}",
                hold.as_secs_f64(),
                if resumed { "continued" } else { "found gone" }
            ))
        }
        Fault::Wire {
            shard,
            fault,
            share,
        } => {
            let hold = phase.mul_f64(share).max(SHORTEST_HOLD);
            cluster.wire_fault(shard, Some(fault));
            tokio::time::sleep(hold).await;
            cluster.wire_fault(shard, None);
            Ok(format!(
                "shard {shard}: its proxy {fault:?} for {:.1} s",
                hold.as_secs_f64()
            ))
        }
        Fault::VacuumFull(shard) => {
            let db = connect(&cluster.url(shard)).await?;
            let began = Instant::now();
            db.batch_execute(sql::VACUUM_FULL_QUEUE_TABLE).await?;
            Ok(format!(
                "shard {shard}: VACUUM FULL workflow_status took {:.2} s",
                began.elapsed().as_secs_f64()
            ))
        }
    }
}

/// A plain connection to `url` under [`FAULT_APPLICATION`].
pub async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let mut config: tokio_postgres::Config = url.parse()?;
    config
        .application_name(FAULT_APPLICATION)
        .connect_timeout(CONNECT_TIMEOUT);
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(error = %err, "fault connection ended with an error");
        }
    });
    Ok(client)
}
