//! The two profiles of the run. `chaos` is the original mix; `--torture`
//! widens it: two queues sharing key strings, keyed jobs that fail and retry,
//! delayed jobs promoted every 50 ms, small worker buffers, more faults, and
//! monitors (invariant samples, healthy-shard progress) during the run.

use super::names::{CHILD_QUEUE, QUEUE, TORTURE_QUEUE};
use super::schedule::{self, Fault, When};
use serde::Serialize;

/// Which run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// `shardq-bench chaos`.
    Chaos,
    /// `shardq-bench chaos --torture`.
    Torture,
}

/// The worker settings that differ between the profiles.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// `worker.lease_ms`.
    pub lease_ms: u64,
    /// `worker.maintenance_interval_ms`: how often due jobs are promoted.
    pub maintenance_interval_ms: u64,
    /// `worker.buffer_jobs` and `dequeue.batch_size`, when not the defaults.
    pub small_buffers: Option<(usize, u32)>,
}

/// The chaos run's settings: short leases bring a killed worker's jobs back
/// within ~2 s.
const CHAOS_TUNING: Tuning = Tuning {
    lease_ms: 2_000,
    maintenance_interval_ms: 300,
    small_buffers: None,
};

/// The torture run's settings. The lease (extended every third of it)
/// outlives the short stops of a worker (2.5 s) and the completion stalls
/// (up to 4 s), so that per-key order is a guarantee under those faults (it
/// holds only while leases hold); one stop outlasts it on purpose. A killed
/// worker's jobs wait for it. Small buffers are what users with slow jobs
/// set, and the setting under which one sick shard starved the others.
const TORTURE_TUNING: Tuning = Tuning {
    lease_ms: 8_000,
    maintenance_interval_ms: 50,
    small_buffers: Some((200, 50)),
};

impl Profile {
    /// The profile `--torture` asks for.
    pub fn from_flag(torture: bool) -> Profile {
        if torture {
            Profile::Torture
        } else {
            Profile::Chaos
        }
    }

    /// The fault schedule.
    pub fn schedule(self) -> &'static [(When, Fault)] {
        match self {
            Profile::Chaos => schedule::SCHEDULE,
            Profile::Torture => schedule::TORTURE_SCHEDULE,
        }
    }

    /// The queues the checks read (and the workers serve).
    pub fn queues(self) -> &'static [&'static str] {
        match self {
            Profile::Chaos => &[QUEUE],
            Profile::Torture => &[QUEUE, TORTURE_QUEUE],
        }
    }

    /// The queues the workers serve: [`Profile::queues`], and the torture
    /// run's children, whose rows the job checks do not read (they have no
    /// job number of their own; [`super::torture::waits_check`] reads them).
    pub fn served_queues(self) -> &'static [&'static str] {
        match self {
            Profile::Chaos => &[QUEUE],
            Profile::Torture => &[QUEUE, TORTURE_QUEUE, CHILD_QUEUE],
        }
    }

    /// The worker settings.
    pub fn tuning(self) -> Tuning {
        match self {
            Profile::Chaos => CHAOS_TUNING,
            Profile::Torture => TORTURE_TUNING,
        }
    }
}
