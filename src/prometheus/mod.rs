//! Prometheus metrics: a worker's own ([`WorkerMetrics`]: claims, outcomes,
//! latencies, buffer) and the shards' backlog ([`backlog`]: queue depth and
//! oldest-ready age, read from the database by one exporter per fleet, with
//! the invariants of `shardq check`, the queue limits and what holds each
//! shard's xmin horizon beside it: [`invariants`], [`limits`], [`horizon`]).
//!
//! Both encode through [`prometheus_client`] (re-exported, so an embedder
//! registers them in a registry of the same version): serve
//! [`WorkerMetrics::encode`] from your own HTTP server, or add the worker's
//! metrics to your registry with [`WorkerMetrics::register`]. Or let
//! `serve` (feature `metrics-http`, which adds hyper) answer `GET /metrics`:
//! the `shardq worker --metrics-addr` and `shardq metrics` endpoints are
//! that function. Without the feature the library has no HTTP server.

pub mod backlog;
mod encoding;
mod histogram;
pub mod horizon;
#[cfg(feature = "metrics-http")]
mod http;
pub mod invariants;
pub mod limits;
mod worker;

#[cfg(feature = "metrics-http")]
pub use http::serve;
pub use prometheus_client;
pub use worker::WorkerMetrics;

/// Kept for `backlog`, which names it here.
pub(crate) use encoding::family;
pub use encoding::CONTENT_TYPE;
