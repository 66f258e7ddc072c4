//! Claiming jobs. The claim itself is the server-side function `shardq_claim`
//! (migrations/functions/shardq_claim.sql), since per-key exclusion needs
//! statements that each see what the ones before them did under the key
//! locks; its comment explains how.

/// Claims up to $4 ready jobs of queue $3 for owner $5 with a lease of $6 ms,
/// after taking one of dequeue slots ($1, 0..$2), or ungated when $2 = 0.
/// Always returns at least one row: `got_slot` = 0 means "busy"; `got_slot`
/// = 1 with a NULL id means "empty"; 2 with a NULL id "held back by group
/// limits" (ready jobs there, none allowed to start now). Rows come back in id order, the order a
/// key's jobs must run in. The slot is released at commit, so it works
/// through transaction-pooling proxies.
pub const JOB_CLAIM: &str = "SELECT * FROM shardq_claim($1::int, $2::int, $3::text, \
    $4::int, $5::text, $6::bigint)";

/// Asks a shard whether it answers at all: the probe of a shard that did
/// not answer a claim in time (it touches no table, so it measures the
/// server and the network, not a queue).
pub const SHARD_PROBE: &str = "SELECT 1";
