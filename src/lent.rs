//! Connections lent by shardq's pool of a shard, and how each goes back.
//!
//! The pool hands a connection out again without a round trip (deadpool's
//! `Fast` recycling): every claim and completion checks one out, and a
//! cleaning round trip before each was about 15% of a pickup at low load
//! (README, "Pickup latency"). So whoever could leave something behind on
//! a connection cleans or closes it instead:
//! - shardq's own statements ([`Lent`]) set nothing on the session; one
//!   dropped before its work ended (its deadline passed: the server may be
//!   frozen with a statement still in flight) closes its connection rather
//!   than hand the next user one that still waits for that reply;
//! - a connection lent through the public [`crate::shards::Shard::client`]
//!   ([`PooledClient`]) may carry whatever its user `SET` or locked, so it
//!   is cleaned before it goes back, or closed when that fails.

use deadpool_postgres::{Client, Object};
use std::ops::{Deref, DerefMut};
use std::time::Duration;

/// A session as a new one has it, prepared statements kept: what deadpool's
/// `Clean` recycling runs, after rolling back a transaction left open.
const CLEAN: &str = "ROLLBACK; CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; \
    UNLISTEN *; SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES;";

/// A connection lent for one of shardq's own operations. It goes back to
/// the pool as it is once [`Lent::settle`] was called, and is closed when
/// dropped before that (the operation was cut off mid-statement).
pub(crate) struct Lent {
    client: Option<Client>,
    settled: bool,
}

impl Lent {
    pub(crate) fn new(client: Client) -> Lent {
        Lent {
            client: Some(client),
            settled: false,
        }
    }

    /// The operation ended, well or not, with no statement in flight: the
    /// connection may be lent again as it is.
    pub(crate) fn settle(&mut self) {
        self.settled = true;
    }
}

impl Deref for Lent {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client
            .as_ref()
            .expect("a lent connection until dropped")
    }
}

impl DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut Client {
        self.client
            .as_mut()
            .expect("a lent connection until dropped")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let (false, Some(client)) = (self.settled, self.client.take()) {
            // Out of the pool: dropping it closes the connection, and the
            // server rolls back whatever it was doing.
            drop(Object::take(client));
        }
    }
}

/// A connection of shardq's pool lent to you ([`crate::shards::Shard::client`]):
/// use it as a [`deadpool_postgres::Client`]. When dropped, it is cleaned
/// (settings reset, session locks released, `LISTEN`s ended) before the pool
/// lends it again, or closed if the cleaning fails or takes longer than the
/// shard's connect timeout.
pub struct PooledClient {
    /// Closed unless settled, as any lent connection: settled once cleaned.
    lent: Option<Lent>,
    clean_within: Duration,
}

impl std::fmt::Debug for PooledClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledClient").finish_non_exhaustive()
    }
}

impl PooledClient {
    pub(crate) fn new(client: Client, clean_within: Duration) -> PooledClient {
        PooledClient {
            lent: Some(Lent::new(client)),
            clean_within,
        }
    }
}

impl Deref for PooledClient {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.lent
            .as_deref()
            .expect("a pooled connection until dropped")
    }
}

impl DerefMut for PooledClient {
    fn deref_mut(&mut self) -> &mut Client {
        self.lent
            .as_deref_mut()
            .expect("a pooled connection until dropped")
    }
}

impl Drop for PooledClient {
    fn drop(&mut self) {
        // Unsettled, it closes: without a runtime to clean it on, or if the
        // runtime drops the cleaning task.
        let Some(mut lent) = self.lent.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let within = self.clean_within;
        runtime.spawn(async move {
            if let Ok(Ok(())) = tokio::time::timeout(within, lent.batch_execute(CLEAN)).await {
                lent.settle();
            }
        });
    }
}
