//! The fault schedules: which fault fires when. Data only, below the
//! injector (`faults`) and the cluster, which both read it.

use std::time::Duration;

/// When a fault fires, relative to the start of the fault phase.
#[derive(Debug, Clone, Copy)]
pub enum When {
    /// Every period, from one period in.
    Every(Duration),
    /// Once, at this fraction of the phase.
    At(f64),
}

/// One kind of fault.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// SIGKILL a random worker process and start a replacement.
    KillWorker,
    /// `pg_terminate_backend` every shardq connection of a random shard.
    TerminateBackends,
    /// Stop a shard's server in immediate mode (a crash) and start it again.
    CrashRestart(usize),
    /// Hold ACCESS EXCLUSIVE on a shard's `workflow_status` for a while.
    LockQueueTable {
        /// Shard index.
        shard: usize,
        /// How long the lock is held.
        hold: Duration,
    },
    /// `VACUUM FULL workflow_status` on a shard.
    VacuumFull(usize),
    /// Lose the replies of committed statements (claims, completions, lease
    /// extensions…) on every shard: the worker's connection closes after the
    /// server committed, so the worker cannot tell whether it ran.
    LoseReplies {
        /// The chance per committed statement.
        probability: f64,
        /// How long, as a share of the fault phase.
        share: f64,
    },
    /// Freeze a shard's server (SIGSTOP, then SIGCONT): no answer, no error.
    FreezeShard {
        /// Shard index.
        shard: usize,
        /// How long, as a share of the fault phase (at least 3 s).
        share: f64,
    },
    /// Hold the row locks of every running job of a random shard
    /// (`SELECT … FOR UPDATE`) for a while, then commit: completions, lease
    /// extensions and recovery of those rows wait, claims do not.
    CompletionStall {
        /// Shortest hold.
        min: Duration,
        /// Longest hold.
        max: Duration,
    },
    /// SIGSTOP a random worker process, SIGCONT it after `hold`: it is very
    /// likely inside a transaction or holding a key when it stops.
    StopWorker {
        /// How long it stays stopped.
        hold: Duration,
        /// Whether `hold` outlasts the lease: its jobs are recovered while
        /// it still holds whatever it held, and per-key order is no longer
        /// promised for its runs (guarantees hold while leases hold).
        past_lease: bool,
    },
    /// The proxy in front of a shard misbehaves for a while (the workers'
    /// connections only; the enqueuer and the checks go direct).
    Wire {
        /// Shard index.
        shard: usize,
        /// What the proxy does.
        fault: WireFault,
        /// How long, as a share of the fault phase (at least 3 s).
        share: f64,
    },
}

/// What the proxy in front of a shard does during a [`Fault::Wire`].
#[derive(Debug, Clone, Copy)]
pub enum WireFault {
    /// Every reply arrives this much later.
    Slow(Duration),
    /// No byte passes, the sockets stay open.
    Silent,
    /// New connections are refused, open ones reset.
    Refuse,
}

/// The schedule. Shard numbers assume `cluster::SHARDS` = 4: the crash, the lock
/// and the vacuum hit three different shards, shard 0 is frozen once and
/// otherwise only loses connections; every shard loses replies after
/// commits for 30% of the phase.
pub const SCHEDULE: &[(When, Fault)] = &[
    (When::Every(Duration::from_secs(3)), Fault::KillWorker),
    (
        When::Every(Duration::from_secs(5)),
        Fault::TerminateBackends,
    ),
    (When::At(0.25), Fault::CrashRestart(1)),
    (
        When::At(0.40),
        Fault::LockQueueTable {
            shard: 2,
            hold: Duration::from_secs(5),
        },
    ),
    (When::At(0.60), Fault::CrashRestart(1)),
    (When::At(0.75), Fault::VacuumFull(3)),
    (
        When::At(0.45),
        Fault::LoseReplies {
            probability: 0.05,
            share: 0.3,
        },
    ),
    (
        When::At(0.15),
        Fault::FreezeShard {
            shard: 0,
            share: 0.2,
        },
    ),
];

/// The torture schedule (`--torture`). Shard faults are spread so that at
/// most two shards are disturbed at once, and each fault kind hits a shard the
/// previous one left alone; the whole-fleet faults (kills, stops, terminated
/// connections, completion stalls, lost replies) run across them.
pub const TORTURE_SCHEDULE: &[(When, Fault)] = &[
    (When::Every(Duration::from_secs(4)), Fault::KillWorker),
    (
        When::Every(Duration::from_secs(5)),
        Fault::TerminateBackends,
    ),
    (
        When::Every(Duration::from_secs(7)),
        Fault::StopWorker {
            hold: Duration::from_millis(2_500),
            past_lease: false,
        },
    ),
    (
        When::At(0.2),
        Fault::StopWorker {
            hold: Duration::from_secs(20),
            past_lease: true,
        },
    ),
    (
        When::Every(Duration::from_secs(9)),
        Fault::CompletionStall {
            min: Duration::from_secs(2),
            max: Duration::from_secs(4),
        },
    ),
    (
        When::At(0.10),
        Fault::FreezeShard {
            shard: 0,
            share: 0.1,
        },
    ),
    (When::At(0.20), Fault::CrashRestart(1)),
    (
        When::At(0.35),
        Fault::LockQueueTable {
            shard: 2,
            hold: Duration::from_secs(3),
        },
    ),
    (
        When::At(0.45),
        Fault::Wire {
            shard: 3,
            fault: WireFault::Slow(Duration::from_millis(300)),
            share: 0.12,
        },
    ),
    (
        When::At(0.50),
        Fault::LoseReplies {
            probability: 0.05,
            share: 0.2,
        },
    ),
    (
        When::At(0.65),
        Fault::Wire {
            shard: 1,
            fault: WireFault::Silent,
            share: 0.1,
        },
    ),
    (When::At(0.80), Fault::VacuumFull(3)),
    (
        When::At(0.85),
        Fault::Wire {
            shard: 2,
            fault: WireFault::Refuse,
            share: 0.05,
        },
    ),
];

/// The longest period in `schedule`: a shorter phase than twice it would
/// skip a fault.
pub fn longest_period(schedule: &[(When, Fault)]) -> Duration {
    schedule
        .iter()
        .filter_map(|(when, _)| match when {
            When::Every(period) => Some(*period),
            When::At(_) => None,
        })
        .max()
        .unwrap_or(Duration::ZERO)
}

impl Fault {
    /// A short name, the same for every firing of this kind.
    pub fn name(&self) -> &'static str {
        match self {
            Fault::KillWorker => "kill worker",
            Fault::TerminateBackends => "terminate backends",
            Fault::CrashRestart(_) => "crash-restart shard",
            Fault::LockQueueTable { .. } => "lock queue table",
            Fault::VacuumFull(_) => "vacuum full",
            Fault::FreezeShard { .. } => "freeze shard",
            Fault::LoseReplies { .. } => "lose replies",
            Fault::CompletionStall { .. } => "completion stall",
            Fault::StopWorker {
                past_lease: false, ..
            } => "stop worker",
            Fault::StopWorker {
                past_lease: true, ..
            } => "stop worker past its lease",
            Fault::Wire {
                fault: WireFault::Slow(_),
                ..
            } => "slow shard",
            Fault::Wire {
                fault: WireFault::Silent,
                ..
            } => "silent shard",
            Fault::Wire {
                fault: WireFault::Refuse,
                ..
            } => "refusing shard",
        }
    }
}
