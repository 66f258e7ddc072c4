//! Wake-ups: one dedicated `LISTEN shardq_ready` connection per shard per
//! process (not per producer). A notification names a queue that just got
//! ready jobs on that shard; it marks that (shard, queue) target ready, so
//! the next producer skips its empty backoff there, and wakes the producers
//! that sleep. Polling stays: it is the fallback when a notification is
//! lost, when the listener is down, and behind a transaction pooler, where
//! `LISTEN` cannot work and no listener is opened.
//!
//! An empty payload (no queue has an empty name) rings the shard's relay
//! bell instead ([`RelayBells`]): a child's final status there may owe a
//! parent on another shard its wake.

use super::target::Target;
use crate::shards::Shard;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The channel that ready jobs are announced on (`store::sql`).
pub(crate) const CHANNEL: &str = "shardq_ready";

/// Pause before a listener connects again after its connection ended.
const RECONNECT: Duration = Duration::from_secs(1);

/// Per shard, the bell of the relay of children's wakes
/// (`worker::wake_relay`): rung by the shard's listener when a completion
/// there left a child's wake it could not settle, a parent's on another
/// shard (`shardq_complete_many` notifies), so the relay's next pass need
/// not wait for its timer.
pub(crate) struct RelayBells {
    bells: Vec<Notify>,
    heard: Vec<AtomicBool>,
}

impl RelayBells {
    /// Bells for `shards` shards, none rung, no listener up.
    pub(crate) fn new(shards: usize) -> RelayBells {
        RelayBells {
            bells: (0..shards).map(|_| Notify::new()).collect(),
            heard: (0..shards).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Waits until shard `shard`'s bell rings (at once when it rang since
    /// the last wait).
    pub(crate) async fn rung(&self, shard: usize) {
        self.bells[shard].notified().await;
    }

    /// Whether shard `shard`'s bell can ring now (its listener is up).
    pub(crate) fn heard(&self, shard: usize) -> bool {
        self.heard[shard].load(Ordering::Acquire)
    }
}

/// Ready marks per (shard, queue) target, and the producers' alarm clock.
pub(crate) struct Wakeups {
    targets: Vec<Target>,
    ready: Vec<AtomicBool>,
    listening: Vec<AtomicBool>,
    notify: Notify,
    relay: Arc<RelayBells>,
}

impl Wakeups {
    /// Marks for `targets`, over `shards` shards, none set; `relay`'s
    /// bells rung on the relay's announcements.
    pub(crate) fn new(targets: &[Target], shards: usize, relay: Arc<RelayBells>) -> Wakeups {
        Wakeups {
            targets: targets.to_vec(),
            ready: targets.iter().map(|_| AtomicBool::new(false)).collect(),
            listening: (0..shards).map(|_| AtomicBool::new(false)).collect(),
            notify: Notify::new(),
            relay,
        }
    }

    /// Records whether shard `shard`'s listener is up, and rings its relay
    /// (whose timer depends on it; notifications may have been missed).
    fn set_listening(&self, shard: usize, up: bool) {
        self.listening[shard].store(up, Ordering::Release);
        self.relay.heard[shard].store(up, Ordering::Release);
        self.relay.bells[shard].notify_one();
    }

    /// Whether target `index` was announced ready since the last call (and
    /// clears the mark).
    pub(crate) fn take(&self, index: usize) -> bool {
        self.ready[index].swap(false, Ordering::AcqRel)
    }

    /// Whether shard `shard` has a listener now (so its idle polls can be rare).
    pub(crate) fn listening(&self, shard: usize) -> bool {
        self.listening[shard].load(Ordering::Acquire)
    }

    /// Sleeps until `until`, or until a notification arrives (one sleeping
    /// producer wakes per notification: more would race for the same slots).
    pub(crate) async fn sleep_until(&self, until: Instant) {
        let notified = self.notify.notified();
        tokio::select! {
            _ = tokio::time::sleep_until(until.into()) => {}
            _ = notified => {}
        }
    }

    /// `queue` got ready jobs on `shard` (an empty one: the relay's bell).
    fn wake(&self, shard: usize, queue: &str) {
        if queue.is_empty() {
            self.relay.bells[shard].notify_one();
            return;
        }
        let mut any = false;
        for (i, t) in self.targets.iter().enumerate() {
            if t.shard == shard && t.queue == queue {
                self.ready[i].store(true, Ordering::Release);
                any = true;
            }
        }
        if any {
            self.notify.notify_one();
        }
    }
}

/// Listens on `shard` until `stop`, reconnecting after failures.
pub(crate) async fn listen(shard: Shard, wakeups: Arc<Wakeups>, stop: CancellationToken) {
    loop {
        let mut listener = tokio::select! {
            _ = stop.cancelled() => return,
            opened = shard.listen(CHANNEL) => match opened {
                Ok(Some(listener)) => listener,
                // Behind a pooler: polling only.
                Ok(None) => return,
                Err(err) => {
                    tracing::debug!(shard = %shard.name, error = %crate::error_chain::error_chain(&err), "listener cannot connect");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(RECONNECT) => continue,
                    }
                }
            },
        };
        wakeups.set_listening(shard.index, true);
        // Anything announced while it was down is found by the next poll.
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                payload = listener.payloads.recv() => match payload {
                    Some(queue) => wakeups.wake(shard.index, &queue),
                    None => break,
                },
            }
        }
        wakeups.set_listening(shard.index, false);
        tracing::debug!(shard = %shard.name, "listener connection ended; reconnecting");
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(RECONNECT) => {}
        }
    }
}
