//! The relay of children's wakes to parents on other shards: on every
//! shard, a loop reads the wakes its children owe parents elsewhere
//! (`store::children_elsewhere`) and delivers each parent shard's batch in
//! a task of its own. A parent's shard that hangs holds back only its own
//! wakes: while its task is out, the next passes leave its wakes for
//! later, and the other shards' wakes, and this shard's promotions (a
//! loop of their own), go on.
//!
//! One process at a time delivers a source shard's wakes to one parents'
//! shard: a delivery first takes or renews that pair's lease
//! (`children_elsewhere::relay_lease`, a row on the source shard, by the
//! shard's clock), and a process that finds it held by another leaves the
//! wakes to it and looks again within [`RELAY_CEILING`]. A holder that
//! dies or stalls stops renewing it, and another process takes over once
//! it expires ([`RELAY_LEASE`] after it was last renewed); a holder whose
//! delivery fails gives it up at once (another process may reach the
//! parents' shard when this one cannot).
//!
//! A pass runs when the shard's listener hears a completion there leave a
//! wake for another shard (its bell, [`RelayBells`]), else on a timer: `worker.maintenance_interval`
//! while the listener is up (the timer only covers a lost notification),
//! at most a second apart while it is down (behind a pooler, or
//! reconnecting).

use super::per_shard::each_shard;
use super::promoter::PROMOTION_FLOOR;
use super::wakeup::RelayBells;
use crate::shards::ShardSet;
use crate::store::children_elsewhere::{self, RelayLease};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

/// The longest pause between two passes on a shard whose listener is
/// down, or after a pass that left wakes behind.
const RELAY_CEILING: Duration = Duration::from_secs(1);

/// How long a relay lease lasts unless renewed: its holder renews it on
/// a pass that delivers with less than half of it left.
pub(crate) const RELAY_LEASE: Duration = Duration::from_secs(5);

/// Runs until shutdown: one loop per shard, a pass when its `bells` ring,
/// else `interval` (`worker.maintenance_interval`) after the last, at
/// least [`PROMOTION_FLOOR`], and at most [`RELAY_CEILING`] while the
/// shard's listener is down. A pass is one read of an index of pending
/// wakes, almost always empty.
pub(crate) async fn run(
    interval: Duration,
    owner: Arc<str>,
    shards: ShardSet,
    bells: Arc<RelayBells>,
    shutdown: CancellationToken,
) {
    each_shard(shards.len(), |index| {
        relay_loop(
            shards.clone(),
            owner.clone(),
            index,
            interval,
            bells.clone(),
            shutdown.clone(),
        )
    })
    .await;
}

/// How long a process refused the lease table relays without asking for
/// the lease again (a grant made meanwhile is used after that).
const UNLEASED_FOR: Duration = Duration::from_secs(300);

async fn relay_loop(
    shards: ShardSet,
    owner: Arc<str>,
    index: usize,
    interval: Duration,
    bells: Arc<RelayBells>,
    shutdown: CancellationToken,
) {
    // Deliveries out, by the parents' shard.
    let mut out: HashMap<usize, JoinHandle<()>> = HashMap::new();
    // Set by a delivery that left wakes undelivered (a parent's row busy
    // or held by a move, or its shard failing, or its lease elsewhere).
    let left_behind = Arc::new(AtomicBool::new(false));
    // The parents' shards whose lease another process holds, until when:
    // their wakes are not read meanwhile.
    let elsewhere: Arc<Mutex<HashMap<usize, Instant>>> = Arc::default();
    // Until when this process relays without a lease: it was refused the
    // lease table (not granted it); asked again after that, for a grant.
    let unleased: Arc<Mutex<Option<Instant>>> = Arc::default();
    loop {
        out.retain(|_, task| !task.is_finished());
        let mut skip: Vec<usize> = out.keys().copied().collect();
        {
            let mut leased = elsewhere.lock().expect("relay leases");
            leased.retain(|_, until| *until > Instant::now());
            skip.extend(leased.keys().copied());
        }
        let full = match children_elsewhere::wakes_owed(&shards, index, &skip).await {
            Ok(owed) => {
                let full =
                    owed.values().map(Vec::len).sum::<usize>() >= children_elsewhere::RELAY_BATCH;
                for (to, wakes) in owed {
                    if out.contains_key(&to) {
                        continue;
                    }
                    let delivery = Delivery {
                        shards: shards.clone(),
                        owner: owner.clone(),
                        from: index,
                        to,
                        left_behind: left_behind.clone(),
                        elsewhere: elsewhere.clone(),
                        unleased: unleased.clone(),
                    };
                    out.insert(to, tokio::spawn(delivery.run(wakes)));
                }
                full
            }
            Err(err) => {
                let duty = "reading the wakes children owe parents on other shards";
                super::maintenance::failed(shards.get(index), duty, &err);
                true
            }
        };
        // The bell rings for new wakes only: what a pass left (a full
        // batch, deliveries still out or short) is looked at again within
        // the ceiling, as everything is while the listener is down.
        let behind = full || !out.is_empty() || left_behind.swap(false, Ordering::AcqRel);
        let every = match bells.heard(index) && !behind {
            true => interval.max(PROMOTION_FLOOR),
            false => interval.clamp(PROMOTION_FLOOR, RELAY_CEILING),
        };
        tokio::select! {
            _ = shutdown.cancelled() => {
                out.values().for_each(JoinHandle::abort);
                return;
            }
            _ = tokio::time::sleep(every) => {}
            _ = bells.rung(index) => {}
        }
    }
}

/// One delivery of the wakes children on shard `from` owe parents on
/// shard `to`, under the pair's lease.
struct Delivery {
    shards: ShardSet,
    owner: Arc<str>,
    from: usize,
    to: usize,
    left_behind: Arc<AtomicBool>,
    elsewhere: Arc<Mutex<HashMap<usize, Instant>>>,
    unleased: Arc<Mutex<Option<Instant>>>,
}

impl Delivery {
    async fn run(self, wakes: Vec<children_elsewhere::OwedWake>) {
        let (shards, from, to) = (&self.shards, self.from, self.to);
        let refused = *self.unleased.lock().expect("relay lease refusal");
        let lease = match refused {
            Some(until) if Instant::now() < until => Ok(RelayLease::Held),
            _ => children_elsewhere::relay_lease(shards, from, to, &self.owner, RELAY_LEASE).await,
        };
        match lease {
            Ok(RelayLease::Held) => {}
            // A role not granted the lease table (docs/least_privilege.sql
            // not run again after `migrate`): it delivers without one for
            // a while, as every process did before leases (a wake is
            // idempotent), and says so once, instead of failing every pass.
            Err(err) if err.sqlstate() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                let until = Instant::now() + UNLEASED_FOR;
                let first = self
                    .unleased
                    .lock()
                    .expect("relay lease refusal")
                    .replace(until)
                    .is_none();
                if first {
                    tracing::warn!(
                        shard = %shards.get(from).name,
                        error = %crate::error_chain::error_chain(&err),
                        "relaying children's wakes without a lease: grant the worker role \
                         shardq_relay_leases (run docs/least_privilege.sql again)"
                    );
                }
            }
            // Another process relays them: not read again until its lease
            // ends, then looked at within the ceiling, in case it stopped.
            Ok(RelayLease::Elsewhere(left)) => {
                let until = Instant::now() + left;
                self.elsewhere
                    .lock()
                    .expect("relay leases")
                    .insert(to, until);
                return self.left_behind.store(true, Ordering::Release);
            }
            Err(err) => {
                self.left_behind.store(true, Ordering::Release);
                let duty = "taking the lease of relaying children's wakes";
                return super::maintenance::failed(shards.get(from), duty, &err);
            }
        }
        match children_elsewhere::deliver(shards, from, to, &wakes).await {
            Ok(done) if done as usize == wakes.len() => {}
            Ok(_) => self.left_behind.store(true, Ordering::Release),
            Err(err) => {
                self.left_behind.store(true, Ordering::Release);
                let duty = "relaying children's wakes to their parents' shard";
                super::maintenance::failed(shards.get(to), duty, &err);
                // Another process may reach that shard: it takes the lease
                // now, not once this one stops renewing it.
                let _ =
                    children_elsewhere::give_up_relay_lease(shards, from, to, &self.owner).await;
            }
        }
    }
}
