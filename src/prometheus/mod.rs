//! Prometheus metrics: a worker's own ([`WorkerMetrics`]: claims, outcomes,
//! latencies, buffer) and the shards' backlog ([`backlog`]: queue depth and
//! oldest-ready age, read from the database by one exporter per fleet, with
//! the invariants of `shardq check` beside it: [`invariants`]).
//!
//! Both encode through [`prometheus_client`] (re-exported, so an embedder
//! registers them in a registry of the same version): serve
//! [`WorkerMetrics::encode`] from your own HTTP server, or add the worker's
//! metrics to your registry with [`WorkerMetrics::register`]. Or let
//! `serve` (feature `metrics-http`, which adds hyper) answer `GET /metrics`:
//! the `shardq worker --metrics-addr` and `shardq metrics` endpoints are
//! that function. Without the feature the library has no HTTP server.

pub mod backlog;
mod histogram;
#[cfg(feature = "metrics-http")]
mod http;
pub mod invariants;
mod worker;

#[cfg(feature = "metrics-http")]
pub use http::serve;
pub use prometheus_client;
pub use worker::WorkerMetrics;

/// The `Content-Type` of what [`WorkerMetrics::encode`] and
/// [`backlog::scrape`] return: the Prometheus text format, version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Writes one metric family: its descriptor, then a sample per label set.
pub(crate) fn family<L, M>(
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
    name: &str,
    help: &str,
    metric_type: prometheus_client::metrics::MetricType,
    samples: impl IntoIterator<Item = (L, M)>,
) -> Result<(), std::fmt::Error>
where
    L: prometheus_client::encoding::EncodeLabelSet,
    M: prometheus_client::encoding::EncodeMetric,
{
    let mut metric = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, sample) in samples {
        sample.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}
