//! Binding, the routes, and what every request passes first: the Host check
//! (unauthenticated loopback), authentication, the read-only guard.

use crate::csrf::CsrfToken;
use crate::pages;
use crate::state::{AppState, DashboardOptions, Shared};
use crate::trends::Trends;
use crate::verdict::Verdict;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use shardq::Client;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Why the dashboard cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// Listening beyond loopback without credentials.
    #[error(
        "refusing to listen on {0} without authentication: anyone who reaches it could retry \
         and cancel jobs; set {token} (or --token-file) or {basic} (or --basic-auth-file), \
         or listen on 127.0.0.1",
        token = crate::auth::TOKEN_ENV,
        basic = crate::auth::BASIC_ENV
    )]
    Unauthenticated(SocketAddr),
    /// The address cannot be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A bound dashboard, not serving yet.
pub struct Bound {
    listener: tokio::net::TcpListener,
    options: DashboardOptions,
}

/// Binds `options.listen`, refusing an address beyond loopback without
/// `options.auth`.
///
/// # Errors
///
/// [`DashboardError::Unauthenticated`], [`DashboardError::Bind`].
///
/// # Cancel safety
///
/// Cancel safe: a listener half bound is dropped.
pub async fn bind(options: DashboardOptions) -> Result<Bound, DashboardError> {
    let addr = options.listen;
    if !addr.ip().is_loopback() && options.auth.is_none() {
        return Err(DashboardError::Unauthenticated(addr));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| DashboardError::Bind { addr, source })?;
    Ok(Bound { listener, options })
}

impl Bound {
    /// The address it listens on (with the port chosen for `:0`).
    ///
    /// # Errors
    ///
    /// When the socket cannot say.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves the dashboard over `client`'s shards until `shutdown`.
    ///
    /// # Errors
    ///
    /// When the server fails to accept connections.
    ///
    /// # Cancel safety
    ///
    /// Dropping it stops serving; open responses are cut off.
    pub async fn serve(self, client: Client, shutdown: CancellationToken) -> std::io::Result<()> {
        let trends = Arc::new(Trends::new(
            self.options.trend_interval,
            self.options.trend_window,
        ));
        let verdict = Arc::new(Verdict::default());
        // The sampler and the checker stop with the server.
        let stop_sampler = shutdown.child_token();
        let sampler = tokio::spawn({
            let (trends, client, stop) = (trends.clone(), client.clone(), stop_sampler.clone());
            let deadline = self.options.shard_deadline;
            async move { trends.run(client, deadline, stop).await }
        });
        let checker = tokio::spawn({
            let (verdict, client, stop) = (verdict.clone(), client.clone(), stop_sampler.clone());
            let options = shardq::client::CheckOptions {
                deadline: self.options.shard_deadline,
                stale_after: self.options.stale_after,
                ..shardq::client::CheckOptions::default()
            };
            let interval = self.options.check_interval;
            async move { verdict.run(client, options, interval, stop).await }
        });
        let state = Arc::new(AppState {
            client,
            csrf: CsrfToken::new(),
            options: self.options,
            trends,
            verdict,
        });
        let app = Router::new()
            .route("/", get(pages::overview::page))
            .route("/jobs", get(pages::jobs::page))
            .route("/jobs/{id}", get(pages::job::page))
            .route(
                "/jobs/{id}/{action}",
                get(pages::actions::confirm).post(pages::actions::perform),
            )
            .route(
                "/limits/{queue}",
                get(pages::limits::form).post(pages::limits::set),
            )
            .route("/queues/{queue}", get(pages::queue::page))
            .route("/shards", get(pages::shards::page))
            .route(
                "/queues/{queue}/{action}",
                get(pages::actions::queue_confirm).post(pages::actions::queue_perform),
            )
            .layer(middleware::from_fn_with_state(state.clone(), guard))
            .with_state(state);
        let served = axum::serve(self.listener, app)
            .with_graceful_shutdown({
                let shutdown = shutdown.clone();
                async move { shutdown.cancelled().await }
            })
            .await;
        stop_sampler.cancel();
        let _ = tokio::join!(sampler, checker);
        served
    }
}

/// Host names a browser uses for loopback. Without authentication only
/// these are served: a page elsewhere cannot rebind its own name to
/// 127.0.0.1 and read the dashboard (DNS rebinding).
fn is_loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    };
    matches!(name, "localhost" | "[::1]")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Runs before every route: host check, authentication, read-only guard,
/// and the CSRF cookie on every page.
async fn guard(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    match &state.options.auth {
        Some(auth) if !auth.allows(headers) => {
            let mut refused =
                (StatusCode::UNAUTHORIZED, "authentication required\n").into_response();
            if auth.offers_basic() {
                refused.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"shardq dashboard\", charset=\"UTF-8\""),
                );
            }
            return refused;
        }
        Some(_) => {}
        None => {
            let host = headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !is_loopback_host(host) {
                return (
                    StatusCode::MISDIRECTED_REQUEST,
                    "without authentication the dashboard answers only to a loopback host name\n",
                )
                    .into_response();
            }
        }
    }
    if state.options.read_only
        && request.method() != Method::GET
        && request.method() != Method::HEAD
    {
        return (StatusCode::FORBIDDEN, "the dashboard is read-only\n").into_response();
    }
    let mut response = next.run(request).await;
    if let Ok(cookie) = HeaderValue::from_str(&state.csrf.cookie()) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_loopback_names_pass_the_host_check() {
        for host in [
            "127.0.0.1:8080",
            "localhost:1",
            "[::1]:80",
            "127.0.0.1",
            "localhost",
        ] {
            assert!(super::is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example:8080",
            "10.0.0.1:80",
            "",
            "localhost.evil.example",
        ] {
            assert!(!super::is_loopback_host(host), "{host}");
        }
    }
}
