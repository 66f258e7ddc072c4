//! What `--torture` adds to the chaos run: the keyed workload and its handler
//! ([`keyed`]), the per-key order check after the drain ([`order`]), and two
//! monitors during the run: invariant samples ([`sampler`]) and per-shard
//! progress, from which stalls of healthy shards are found ([`progress`]);
//! and a scheduler whose clock runs minutes ahead, its ticks checked
//! afterwards ([`ticks`]); workflows that sleep, receive the driver's
//! messages and gather children ([`waits`], [`mail`]), checked afterwards
//! ([`waits_check`]).

pub mod keyed;
pub mod mail;
pub mod order;
pub mod progress;
pub mod sampler;
pub mod ticks;
pub mod waits;
pub mod waits_check;
mod waits_sql;
