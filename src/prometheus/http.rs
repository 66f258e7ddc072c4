//! A minimal HTTP server for Prometheus (feature `metrics-http`): `GET
//! /metrics` answers the text a closure produces; any other path is 404.
//! HTTP/1.1 over hyper, one task per connection, stopped by a cancellation
//! token.

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Binds `addr`, then serves what `render` returns at `GET /metrics` until
/// `shutdown` is cancelled, in a task of its own (spawned on the current
/// tokio runtime). Returns the bound address (useful with port 0).
///
/// ```no_run
/// # async fn example(worker: shardq::Worker) -> std::io::Result<()> {
/// let metrics = worker.metrics();
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// let addr = "127.0.0.1:9464".parse().unwrap();
/// shardq::prometheus::serve(addr, move || std::future::ready(metrics.encode()), shutdown.clone()).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// The [`std::io::Error`] of binding `addr` (taken, not a local address).
///
/// # Cancel safety
///
/// Cancel safe: dropped before it returns, nothing is served.
pub async fn serve<F, Fut>(
    addr: SocketAddr,
    render: F,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tracing::info!(%bound, "serving Prometheus metrics at /metrics");
    let render = Arc::new(render);
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        tracing::warn!(error = %err, "metrics listener: accept failed");
                        continue;
                    }
                },
            };
            let render = render.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let render = render.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(request, &*render).await) }
            });
            tokio::spawn(async move {
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(err) = connection.await {
                    tracing::debug!(error = %err, "metrics connection ended with an error");
                }
            });
        }
    });
    Ok(bound)
}

async fn answer<F, Fut>(request: Request<Incoming>, render: &F) -> Response<Full<Bytes>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = String>,
{
    let response = Response::builder();
    if request.method() != Method::GET || request.uri().path() != "/metrics" {
        return response
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(
                b"not found: metrics are at GET /metrics\n",
            )))
            .expect("a valid response");
    }
    let text = render().await;
    response
        .header(hyper::header::CONTENT_TYPE, super::encoding::CONTENT_TYPE)
        .body(Full::new(Bytes::from(text)))
        .expect("a valid response")
}
