//! What every exposition here shares: its content type and how a metric
//! family is written.

/// The `Content-Type` of what [`WorkerMetrics::encode`](super::WorkerMetrics::encode) (and
/// the exporter of `shardq metrics`) return: the Prometheus text format, version 0.0.4.
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
