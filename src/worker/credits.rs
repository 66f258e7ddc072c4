//! Buffer credits: room for claimed jobs, which bounds the worker's memory
//! and the jobs it holds while their outcomes wait to be written.
//!
//! Each claimed job holds two credits: a *buffer* credit from its claim until
//! its outcome reaches the completer, and a *held* credit from its claim
//! until that outcome is written (or fenced, or given up: the job is then no
//! longer this process's). There are `worker.buffer_jobs` buffer credits and
//! [`HELD_PER_BUFFERED`] times as many held ones.
//!
//! Invariant: a buffer credit is out (taken and not given back) for exactly
//! each job this process claimed whose outcome has not yet reached the
//! completer, and a held credit for exactly each claimed job whose outcome
//! has not yet been written, fenced or given up. A producer takes a whole
//! batch's credits of both kinds before it claims, keeps one of each per job
//! the claim returned and gives the rest back at once; the completer gives a
//! buffer credit back as each outcome reaches it, and the held credits of a
//! write when that write ends. Hence:
//!
//! - the jobs between a claim and the completer's input (dispatched, queued
//!   for a slot, running, or their completions in flight) never number more
//!   than `worker.buffer_jobs`, and the channels carrying them can be bounded
//!   by that number without a send there ever waiting: an executor slot never
//!   waits on the completions channel, and the completer, which always
//!   receives, never waits on anything the slots or producers hold;
//! - the outcomes waiting at the completer never number more than
//!   `HELD_PER_BUFFERED × worker.buffer_jobs`: while writes are stuck,
//!   claims stop instead of growing the pending batch without bound.
//!
//! Held credits are the larger budget so that outcomes stuck on one shard
//! (up to a buffer's worth) do not take buffer room from the healthy shards.

use std::sync::Arc;
use tokio::sync::Semaphore;

/// Held credits per buffer credit: room for as many outcomes waiting to be
/// written as there are jobs in the buffer.
pub(crate) const HELD_PER_BUFFERED: usize = 2;

/// The credits of one worker process; clones share them.
#[derive(Debug, Clone)]
pub(crate) struct BufferCredits {
    room: Arc<Semaphore>,
    held: Arc<Semaphore>,
}

impl BufferCredits {
    /// `total` buffer credits and `HELD_PER_BUFFERED × total` held ones,
    /// all free.
    pub(crate) fn new(total: usize) -> Self {
        BufferCredits {
            room: Arc::new(Semaphore::new(total)),
            held: Arc::new(Semaphore::new(total * HELD_PER_BUFFERED)),
        }
    }

    /// Waits until `n` credits of each kind are free and takes them (held
    /// first, then buffer: both are given back by the completer, which waits
    /// on neither, so the order cannot deadlock). Cancel safe: a take that
    /// is dropped while waiting takes nothing.
    pub(crate) async fn take(&self, n: u32) -> Credits {
        let held = self.held.clone().acquire_many_owned(n);
        let held = held
            .await
            .expect("the credits' semaphores are never closed");
        let room = self.room.clone().acquire_many_owned(n);
        let room = room
            .await
            .expect("the credits' semaphores are never closed");
        held.forget();
        room.forget();
        Credits {
            credits: self.clone(),
            left: n as usize,
        }
    }

    /// Gives back `n` buffer credits: outcomes of `n` jobs reached the completer.
    pub(crate) fn reached_completer(&self, n: usize) {
        if n > 0 {
            self.room.add_permits(n);
        }
    }

    /// Gives back `n` held credits: outcomes of `n` jobs were written,
    /// fenced or given up.
    pub(crate) fn settled(&self, n: usize) {
        if n > 0 {
            self.held.add_permits(n);
        }
    }

    /// Buffer credits free now.
    #[cfg(test)]
    pub(crate) fn free(&self) -> usize {
        self.room.available_permits()
    }

    /// Held credits free now.
    #[cfg(test)]
    pub(crate) fn free_held(&self) -> usize {
        self.held.available_permits()
    }
}

/// Credits taken for one claim. Dropped unused (a claim that found nothing,
/// a producer stopped by shutdown), they all go back.
#[derive(Debug)]
#[must_use = "credits dropped unused go back at once"]
pub(crate) struct Credits {
    credits: BufferCredits,
    left: usize,
}

impl Credits {
    /// Keeps `claimed` credits of each kind, one per job the claim returned
    /// (they go back by [`BufferCredits::reached_completer`] and
    /// [`BufferCredits::settled`]), and gives the rest back now.
    pub(crate) fn keep(mut self, claimed: usize) {
        self.left -= claimed.min(self.left);
    }
}

impl Drop for Credits {
    fn drop(&mut self) {
        self.credits.reached_completer(self.left);
        self.credits.settled(self.left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_claim_keeps_what_it_claimed_and_gives_back_the_rest() {
        let credits = BufferCredits::new(10);
        credits.take(4).await.keep(3);
        assert_eq!((credits.free(), credits.free_held()), (7, 17));
        credits.reached_completer(3);
        assert_eq!((credits.free(), credits.free_held()), (10, 17));
        credits.settled(3);
        assert_eq!(credits.free_held(), 20);
    }

    #[tokio::test]
    async fn unused_credits_go_back_and_keep_never_takes_more() {
        let credits = BufferCredits::new(10);
        drop(credits.take(4).await);
        assert_eq!((credits.free(), credits.free_held()), (10, 20));
        credits.take(4).await.keep(9);
        assert_eq!((credits.free(), credits.free_held()), (6, 16));
    }

    #[tokio::test(start_paused = true)]
    async fn a_take_waits_for_a_whole_batch() {
        let credits = BufferCredits::new(5);
        credits.take(4).await.keep(4);
        let waiting = tokio::spawn({
            let credits = credits.clone();
            async move { credits.take(4).await.keep(4) }
        });
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert!(!waiting.is_finished());
        credits.reached_completer(3);
        waiting.await.unwrap();
        assert_eq!(credits.free(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_not_yet_written_stop_claims_once_the_held_credits_run_out() {
        let credits = BufferCredits::new(2);
        // Two claims of two whose outcomes all reached the completer, unwritten.
        for _ in 0..2 {
            credits.take(2).await.keep(2);
            credits.reached_completer(2);
        }
        assert_eq!((credits.free(), credits.free_held()), (2, 0));
        let waiting = tokio::spawn({
            let credits = credits.clone();
            async move { credits.take(2).await.keep(2) }
        });
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert!(!waiting.is_finished(), "no claim while 4 outcomes wait");
        credits.settled(2);
        waiting.await.unwrap();
        assert_eq!((credits.free(), credits.free_held()), (0, 0));
    }
}
