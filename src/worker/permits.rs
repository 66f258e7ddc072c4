//! Fleet-wide concurrency limits in one process: the permits it leased
//! from the limits' home shard, and the jobs using them.
//!
//! A producer reserves permits before it claims from a limited queue (at
//! most the permits leased and not in use) and claims no more jobs than it
//! reserved; each job it claims carries one permit ([`Permit`]) until its
//! outcome is written or given up (see `running`), the rest go back at
//! once. So the jobs of a queue this process holds never outnumber the
//! permits it leased, and the home shard grants no more permits than the
//! limit over every process (`shardq_lease_permits`).
//!
//! The leaser (`limit_leaser`) renews the leases every [`RENEW`]: it asks
//! for the permits in use plus a batch where a producer found none free,
//! and so gives back spare ones; from the ask on, no more than it asked
//! for is reserved (the home may hold it to that before answering). A
//! lease not renewed within [`LEASE`] of its request lapses on the home
//! shard; the process stops reserving from it at that moment. Before the
//! first answer a queue's limit is unknown and nothing of it is claimed.
//!
//! Pure state with an explicit `now`, so it is tested without a database.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How long a lease lasts on the home shard: a process killed while
/// holding permits gives them back this long after its last renewal.
pub(crate) const LEASE: Duration = Duration::from_secs(5);

/// Pause between renewals: well within [`LEASE`], often enough that spare
/// permits go back to the fleet soon.
pub(crate) const RENEW: Duration = Duration::from_millis(500);

/// What this process knows of a queue's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    /// Not heard from any shard yet: nothing is claimed.
    Unknown,
    /// No concurrency limit: claims are not counted.
    Unlimited,
    /// At most this many jobs of the queue across the fleet.
    Limited(u32),
}

#[derive(Debug)]
struct QueueState {
    known: Known,
    /// Permits the home shard granted this process.
    leased: u32,
    /// Until when the lease holds (its request's time plus [`LEASE`]).
    valid_until: Option<Instant>,
    /// Permits reserved by producers or carried by held jobs.
    used: u32,
    /// A producer found no permit free since the last renewal.
    starved: bool,
    /// A producer reserved permits since the last renewal.
    claimed: bool,
    /// The queue has a rate (one start per this long on average): each
    /// claim takes its starts from the home shard first (see `producer`).
    rated: Option<Duration>,
}

/// The permits of every queue this process serves.
#[derive(Debug)]
pub(crate) struct Permits {
    queues: HashMap<String, Mutex<QueueState>>,
    /// Woken when a producer found no permit free.
    pub starved: Notify,
    /// The most jobs the process can hold (its held credits): no more
    /// permits are asked for.
    most: u32,
    /// An ask went unanswered: it may still have been granted on the home
    /// shard, so until an answer says what this process holds, it asks
    /// for no more than it uses (see [`Permits::wants`]).
    unsure: std::sync::atomic::AtomicBool,
}

/// Permits a producer reserved for one claim; those not given to jobs go
/// back on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    permits: Option<Arc<Permits>>,
    queue: String,
    left: u32,
    /// One start per this long, when the queue has a rate.
    per_start: Option<Duration>,
}

/// One job's permit: given back on drop.
#[derive(Debug)]
pub(crate) struct Permit {
    permits: Arc<Permits>,
    queue: String,
}

impl Permits {
    /// Nothing known of `queues` yet, for a process that holds at most
    /// `most` jobs.
    pub(crate) fn new(queues: &[String], most: u32) -> Self {
        let state = || {
            Mutex::new(QueueState {
                known: Known::Unknown,
                leased: 0,
                valid_until: None,
                used: 0,
                starved: false,
                claimed: false,
                rated: None,
            })
        };
        Permits {
            queues: queues.iter().map(|q| (q.clone(), state())).collect(),
            starved: Notify::new(),
            most,
            unsure: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn with<T>(&self, queue: &str, f: impl FnOnce(&mut QueueState) -> T) -> Option<T> {
        self.queues
            .get(queue)
            .map(|s| f(&mut s.lock().expect("permits")))
    }

    /// Reserves up to `batch` permits of `queue` for a claim: `batch` when
    /// the queue is not limited, the free ones when it is (`None` when
    /// none is free, the limit is unknown or the lease lapsed).
    pub(crate) fn reserve(
        self: &Arc<Self>,
        queue: &str,
        batch: u32,
        now: Instant,
    ) -> Option<Reservation> {
        let (left, counted, per_start) = self.with(queue, |s| match s.known {
            Known::Unknown => None,
            Known::Unlimited => Some((batch, false, s.rated)),
            Known::Limited(_) => {
                let valid = s.valid_until.is_some_and(|t| now < t);
                let free = if valid {
                    s.leased.saturating_sub(s.used)
                } else {
                    0
                };
                if free == 0 {
                    s.starved = true;
                    return None;
                }
                let n = free.min(batch);
                s.used += n;
                s.claimed = true;
                Some((n, true, s.rated))
            }
        })??;
        Some(Reservation {
            permits: counted.then(|| self.clone()),
            queue: queue.to_string(),
            left,
            per_start,
        })
    }

    fn give_back(&self, queue: &str, n: u32) {
        self.with(queue, |s| s.used = s.used.saturating_sub(n));
    }

    /// The queues served.
    pub(crate) fn queues(&self) -> Vec<String> {
        self.queues.keys().cloned().collect()
    }

    /// What to ask the home shard for, per queue, at most as many as the
    /// process can hold: all of those before the limit is known; where a
    /// producer found none free, the permits in use plus two batches or as
    /// many again, whichever is more (a process far below the limit soon
    /// has room for full claims: smaller ones cost the database more per
    /// job); where producers claimed without running short, what it has;
    /// where nothing was claimed, only what is in use (the spare ones go
    /// back). Clears the marks.
    /// An idle queue's spare permits go back.
    ///
    /// After an ask that went unanswered ([`Permits::unanswered`]), every
    /// queue asks for what it uses only (nothing, where the limit is not
    /// known yet), until an answer comes: the unanswered ask may have been
    /// granted on the home shard all the same (a deadline abandons the
    /// wait, not the statement), and asking for more each time would keep
    /// permits this process cannot use from the rest of the fleet; asking
    /// for what it uses makes the home shard's record converge to it.
    ///
    /// The permits leased are cut to what is asked for: the home shard
    /// grants at most that, and may have done so before its answer comes
    /// (or though it never comes), so reserving beyond it could exceed the
    /// limit.
    pub(crate) fn wants(&self, batch: u32) -> Vec<(String, i32)> {
        let unsure = self.unsure.load(std::sync::atomic::Ordering::Relaxed);
        let mut wants: Vec<(String, i32)> = self
            .queues
            .iter()
            .map(|(queue, s)| {
                let mut s = s.lock().expect("permits");
                let starved = std::mem::take(&mut s.starved);
                let claimed = std::mem::take(&mut s.claimed);
                let want = match (s.known, starved, claimed) {
                    _ if unsure => s.used,
                    (Known::Unknown, _, _) => self.most,
                    (_, true, _) => s.used + batch.saturating_mul(2).max(s.used),
                    (_, false, true) => s.leased.max(s.used + batch),
                    (_, false, false) => s.used,
                };
                let want = want.min(self.most.max(s.used));
                // Once asked, the home may hold this process to anything up
                // to `want`, answered or not: never reserve beyond it.
                s.leased = s.leased.min(want);
                (queue.clone(), i32::try_from(want).unwrap_or(i32::MAX))
            })
            .collect();
        wants.sort();
        wants
    }

    /// The home shard granted `granted` permits of `queue` under limit
    /// `concurrency` (`None`: not limited), asked at `asked`; the queue
    /// has a rate of one start per `rated` or none.
    pub(crate) fn leased(
        &self,
        queue: &str,
        concurrency: Option<i32>,
        granted: i32,
        rated: Option<Duration>,
        asked: Instant,
    ) {
        self.with(queue, |s| {
            s.rated = rated;
            match concurrency {
                None => {
                    s.known = Known::Unlimited;
                    s.leased = 0;
                    s.valid_until = None;
                }
                Some(limit) => {
                    s.known = Known::Limited(u32::try_from(limit).unwrap_or(0));
                    s.leased = u32::try_from(granted).unwrap_or(0);
                    s.valid_until = Some(asked + LEASE);
                }
            };
        });
    }

    /// An ask of the home shard was not answered in time: what it granted,
    /// if it committed, is unknown until an answer comes.
    pub(crate) fn unanswered(&self) {
        self.unsure
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The home shard answered an ask: its grants are what this process
    /// holds there.
    pub(crate) fn answered(&self) {
        self.unsure
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Another shard says `queue` has no limit and no rate (the home shard
    /// did not answer): it is claimed uncounted. A limited queue stays as
    /// it is (its lease lapses on its own).
    pub(crate) fn unlimited_elsewhere(&self, queue: &str) {
        self.with(queue, |s| {
            if s.known == Known::Unknown {
                s.known = Known::Unlimited;
            }
        });
    }

    /// What this process knows of `queue`'s limit, its permits leased and in use.
    #[cfg(test)]
    pub(crate) fn state(&self, queue: &str) -> Option<(Known, u32, u32)> {
        self.with(queue, |s| (s.known, s.leased, s.used))
    }
}

impl Reservation {
    /// How many jobs the claim may take.
    pub(crate) fn count(&self) -> u32 {
        self.left
    }

    /// One start per how long, when the queue has a rate (the claim takes
    /// its starts first).
    pub(crate) fn per_start(&self) -> Option<Duration> {
        self.per_start
    }

    /// One permit, for one claimed job (`None` when the queue is not
    /// limited, or none is left).
    pub(crate) fn take(&mut self) -> Option<Permit> {
        let permits = self.permits.as_ref()?;
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some(Permit {
            permits: permits.clone(),
            queue: self.queue.clone(),
        })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(permits) = &self.permits {
            permits.give_back(&self.queue, self.left);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.permits.give_back(&self.queue, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permits() -> Arc<Permits> {
        Arc::new(Permits::new(&["q".to_string()], 100))
    }

    #[test]
    fn nothing_is_claimed_before_the_limit_is_known() {
        let p = permits();
        assert!(p.reserve("q", 10, Instant::now()).is_none());
        assert_eq!(p.wants(10), vec![("q".to_string(), 100)], "all it can hold");
    }

    #[test]
    fn an_unlimited_queue_reserves_the_whole_batch_uncounted() {
        let p = permits();
        let now = Instant::now();
        p.leased("q", None, 10, None, now);
        let mut r = p.reserve("q", 50, now).expect("reserved");
        assert_eq!(r.count(), 50);
        assert!(r.take().is_none(), "no permit to carry");
        assert_eq!(p.state("q"), Some((Known::Unlimited, 0, 0)));
    }

    #[test]
    fn a_limited_queue_reserves_only_free_permits_and_jobs_carry_them_until_dropped() {
        let p = permits();
        let now = Instant::now();
        p.leased("q", Some(5), 3, None, now);
        let mut r = p.reserve("q", 10, now).expect("reserved");
        assert_eq!(r.count(), 3);
        assert!(p.reserve("q", 10, now).is_none(), "all 3 reserved");
        let job = r.take().expect("a permit");
        drop(r);
        assert_eq!(p.state("q"), Some((Known::Limited(5), 3, 1)), "2 went back");
        assert_eq!(
            p.wants(10),
            vec![("q".to_string(), 1 + 20)],
            "starved: two batches more"
        );
        assert_eq!(
            p.wants(10),
            vec![("q".to_string(), 1)],
            "then, idle, only what is in use"
        );
        p.leased("q", Some(5), 3, None, now);
        let _more = p.reserve("q", 1, now).expect("one more");
        assert_eq!(
            p.wants(10),
            vec![("q".to_string(), 2 + 10)],
            "claiming without running short: what it has, at least a batch more than in use"
        );
        let mut big = Vec::new();
        p.leased("q", Some(1000), 62, None, now);
        let mut r = p.reserve("q", 60, now).expect("60 (2 in use)");
        big.extend((0..60).map(|_| r.take().unwrap()));
        assert!(p.reserve("q", 1, now).is_none());
        assert_eq!(
            p.wants(10),
            vec![("q".to_string(), 100)],
            "starved at 62 in use: as many again, capped at what it can hold"
        );
        drop((job, _more, r, big));
        assert_eq!(p.state("q"), Some((Known::Limited(1000), 62, 0)));
    }

    #[test]
    fn after_an_unanswered_ask_a_starved_queue_asks_only_for_what_it_uses() {
        let p = permits();
        let now = Instant::now();
        p.leased("q", Some(5), 2, None, now);
        let held = p.reserve("q", 10, now).unwrap();
        assert_eq!(held.count(), 2);
        assert!(p.reserve("q", 10, now).is_none(), "starved");
        p.unanswered();
        assert_eq!(p.wants(10), vec![("q".to_string(), 2)]);
        p.answered();
        assert!(p.reserve("q", 10, now).is_none(), "starved again");
        assert_eq!(p.wants(10), vec![("q".to_string(), 22)]);
    }

    #[test]
    fn after_an_unanswered_first_ask_nothing_is_asked_for() {
        let p = permits();
        assert_eq!(p.wants(10), vec![("q".to_string(), 100)], "all it can hold");
        p.unanswered();
        assert_eq!(
            p.wants(10),
            vec![("q".to_string(), 0)],
            "the first ask may hold the limit already: no second one for it all"
        );
    }

    #[test]
    fn nothing_beyond_an_ask_is_reserved_before_its_answer() {
        let p = permits();
        let now = Instant::now();
        p.leased("q", Some(5), 5, None, now);
        let held = p.reserve("q", 2, now).unwrap();
        p.unanswered();
        assert_eq!(p.wants(10), vec![("q".to_string(), 2)]);
        assert!(
            p.reserve("q", 10, now).is_none(),
            "the home may hold this process to 2 already: 3 more would pass the limit"
        );
        drop(held);
    }

    #[test]
    fn a_lapsed_lease_reserves_nothing() {
        let p = permits();
        let asked = Instant::now();
        p.leased("q", Some(5), 5, None, asked);
        assert!(p.reserve("q", 1, asked + LEASE).is_none());
        assert!(p
            .reserve("q", 1, asked + LEASE - Duration::from_millis(1))
            .is_some());
    }

    #[test]
    fn a_lowered_grant_reserves_nothing_until_the_jobs_in_use_are_fewer() {
        let p = permits();
        let now = Instant::now();
        p.leased("q", Some(5), 5, None, now);
        let mut r = p.reserve("q", 5, now).expect("reserved");
        let jobs: Vec<Permit> = (0..5).map(|_| r.take().unwrap()).collect();
        p.leased("q", Some(2), 2, None, now);
        assert!(p.reserve("q", 1, now).is_none());
        drop(jobs);
        assert_eq!(p.reserve("q", 5, now).map(|r| r.count()), Some(2));
    }
}
