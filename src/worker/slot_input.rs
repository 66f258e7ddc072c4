//! What an executor slot runs next: keyed work first (a key's queue never
//! waits behind unkeyed jobs that other slots could take), and a sick
//! shard's job only when nothing else is there to run (see `set_aside`).

use super::set_aside::SetAside;
use crate::job::ClaimedJob;
use std::sync::{Mutex, MutexGuard};
use tokio::sync::mpsc::{self, error::TryRecvError};
use tokio::sync::Notify;

/// The jobs every slot of a process set aside, and a signal to slots that
/// wait for input when unkeyed ones (which any of them may run) are added.
#[derive(Debug)]
pub(crate) struct SetAsideJobs {
    jobs: Mutex<SetAside>,
    added: Notify,
}

impl SetAsideJobs {
    /// Nothing set aside, for `slots` slots and `shards` shards.
    pub(crate) fn new(slots: usize, shards: usize) -> Self {
        SetAsideJobs {
            jobs: Mutex::new(SetAside::new(slots, shards)),
            added: Notify::new(),
        }
    }

    /// Every job set aside, to be released (at shutdown, once the slots
    /// stopped).
    pub(crate) fn drain(&self) -> Vec<ClaimedJob> {
        self.lock().drain()
    }

    fn lock(&self) -> MutexGuard<'_, SetAside> {
        self.jobs.lock().expect("jobs set aside")
    }
}

/// One slot's inputs: its own queue (the keyed jobs that hash to it), the
/// unkeyed queue every slot serves, and the jobs set aside.
pub(crate) struct SlotInputs {
    /// This slot's number (its keyed jobs set aside are its own).
    pub slot: usize,
    pub own: mpsc::Receiver<ClaimedJob>,
    pub unkeyed: async_channel::Receiver<ClaimedJob>,
    pub set_aside: std::sync::Arc<SetAsideJobs>,
}

/// Which inputs are still open when nothing could be taken.
#[derive(Debug, Clone, Copy)]
struct Open {
    own: bool,
    unkeyed: bool,
}

impl SlotInputs {
    /// The next job to run, given which shards are `sick` now: `None` once
    /// both queues are closed and drained and nothing waits for this slot.
    /// While jobs it may run are set aside, it never waits: with nothing
    /// else to run, it runs the oldest of them.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it waits only on the two receives (both cancel safe)
    /// and on the set-aside signal; a received job is set aside or returned
    /// before the next wait.
    pub(crate) async fn next(&mut self, sick: impl Fn(usize) -> bool) -> Option<ClaimedJob> {
        let mut received = None;
        let set_aside = self.set_aside.clone();
        loop {
            // Enabled before the look, so an addition after it still wakes us.
            let added = set_aside.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            let open = match self.pick(received.take(), &sick) {
                Ok(job) => return Some(job),
                Err(open) => open,
            };
            if !open.own && !open.unkeyed {
                return None;
            }
            // A `None` here (an input closed meanwhile, or jobs set aside)
            // sends us round to look again.
            received = tokio::select! {
                biased;
                job = self.own.recv(), if open.own => job,
                job = self.unkeyed.recv(), if open.unkeyed => job.ok(),
                () = &mut added => None,
            };
        }
    }

    /// Without waiting: `received` first, then what waits set aside for a
    /// shard well again, then the queues (setting aside what must wait),
    /// then the oldest job set aside. Which inputs are open when none gave
    /// a job.
    fn pick(
        &mut self,
        mut received: Option<ClaimedJob>,
        sick: &impl Fn(usize) -> bool,
    ) -> Result<ClaimedJob, Open> {
        let SlotInputs {
            slot,
            own,
            unkeyed,
            set_aside,
        } = self;
        let mut aside = set_aside.lock();
        let mut shared_added = false;
        let picked = loop {
            let job = match received.take() {
                Some(job) => job,
                None => {
                    if let Some(job) = aside.take_ready(*slot, sick) {
                        break Ok(job);
                    }
                    match try_recv(own, unkeyed) {
                        Ok(job) => job,
                        Err(open) => break aside.take_oldest(*slot).ok_or(open),
                    }
                }
            };
            let unkeyed = job.ordering_key.is_none();
            match aside.offer(*slot, job, sick) {
                Some(job) => break Ok(job),
                None => shared_added |= unkeyed,
            }
        };
        drop(aside);
        if shared_added {
            // Idle slots may take them (this one runs one at most).
            set_aside.added.notify_waiters();
        }
        picked
    }

    /// The jobs left in this slot's own queue (at shutdown, to be released).
    pub(crate) fn unstarted(mut self) -> Vec<ClaimedJob> {
        let mut left = Vec::new();
        while let Ok(job) = self.own.try_recv() {
            left.push(job);
        }
        left
    }
}

/// A job from a slot's own queue, else from the unkeyed one.
fn try_recv(
    own: &mut mpsc::Receiver<ClaimedJob>,
    unkeyed: &async_channel::Receiver<ClaimedJob>,
) -> Result<ClaimedJob, Open> {
    let own_open = match own.try_recv() {
        Ok(job) => return Ok(job),
        Err(err) => err != TryRecvError::Disconnected,
    };
    match unkeyed.try_recv() {
        Ok(job) => Ok(job),
        Err(err) => Err(Open {
            own: own_open,
            unkeyed: !err.is_closed(),
        }),
    }
}
