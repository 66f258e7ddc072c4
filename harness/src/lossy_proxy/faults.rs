//! The faults a [`LossyProxy`](super::LossyProxy) can inject besides lost
//! replies, and how one connection follows them.
//!
//! Every connection subscribes to one `watch` channel of [`FaultState`]; its
//! relays read the current fault per message, and [`watch_fault`] ends the
//! connection when a fault says so (a refusal resets it; the end of a
//! silence closes every connection the silence touched).

use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

/// A fault on every connection of the proxy, set with
/// [`LossyProxy::set_fault`](super::LossyProxy::set_fault). It adds to the
/// lost replies of [`set_drop_probability`](super::LossyProxy::set_drop_probability).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// Everything is forwarded as it comes.
    #[default]
    None,
    /// A slow server: each server→client exchange (up to and including its
    /// ReadyForQuery, the opening of a connection included) is held this long
    /// after it arrived before it is forwarded, so every reply takes that
    /// much longer. Exchanges that were pipelined are each held from their
    /// own arrival, not one after another.
    Delay(Duration),
    /// A network partition that leaves the sockets open: no byte is
    /// forwarded in either direction. The client's bytes are read and
    /// discarded (the server never sees them), the server's replies are read
    /// and discarded (a statement in flight may have run; its client never
    /// hears of it). New connections are accepted and get nothing. When the
    /// silence ends, every connection open during it is closed, as a
    /// partition's connections usually die (their client cannot know what
    /// was lost, so they could not be resumed anyway); new ones work again.
    Silent,
    /// A server that is gone: new connections are reset as soon as they are
    /// accepted, and open ones are reset at once.
    Refuse,
}

/// What the proxy publishes to its connections.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct FaultState {
    /// The fault now.
    pub fault: Fault,
    /// How many silences have begun: a connection that opened at generation
    /// `g` while the proxy was not silent was touched by a silence when the
    /// generation is past `g`, however briefly it lasted.
    pub silent_generation: u64,
}

impl FaultState {
    /// The state after `fault` is set.
    pub fn with(self, fault: Fault) -> FaultState {
        let begins_silence = fault == Fault::Silent && self.fault != Fault::Silent;
        FaultState {
            fault,
            silent_generation: self.silent_generation + u64::from(begins_silence),
        }
    }

    /// The generation a connection opened now is counted from: one opened
    /// during a silence belongs to it (it is closed when the silence ends).
    pub fn opened_generation(self) -> u64 {
        if self.fault == Fault::Silent {
            self.silent_generation - 1
        } else {
            self.silent_generation
        }
    }
}

/// How a fault ends a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    /// Closed in the ordinary way (FIN).
    Close,
    /// Reset (RST): what a refusing server's host answers.
    Reset,
}

/// Waits until a fault ends the connection opened at `opened` (a
/// generation, see [`FaultState::opened_generation`]). Never returns while
/// the proxy lives and no fault asks for it.
///
/// # Cancel safety
///
/// Cancel safe: it only reads the channel.
pub(super) async fn watch_fault(faults: &mut watch::Receiver<FaultState>, opened: u64) -> End {
    loop {
        let state = *faults.borrow_and_update();
        if state.fault == Fault::Refuse {
            return End::Reset;
        }
        if state.fault != Fault::Silent && state.silent_generation != opened {
            return End::Close;
        }
        if faults.changed().await.is_err() {
            // The proxy is being dropped; its task drops this one.
            std::future::pending::<()>().await;
        }
    }
}

/// Reads and discards what the client sends until it hangs up: a
/// connection accepted during a silence.
pub(super) async fn discard(client: &mut TcpStream) {
    let mut buf = [0u8; 8 * 1024];
    while matches!(client.read(&mut buf).await, Ok(n) if n > 0) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_count_silences_begun() {
        let quiet = FaultState::default();
        let silent = quiet.with(Fault::Silent);
        assert_eq!(silent.silent_generation, 1);
        // Silent again while silent is the same silence.
        assert_eq!(silent.with(Fault::Silent).silent_generation, 1);
        let after = silent.with(Fault::None);
        assert_eq!(after.silent_generation, 1);
        assert_eq!(after.with(Fault::Silent).silent_generation, 2);
        // A connection opened during the silence belongs to it.
        assert_eq!(silent.opened_generation(), 0);
        assert_eq!(after.opened_generation(), 1);
    }
}
