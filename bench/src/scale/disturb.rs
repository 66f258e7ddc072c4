//! Disturbances on one shard at a chosen time: an ACCESS EXCLUSIVE lock held
//! for a while, `VACUUM FULL` repeated for a while, a crash restart, a
//! freeze (the server stops answering without closing connections), or a
//! fault of the network path in front of it: slow replies, silence with the
//! sockets open, refused connections. For those the workers reach the shard
//! through a [`LossyProxy`] for the whole run (so what is measured before
//! and after the fault went through it too); the bench's own enqueuer and
//! checks go straight to the server.

use super::cluster::Cluster;
use anyhow::{Context, Result};
use serde::Serialize;
use shardq_harness::lossy_proxy::{Fault, LossyProxy};
use std::time::{Duration, Instant};

/// What to do to the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `BEGIN; LOCK TABLE workflow_status IN ACCESS EXCLUSIVE MODE;` held for
    /// `--disturb-for` seconds, then `COMMIT`.
    AccessExclusive,
    /// `VACUUM FULL workflow_status`, repeated until `--disturb-for` seconds
    /// have passed (at least once); each takes an ACCESS EXCLUSIVE lock.
    VacuumFull,
    /// Immediate stop (like a crash), down for `--disturb-for` seconds, start
    /// (crash recovery). Local shards only.
    Restart,
    /// Every process of the server stopped (SIGSTOP) for `--disturb-for`
    /// seconds, then continued: a hung host. Local shards only.
    Freeze,
    /// Every reply of the server (each exchange up to ReadyForQuery, the
    /// opening of a session too) held `--slow-ms` longer by the proxy for
    /// `--disturb-for` seconds: an overloaded server or a slow link.
    Slow,
    /// The proxy forwards no byte either way for `--disturb-for` seconds while
    /// every socket stays open (new ones are accepted and get nothing); at
    /// the end the connections it touched are closed, as a partition's die.
    Silent,
    /// The proxy resets open connections and every new one for
    /// `--disturb-for` seconds: a host whose server is gone.
    Refuse,
}

impl Kind {
    /// Whether the workers reach the shard through a proxy for this kind.
    pub fn needs_proxy(self) -> bool {
        matches!(self, Kind::Slow | Kind::Silent | Kind::Refuse)
    }
}

/// A planned disturbance.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Plan {
    /// What.
    pub kind: Kind,
    /// Which shard (index).
    pub shard: usize,
    /// Seconds after `go`.
    pub at_s: f64,
    /// For how long (seconds).
    pub for_s: f64,
    /// [`Kind::Slow`]: how much longer each reply takes (ms).
    pub slow_ms: u64,
}

/// When it really happened, in seconds since `go`: from the lock being held
/// (or the server stopping) until it was released (or the server accepted
/// connections again).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Window {
    /// Start.
    pub start_s: f64,
    /// End.
    pub end_s: f64,
}

/// Waits until `plan.at_s` after `go`, then disturbs; `proxy` is the one in
/// front of the shard when [`Kind::needs_proxy`].
pub async fn run(
    cluster: &Cluster,
    plan: Plan,
    go: Instant,
    proxy: Option<&LossyProxy>,
) -> Result<Window> {
    tokio::time::sleep_until((go + Duration::from_secs_f64(plan.at_s)).into()).await;
    let hold = Duration::from_secs_f64(plan.for_s);
    let shard = cluster.admin.get(plan.shard);
    let since = |t: Instant| t.duration_since(go).as_secs_f64();
    match plan.kind {
        Kind::AccessExclusive => {
            let db = shard.client().await?;
            db.batch_execute("BEGIN; LOCK TABLE workflow_status IN ACCESS EXCLUSIVE MODE")
                .await
                .map_err(|e| shard.query_error(e))
                .context("cannot take the ACCESS EXCLUSIVE lock")?;
            let start = Instant::now();
            tokio::time::sleep(hold).await;
            db.batch_execute("COMMIT")
                .await
                .map_err(|e| shard.query_error(e))?;
            Ok(Window {
                start_s: since(start),
                end_s: since(Instant::now()),
            })
        }
        Kind::VacuumFull => {
            let db = shard.client().await?;
            let start = Instant::now();
            loop {
                db.batch_execute("VACUUM FULL workflow_status")
                    .await
                    .map_err(|e| shard.query_error(e))
                    .context("VACUUM FULL failed")?;
                if start.elapsed() >= hold {
                    break;
                }
            }
            Ok(Window {
                start_s: since(start),
                end_s: since(Instant::now()),
            })
        }
        Kind::Freeze => {
            let start = Instant::now();
            cluster.freeze(plan.shard, hold).await?;
            Ok(Window {
                start_s: since(start),
                end_s: since(Instant::now()),
            })
        }
        Kind::Restart => {
            let start = Instant::now();
            cluster.crash_restart(plan.shard, hold).await?;
            Ok(Window {
                start_s: since(start),
                end_s: since(Instant::now()),
            })
        }
        Kind::Slow | Kind::Silent | Kind::Refuse => {
            let proxy = proxy.context("a proxy fault without a proxy in front of the shard")?;
            let fault = match plan.kind {
                Kind::Slow => Fault::Delay(Duration::from_millis(plan.slow_ms)),
                Kind::Silent => Fault::Silent,
                _ => Fault::Refuse,
            };
            let start = Instant::now();
            proxy.set_fault(fault);
            tokio::time::sleep(hold).await;
            proxy.set_fault(Fault::None);
            Ok(Window {
                start_s: since(start),
                end_s: since(Instant::now()),
            })
        }
    }
}
