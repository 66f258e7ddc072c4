//! A minimal HTTP server for Prometheus: `GET /metrics` answers the text a
//! closure produces; any other path is 404. HTTP/1.1 over hyper, one task
//! per connection, stopped by a cancellation token.

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Binds `addr` (errors name it), then serves `render` at `/metrics` until
/// `shutdown` is cancelled, in a task of its own. Returns the bound address.
pub async fn serve<F, Fut>(
    addr: SocketAddr,
    render: F,
    shutdown: CancellationToken,
) -> Result<SocketAddr>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for metrics on {addr}"))?;
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
        .header(
            hyper::header::CONTENT_TYPE,
            shardq::prometheus::CONTENT_TYPE,
        )
        .body(Full::new(Bytes::from(text)))
        .expect("a valid response")
}
