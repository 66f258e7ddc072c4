//! Settings that keep a shardq session from outliving its client. A worker
//! whose process froze (SIGSTOP, a stuck VM) or whose network broke leaves
//! its backend `idle in transaction` with its key locks held; nothing on the
//! server ends that session by default (TCP keepalives start after two
//! hours), and one held key lock holds back every writer of that key.

use std::time::Duration;

/// shardq's own sessions are ended by the server when they stay idle inside
/// a transaction for this many statement deadlines. shardq never leaves a
/// transaction idle for longer than one round trip between its statements,
/// and a client that waited longer than its deadline has given up on the
/// transaction anyway; twice leaves room for your own transaction on a
/// [`crate::shards::Shard::client`] connection (20 s by default).
pub(crate) const IDLE_IN_TRANSACTION_DEADLINES: u32 = 2;

/// A connection silent this long gets its first keepalive probe, from both
/// ends: long enough to cost nothing, short against the two hours that
/// Linux waits by default.
pub(crate) const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);

/// Between two unanswered keepalive probes.
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// Unanswered probes after which the connection is closed: a peer that
/// vanished (no FIN, no RST) is found within 25 s.
pub(crate) const KEEPALIVE_RETRIES: u32 = 3;

/// Client-side TCP keepalives on `pg`'s connections (through a transaction
/// pooler too: they are socket options, not session settings).
pub(crate) fn keep_alive(pg: &mut tokio_postgres::Config) {
    pg.keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_RETRIES);
}

/// The server-side settings, as startup options (`-c name=value`): the
/// idle-in-transaction timeout and the server's own keepalives, which find
/// a client that vanished while its backend waited for it.
pub(crate) fn server_options(statement_timeout: Duration) -> String {
    let idle = statement_timeout * IDLE_IN_TRANSACTION_DEADLINES;
    format!(
        " -c idle_in_transaction_session_timeout={} -c tcp_keepalives_idle={} \
         -c tcp_keepalives_interval={} -c tcp_keepalives_count={}",
        idle.as_millis(),
        KEEPALIVE_IDLE.as_secs(),
        KEEPALIVE_INTERVAL.as_secs(),
        KEEPALIVE_RETRIES
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_timeout_is_twice_the_statement_deadline() {
        let options = server_options(Duration::from_secs(10));
        assert!(options.contains("idle_in_transaction_session_timeout=20000 "));
        assert!(options.contains("tcp_keepalives_count=3"));
    }
}
