//! Buffered jobs of sick shards, set aside by the executor slots.
//!
//! While a shard is sick (its producers skip it, or its outcomes cannot be
//! written), running the jobs of it that are already buffered takes executor
//! time from the healthy shards' jobs, and their outcomes could not be
//! written anyway: with a buffer of 4,000 jobs, 2,000 of a refusing shard's
//! took 40 % of a fleet's executor time (bench round 9). So a slot runs a
//! sick shard's job only when it has nothing else to run; the others wait
//! here until their shard is well again.
//!
//! Order: a key's jobs are all on one shard and all reach one slot, so the
//! jobs of a shard wait in line, first in, first out: keyed ones per slot
//! (only their key's slot may run them), unkeyed ones in one line per shard
//! that any slot takes from. Once a job waits, every later job of its line
//! waits behind it, sick shard or not, so the waiting jobs of a shard that
//! is well again run before newer ones of that shard.
//!
//! Pure state: which shards are sick is passed in, so it is tested without
//! a database or a clock.

use crate::job::ClaimedJob;
use std::collections::VecDeque;

/// The jobs set aside, in lines per shard.
#[derive(Debug)]
pub(crate) struct SetAside {
    /// Per shard: unkeyed jobs, oldest first; any slot runs them.
    unkeyed: Vec<VecDeque<Waiting>>,
    /// Per slot, per shard: keyed jobs, oldest first; only that slot runs them.
    keyed: Vec<Vec<VecDeque<Waiting>>>,
    /// Numbers the jobs as they are set aside, so the oldest is known.
    next: u64,
}

#[derive(Debug)]
struct Waiting {
    order: u64,
    job: ClaimedJob,
}

/// One line of jobs: a shard's unkeyed jobs, or its keyed ones of one slot.
#[derive(Debug, Clone, Copy)]
enum Line {
    Unkeyed(usize),
    Keyed(usize),
}

impl SetAside {
    /// Nothing set aside, for `slots` slots and `shards` shards.
    pub(crate) fn new(slots: usize, shards: usize) -> Self {
        SetAside {
            unkeyed: (0..shards).map(|_| VecDeque::new()).collect(),
            keyed: (0..slots)
                .map(|_| (0..shards).map(|_| VecDeque::new()).collect())
                .collect(),
            next: 0,
        }
    }

    /// Slot `slot` received `job`: returns it to run now, or `None` when it
    /// was set aside (its shard is sick, or jobs of its line wait already).
    pub(crate) fn offer(
        &mut self,
        slot: usize,
        job: ClaimedJob,
        sick: impl Fn(usize) -> bool,
    ) -> Option<ClaimedJob> {
        let line = match job.ordering_key {
            Some(_) => Line::Keyed(job.shard),
            None => Line::Unkeyed(job.shard),
        };
        let order = self.next;
        let waiting = self.line(slot, line);
        if waiting.is_empty() && !sick(job.shard) {
            return Some(job);
        }
        waiting.push_back(Waiting { order, job });
        self.next += 1;
        None
    }

    /// The oldest job slot `slot` may run whose shard is well now.
    pub(crate) fn take_ready(
        &mut self,
        slot: usize,
        sick: impl Fn(usize) -> bool,
    ) -> Option<ClaimedJob> {
        self.take_oldest_where(slot, |shard| !sick(shard))
    }

    /// The oldest job slot `slot` may run, sick shard or not: for a slot
    /// that has nothing else to run (it never idles while jobs wait).
    pub(crate) fn take_oldest(&mut self, slot: usize) -> Option<ClaimedJob> {
        self.take_oldest_where(slot, |_| true)
    }

    /// Every job set aside (at shutdown, to be released).
    pub(crate) fn drain(&mut self) -> Vec<ClaimedJob> {
        let lines = self
            .unkeyed
            .iter_mut()
            .chain(self.keyed.iter_mut().flatten());
        let mut all: Vec<Waiting> = lines.flat_map(|line| line.drain(..)).collect();
        all.sort_by_key(|w| w.order);
        all.into_iter().map(|w| w.job).collect()
    }

    /// Jobs set aside.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let lines = self.unkeyed.iter().chain(self.keyed.iter().flatten());
        lines.map(VecDeque::len).sum()
    }

    fn line(&mut self, slot: usize, line: Line) -> &mut VecDeque<Waiting> {
        match line {
            Line::Unkeyed(shard) => &mut self.unkeyed[shard],
            Line::Keyed(shard) => &mut self.keyed[slot][shard],
        }
    }

    /// The oldest front of slot `slot`'s lines (its keyed ones and the
    /// shared unkeyed ones) of a shard for which `ok` holds; `ok` is asked
    /// only about shards with jobs waiting.
    fn take_oldest_where(&mut self, slot: usize, ok: impl Fn(usize) -> bool) -> Option<ClaimedJob> {
        let mut oldest: Option<(u64, Line)> = None;
        for shard in 0..self.unkeyed.len() {
            let fronts = [
                (Line::Unkeyed(shard), self.unkeyed[shard].front()),
                (Line::Keyed(shard), self.keyed[slot][shard].front()),
            ];
            for (line, front) in fronts {
                let Some(front) = front else { continue };
                if oldest.is_some_and(|(order, _)| order < front.order) || !ok(shard) {
                    continue;
                }
                oldest = Some((front.order, line));
            }
        }
        let (_, line) = oldest?;
        self.line(slot, line).pop_front().map(|w| w.job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64, shard: usize, key: Option<&str>) -> ClaimedJob {
        ClaimedJob::for_test(id, shard, key)
    }

    fn id(job: Option<ClaimedJob>) -> Option<i64> {
        job.map(|j| j.id.id)
    }

    /// Shard 0 is sick.
    fn sick_0(shard: usize) -> bool {
        shard == 0
    }

    fn none_sick(_: usize) -> bool {
        false
    }

    #[test]
    fn a_healthy_shards_job_runs_at_once_a_sick_shards_waits() {
        let mut aside = SetAside::new(2, 2);
        assert_eq!(id(aside.offer(0, job(1, 1, None), sick_0)), Some(1));
        assert_eq!(id(aside.offer(0, job(2, 0, None), sick_0)), None);
        assert_eq!(id(aside.offer(0, job(3, 0, Some("k")), sick_0)), None);
        assert_eq!(aside.len(), 2);
        assert_eq!(
            id(aside.take_ready(0, sick_0)),
            None,
            "shard 0 is still sick"
        );
        assert_eq!(id(aside.offer(0, job(4, 1, Some("k")), sick_0)), Some(4));
    }

    #[test]
    fn a_slot_with_nothing_else_runs_the_oldest_job_set_aside() {
        let mut aside = SetAside::new(2, 2);
        aside.offer(0, job(1, 0, Some("k")), sick_0);
        aside.offer(1, job(2, 0, None), sick_0);
        aside.offer(0, job(3, 0, None), sick_0);
        assert_eq!(id(aside.take_oldest(0)), Some(1));
        assert_eq!(id(aside.take_oldest(0)), Some(2));
        assert_eq!(id(aside.take_oldest(0)), Some(3));
        assert_eq!(id(aside.take_oldest(0)), None);
    }

    #[test]
    fn keyed_jobs_wait_for_their_own_slot_unkeyed_ones_for_any() {
        let mut aside = SetAside::new(2, 1);
        let sick = |_| true;
        aside.offer(0, job(1, 0, Some("k")), sick);
        aside.offer(0, job(2, 0, None), sick);
        assert_eq!(id(aside.take_oldest(1)), Some(2), "any slot takes unkeyed");
        assert_eq!(
            id(aside.take_oldest(1)),
            None,
            "slot 0's key is not slot 1's"
        );
        assert_eq!(id(aside.take_ready(0, none_sick)), Some(1));
    }

    #[test]
    fn once_a_keyed_job_waits_later_ones_of_its_shard_wait_behind_it_even_when_it_is_well() {
        let mut aside = SetAside::new(1, 2);
        aside.offer(0, job(1, 0, Some("k")), sick_0);
        // Shard 0 is well again before slot 0 looked at what waits: the
        // next job of the key still goes behind the first.
        assert_eq!(id(aside.offer(0, job(2, 0, Some("k")), none_sick)), None);
        // Another shard's job is not held up.
        assert_eq!(id(aside.offer(0, job(3, 1, Some("j")), none_sick)), Some(3));
        assert_eq!(id(aside.take_ready(0, none_sick)), Some(1));
        assert_eq!(id(aside.take_ready(0, none_sick)), Some(2));
        assert_eq!(id(aside.offer(0, job(4, 0, Some("k")), none_sick)), Some(4));
    }

    #[test]
    fn a_shard_well_again_runs_its_waiting_jobs_oldest_first_while_a_sick_ones_still_wait() {
        let mut aside = SetAside::new(1, 3);
        let sick = |shard| shard != 2;
        aside.offer(0, job(1, 0, None), sick);
        aside.offer(0, job(2, 1, Some("k")), sick);
        aside.offer(0, job(3, 1, None), sick);
        aside.offer(0, job(4, 1, Some("k")), sick);
        // Shard 1 is well again; shard 0 is not.
        let sick = |shard| shard == 0;
        let ready: Vec<_> = std::iter::from_fn(|| id(aside.take_ready(0, sick))).collect();
        assert_eq!(ready, vec![2, 3, 4]);
        assert_eq!(aside.len(), 1);
        assert_eq!(id(aside.drain().pop()), Some(1));
        assert_eq!(aside.len(), 0);
    }

    #[test]
    fn drain_hands_back_every_job_oldest_first() {
        let mut aside = SetAside::new(2, 2);
        let sick = |_| true;
        aside.offer(1, job(1, 1, Some("k")), sick);
        aside.offer(0, job(2, 0, None), sick);
        aside.offer(0, job(3, 0, Some("j")), sick);
        let ids: Vec<_> = aside.drain().into_iter().map(|j| j.id.id).collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert_eq!(aside.len(), 0);
    }
}
