//! What every request handler is given: the options, the client, the
//! CSRF token. Below both the server and the pages, which use it.

use crate::auth::Auth;
use crate::csrf::CsrfToken;
use shardq::Client;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How the dashboard runs.
#[derive(Debug, Clone)]
pub struct DashboardOptions {
    /// Where to listen.
    pub listen: SocketAddr,
    /// No actions: the buttons are gone and their POSTs are refused.
    pub read_only: bool,
    /// Credentials every request must carry; required beyond loopback.
    pub auth: Option<Auth>,
    /// Jobs per list page.
    pub page_size: usize,
    /// How long one shard may take to answer a page's questions.
    pub shard_deadline: Duration,
    /// The overview's invariant line: a lease expired, or a scheduled job
    /// due, longer ago than this is a violation (see `shardq check`).
    pub stale_after: Duration,
    /// How often the overview's invariant line runs the invariant check
    /// (in the background: the page shows the latest verdict and its age).
    pub check_interval: Duration,
    /// How often the trend charts ask the shards what finished.
    pub trend_interval: Duration,
    /// How far back the trend charts go.
    pub trend_window: Duration,
}

impl DashboardOptions {
    /// Loopback or `listen`, no authentication, actions on, 50 jobs a page,
    /// two seconds per shard, the invariant check's default threshold run
    /// every 15 s, an hour of trends sampled every 10 s.
    pub fn new(listen: SocketAddr) -> DashboardOptions {
        DashboardOptions {
            listen,
            read_only: false,
            auth: None,
            page_size: 50,
            shard_deadline: Duration::from_secs(2),
            stale_after: shardq::client::CheckOptions::default().stale_after,
            check_interval: Duration::from_secs(15),
            trend_interval: Duration::from_secs(10),
            trend_window: Duration::from_secs(3_600),
        }
    }
}

/// What every handler shares.
pub(crate) struct AppState {
    pub client: Client,
    pub csrf: CsrfToken,
    pub options: DashboardOptions,
    pub trends: Arc<crate::trends::Trends>,
    pub verdict: Arc<crate::verdict::Verdict>,
}

pub(crate) type Shared = Arc<AppState>;
