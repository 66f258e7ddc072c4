//! A run's view of its workflow's step log: read from the shard at the
//! run's first step, then kept in memory, so a step that has not run costs
//! one round trip (its record), not two (a read, then the record). The
//! workflow's first claim ever reads nothing: its log is empty
//! ([`StepLog::for_claim`]).
//!
//! A step found in the log is final (a recorded output never changes). A
//! step missing from it is known to be unrecorded only while this claim's
//! lease runs, and while the worker cannot have been judged silent: no
//! other claim can take the workflow, nor record its steps, before the
//! lease ends, unless the worker's heartbeats stop for
//! [`HEARTBEAT_TTL`] (a paused process: its jobs are handed back without
//! waiting for their leases). So until the earlier of the lease's end (as
//! the shard's clock counted it at the read, started from before the read
//! was sent) and [`TRUSTED_AT_MOST`] after the read, a miss is answered
//! from memory. Past that, a miss reads the log again (the leaser extends
//! the lease meanwhile): so a run that lost its lease finds the steps the
//! new owner recorded, as it did when every step was read first, or is
//! told at once that it no longer holds the workflow, before running the
//! step. A step this run records is added, so a second call of the same
//! name returns the first call's output, as the shard would.

use crate::heartbeat::{HEARTBEAT_INTERVAL, HEARTBEAT_TTL};
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use crate::store::steps;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How long after a read (or a first claim) a miss is trusted at most: a
/// heartbeat was sent at most [`HEARTBEAT_INTERVAL`] before, so no silent
/// worker's release can have taken the workflow within this.
pub(crate) const TRUSTED_AT_MOST: Duration = HEARTBEAT_TTL.saturating_sub(HEARTBEAT_INTERVAL);

/// What the log says of one step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Logged {
    /// Recorded, with this output (`None`: SQL NULL).
    Recorded(Option<Value>),
    /// Not recorded, and this claim holds the workflow.
    NotRecorded,
    /// Not recorded, and this claim no longer holds the workflow.
    NotHeld,
}

#[derive(Debug, Default)]
struct Read {
    steps: HashMap<String, Option<Value>>,
    /// A miss is final until then; `None`: not read yet.
    trusted_until: Option<Instant>,
    held: bool,
}

/// A run's step log (see the module's comment).
#[derive(Debug, Default)]
pub(crate) struct StepLog {
    read: Mutex<Read>,
}

/// Whom a read of the log is for: the workflow and the claim running it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim<'a> {
    pub(crate) shard: &'a Shard,
    pub(crate) id: JobId,
    pub(crate) owner: &'a str,
    pub(crate) fence: i64,
}

impl StepLog {
    /// The log as a claim with this `fence` and `attempt`, holding the
    /// workflow until `held_until`, knows it before reading it: the
    /// workflow's first claim ever (fence 1, attempt 1) knows it empty
    /// until then (no claim before it recorded a step, and no other one
    /// can before its lease ends), so its first steps cost their record
    /// alone; any later claim reads it at its first step.
    pub(crate) fn for_claim(fence: i64, attempt: i32, held_until: Instant) -> StepLog {
        let first = fence == 1 && attempt == 1;
        // Read the clock only for a first claim: this runs for every job.
        let trusted_until = first.then(|| held_until.min(Instant::now() + TRUSTED_AT_MOST));
        StepLog {
            read: Mutex::new(Read {
                steps: HashMap::new(),
                trusted_until,
                held: first,
            }),
        }
    }

    /// What the log says of step `name`, reading it from the shard when
    /// memory cannot answer.
    pub(crate) async fn get(&self, claim: Claim<'_>, name: &str) -> Result<Logged, ShardError> {
        if let Some(known) = self.known_in_memory(name) {
            return Ok(known);
        }
        let sent = Instant::now();
        let log = steps::log(claim.shard, claim.id, claim.owner, claim.fence).await?;
        let mut read = self.read.lock().expect("step log");
        read.steps.extend(log.steps);
        read.held = log.held;
        read.trusted_until = Some(sent + log.lease_left.min(TRUSTED_AT_MOST));
        Ok(match read.steps.get(name) {
            Some(output) => Logged::Recorded(output.clone()),
            None if read.held => Logged::NotRecorded,
            None => Logged::NotHeld,
        })
    }

    fn known_in_memory(&self, name: &str) -> Option<Logged> {
        let read = self.read.lock().expect("step log");
        if let Some(output) = read.steps.get(name) {
            return Some(Logged::Recorded(output.clone()));
        }
        let trusted = read.trusted_until.is_some_and(|t| Instant::now() < t);
        (trusted && read.held).then_some(Logged::NotRecorded)
    }

    /// Notes that step `name` is recorded with `output`.
    pub(crate) fn recorded(&self, name: &str, output: Value) {
        self.read
            .lock()
            .expect("step log")
            .steps
            .entry(name.to_string())
            .or_insert(Some(output));
    }
}
