//! Prometheus metrics: a worker's own ([`WorkerMetrics`]: claims, outcomes,
//! latencies, buffer) and the shards' backlog ([`backlog`]: queue depth and
//! oldest-ready age, read from the database by one exporter per fleet).
//!
//! Both encode through [`prometheus_client`] (re-exported, so an embedder
//! registers them in a registry of the same version): serve
//! [`WorkerMetrics::encode`] from your own HTTP server, or add the worker's
//! metrics to your registry with [`WorkerMetrics::register`]. The HTTP
//! endpoints of `shardq worker --metrics-addr` and `shardq metrics` live in
//! the CLI, so the library pulls in no HTTP server.

pub mod backlog;
pub(crate) mod histogram;
mod worker;

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
