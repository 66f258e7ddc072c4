//! Buffer credits: room for claimed-but-unfinished jobs, which bounds the
//! worker's memory.
//!
//! Invariant: a credit is out (taken and not given back) for exactly each job
//! this process claimed whose outcome has not yet reached the completer. A
//! producer takes a whole batch's credits before it claims, keeps one per job
//! the claim returned and gives the rest back at once; the completer gives one
//! back as each outcome reaches it (a waiting write is a few bytes, so writes
//! stuck on one shard never stop claims on the others). Hence the jobs
//! between a claim and the completer's input (dispatched, queued for a slot,
//! running, or their completions in flight) never number more than the
//! credits, `worker.buffer_jobs`, and the channels carrying them can be
//! bounded by that number without a send there ever waiting.

use std::sync::Arc;
use tokio::sync::Semaphore;

/// The credits of one worker process; clones share them.
#[derive(Debug, Clone)]
pub(crate) struct BufferCredits {
    room: Arc<Semaphore>,
}

impl BufferCredits {
    /// `total` credits, all free.
    pub fn new(total: usize) -> Self {
        BufferCredits {
            room: Arc::new(Semaphore::new(total)),
        }
    }

    /// Waits until `n` credits are free and takes them. Cancel safe: a take
    /// that is dropped while waiting takes nothing.
    pub async fn take(&self, n: u32) -> Credits {
        let permit = self
            .room
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("the credits' semaphore is never closed");
        permit.forget();
        Credits {
            credits: self.clone(),
            left: n as usize,
        }
    }

    /// Gives back `n` credits: outcomes of `n` jobs reached the completer.
    pub fn give_back(&self, n: usize) {
        if n > 0 {
            self.room.add_permits(n);
        }
    }

    /// Credits free now.
    #[cfg(test)]
    pub fn free(&self) -> usize {
        self.room.available_permits()
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
    /// Keeps `claimed` credits, one per job the claim returned (each goes back
    /// by [`BufferCredits::give_back`] when that job's outcome reaches the
    /// completer), and gives the rest back now.
    pub fn keep(mut self, claimed: usize) {
        self.left -= claimed.min(self.left);
    }
}

impl Drop for Credits {
    fn drop(&mut self) {
        self.credits.give_back(self.left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_claim_keeps_what_it_claimed_and_gives_back_the_rest() {
        let credits = BufferCredits::new(10);
        credits.take(4).await.keep(3);
        assert_eq!(credits.free(), 7);
        credits.give_back(3);
        assert_eq!(credits.free(), 10);
    }

    #[tokio::test]
    async fn unused_credits_go_back_and_keep_never_takes_more() {
        let credits = BufferCredits::new(10);
        drop(credits.take(4).await);
        assert_eq!(credits.free(), 10);
        credits.take(4).await.keep(9);
        assert_eq!(credits.free(), 6);
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
        credits.give_back(3);
        waiting.await.unwrap();
        assert_eq!(credits.free(), 0);
    }
}
