//! The enqueuer's connections of the reshard run: one lossy proxy per
//! server. Each loses a share of the replies to job inserts after their
//! commit (the client's own retries settle most of those), and now and
//! then one loses every such reply for longer than the client retries
//! (a blackout), so enqueues routed there end with their outcome unknown
//! and the enqueuer must settle them with `enqueue_again`.

use rand::Rng;
use shardq_harness::lossy_proxy::{server_addr, LossyProxy};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Chance that an insert's reply is lost after its commit.
const LOST_REPLY: f64 = 0.05;

/// Text of the statements whose replies are lost: the job inserts.
const INSERTS: &str = "OVERRIDING SYSTEM VALUE";

/// A blackout's length: past the client's 5 s retry window
/// (`RETRY_WINDOW` in `src/client/enqueue_once.rs`), so an enqueue caught
/// in it ends `OutcomeUnknown`.
const BLACKOUT: Duration = Duration::from_secs(6);

/// Pause between two blackouts (jittered ±50 %).
const BLACKOUT_EVERY: Duration = Duration::from_secs(10);

/// The proxies, one per server, in the servers' order.
pub struct Replies {
    proxies: Vec<LossyProxy>,
}

impl Replies {
    /// Starts a proxy in front of each of `direct` (losing
    /// [`LOST_REPLY`] of the insert replies); returns them and the URLs
    /// that go through them.
    pub fn start(direct: &[String]) -> (Replies, Vec<String>) {
        let proxies: Vec<LossyProxy> = direct
            .iter()
            .map(|u| LossyProxy::start(server_addr(u)))
            .collect();
        let proxied = direct
            .iter()
            .zip(&proxies)
            .map(|(u, p)| u.replace(&server_addr(u).to_string(), &p.addr().to_string()))
            .collect();
        for proxy in &proxies {
            proxy.set_drop_only(Some(INSERTS));
            proxy.set_drop_probability(LOST_REPLY);
        }
        (Replies { proxies }, proxied)
    }

    /// A blackout on one proxy at random every [`BLACKOUT_EVERY`] or so,
    /// until `stop`; returns how many there were. The last one ends at
    /// `stop` at the latest.
    pub async fn blackouts(&self, stop: CancellationToken) -> u64 {
        let mut count = 0;
        loop {
            let pause = BLACKOUT_EVERY.mul_f64(rand::thread_rng().gen_range(0.5..1.5));
            tokio::select! {
                _ = stop.cancelled() => return count,
                _ = tokio::time::sleep(pause) => {}
            }
            let proxy = &self.proxies[rand::thread_rng().gen_range(0..self.proxies.len())];
            proxy.set_drop_probability(1.0);
            count += 1;
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(BLACKOUT) => {}
            }
            proxy.set_drop_probability(LOST_REPLY);
        }
    }

    /// No reply is lost any more (for the drain and the checks).
    pub fn quiet(&self) {
        for proxy in &self.proxies {
            proxy.set_drop_probability(0.0);
        }
    }

    /// Insert replies lost so far, over every proxy.
    pub fn lost(&self) -> u64 {
        self.proxies.iter().map(LossyProxy::dropped).sum()
    }
}
