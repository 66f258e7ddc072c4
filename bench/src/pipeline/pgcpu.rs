//! Where the database's CPU goes during a run: client backends (the
//! statements), autovacuum, and the background processes (WAL writer,
//! checkpointer, background writer).
//!
//! The total comes from the postmaster's accounting and is exact; the split
//! comes from sampling its children's CPU every 100 ms, so a process that
//! exits loses at most its last 100 ms, which lands in `other` (together with
//! the postmaster itself).

use crate::procfs::{self, Clock};
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often the server's processes are sampled (a /proc scan costs ~1 ms).
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// What a server process does, from its title (`postgres: autovacuum worker …`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Role {
    Backend,
    Autovacuum,
    Background,
}

/// The process titles of PostgreSQL's background processes (15).
const BACKGROUND_TITLES: &[&str] = &[
    "checkpointer",
    "background writer",
    "walwriter",
    "autovacuum launcher",
    "logical replication launcher",
    "archiver",
    "stats collector",
];

/// Titles of autovacuum's worker processes.
const AUTOVACUUM_TITLE: &str = "autovacuum worker";

/// CPU seconds of the server over a run, split by role.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PgCpu {
    /// Everything (exact).
    pub total_s: f64,
    /// Client connections running statements.
    pub backends_s: f64,
    /// Autovacuum workers.
    pub autovacuum_s: f64,
    /// WAL writer, checkpointer, background writer, launchers.
    pub background_s: f64,
    /// The postmaster, and what sampling missed of processes that exited.
    pub other_s: f64,
}

/// Samples the server's processes until [`Sampler::finish`].
pub struct Sampler {
    postmaster: u32,
    total_before: u64,
    stop: CancellationToken,
    task: JoinHandle<HashMap<Role, u64>>,
}

impl Sampler {
    /// Starts sampling the server whose postmaster is `postmaster`.
    pub fn start(postmaster: u32) -> Result<Sampler> {
        let total_before = procfs::server_cpu_ticks(postmaster)?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(sample(postmaster, stop.clone()));
        Ok(Sampler {
            postmaster,
            total_before,
            stop,
            task,
        })
    }

    /// Stops sampling and adds up.
    pub async fn finish(self, clock: Clock) -> Result<PgCpu> {
        self.stop.cancel();
        let by_role = self.task.await.context("the CPU sampler panicked")?;
        let total = procfs::server_cpu_ticks(self.postmaster)?.saturating_sub(self.total_before);
        let role = |r| by_role.get(&r).copied().unwrap_or(0);
        let known = role(Role::Backend) + role(Role::Autovacuum) + role(Role::Background);
        Ok(PgCpu {
            total_s: clock.secs(total),
            backends_s: clock.secs(role(Role::Backend)),
            autovacuum_s: clock.secs(role(Role::Autovacuum)),
            background_s: clock.secs(role(Role::Background)),
            other_s: clock.secs(total.saturating_sub(known)),
        })
    }
}

/// Per child pid: its role, its CPU when first seen, its CPU when last seen.
type Seen = HashMap<u32, (Role, u64, u64)>;

async fn sample(postmaster: u32, stop: CancellationToken) -> HashMap<Role, u64> {
    let mut seen = Seen::new();
    // Children alive now count from their current CPU; later ones from zero.
    scan(postmaster, &mut seen, true);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(SAMPLE_EVERY) => scan(postmaster, &mut seen, false),
        }
    }
    scan(postmaster, &mut seen, false);
    let mut by_role = HashMap::new();
    for (role, first, last) in seen.into_values() {
        *by_role.entry(role).or_insert(0) += last - first;
    }
    by_role
}

fn scan(postmaster: u32, seen: &mut Seen, baseline: bool) {
    for (pid, ticks) in procfs::children_cpu_ticks(postmaster) {
        seen.entry(pid)
            .and_modify(|(_, _, last)| *last = (*last).max(ticks))
            .or_insert_with(|| {
                let first = if baseline { ticks } else { 0 };
                (role_of(pid), first, ticks)
            });
    }
}

fn role_of(pid: u32) -> Role {
    let title = procfs::cmdline(pid).unwrap_or_default();
    let title = title.strip_prefix("postgres: ").unwrap_or(&title);
    if title.starts_with(AUTOVACUUM_TITLE) {
        Role::Autovacuum
    } else if BACKGROUND_TITLES.iter().any(|t| title.starts_with(t)) {
        Role::Background
    } else {
        Role::Backend
    }
}
