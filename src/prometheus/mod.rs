//! Prometheus metrics: a worker's own ([`WorkerMetrics`]: claims, outcomes,
//! latencies, buffer) and the shards' backlog (queue depth and oldest-ready
//! age, read from the database by one exporter per fleet, `shardq metrics`,
//! with the invariants of `shardq check`, the queue limits, what holds
//! each shard's xmin horizon, the wakes owed across shards and the cancel
//! cascades owed beside it).
//!
//! Both encode through [`prometheus_client`] (re-exported, so an embedder
//! registers them in a registry of the same version): serve
//! [`WorkerMetrics::encode`] from your own HTTP server, or add the worker's
//! metrics to your registry with [`WorkerMetrics::register`]. Or let
//! `serve` (feature `metrics-http`, which adds hyper) answer `GET /metrics`:
//! the `shardq worker --metrics-addr` and `shardq metrics` endpoints are
//! that function. Without the feature the library has no HTTP server.

mod encoding;
mod histogram;
#[cfg(feature = "metrics-http")]
mod http;
mod worker;

// The exporter's collectors (`shardq metrics`): operator tooling, behind the
// `internal` feature (see `lib.rs`).
#[cfg(feature = "internal")]
#[doc(hidden)]
pub mod backlog;
#[cfg(not(feature = "internal"))]
#[allow(dead_code, unreachable_pub)]
mod backlog;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub mod cascades;
#[cfg(not(feature = "internal"))]
#[allow(dead_code, unreachable_pub)]
mod cascades;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub mod horizon;
#[cfg(not(feature = "internal"))]
#[allow(dead_code, unreachable_pub)]
mod horizon;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub mod invariants;
#[cfg(not(feature = "internal"))]
#[allow(dead_code, unreachable_pub)]
mod invariants;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub mod limits;
#[cfg(not(feature = "internal"))]
#[allow(dead_code, unreachable_pub)]
mod limits;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub mod relay;
#[cfg(not(feature = "internal"))]
#[allow(dead_code, unreachable_pub)]
mod relay;

#[cfg(feature = "metrics-http")]
pub use http::serve;
pub use prometheus_client;
pub use worker::WorkerMetrics;

/// Kept for `backlog`, which names it here.
pub(crate) use encoding::family;
pub use encoding::CONTENT_TYPE;
