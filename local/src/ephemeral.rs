//! A throwaway server for tests and embedders.

use std::fs::{self, DirBuilder, Permissions};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;

use super::database::create_database;
use super::datadir::unique_name;
use super::error::LocalError;
use super::server::{LocalServer, StopMode};

/// How many free ports we try before giving up (another process may grab the port
/// between our probe and the server's bind).
const START_ATTEMPTS: usize = 5;

/// A server on a free loopback port in a fresh temporary folder, stopped (immediate) and
/// deleted on drop.
#[derive(Debug)]
pub struct EphemeralServer {
    server: LocalServer,
    root: PathBuf,
}

impl EphemeralServer {
    /// Starts a server on a free port and creates its `shardq` database.
    ///
    /// # Errors
    ///
    /// [`LocalError`] when the PostgreSQL binaries are missing or `initdb` or
    /// the server fails (its log is in the message).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a server started before the drop keeps running and its
    /// folder stays.
    pub async fn start() -> Result<Self, LocalError> {
        let root = make_temp_root()?;
        // Built first so that Drop cleans up whatever the steps below leave behind.
        let mut this = EphemeralServer {
            server: LocalServer::new(&root, 0, 0),
            root,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            this.server.port = free_port()?;
            let server = this.server.clone();
            let started = tokio::task::spawn_blocking(move || server.start())
                .await
                .map_err(LocalError::Task)?;
            match started {
                Ok(()) => break,
                Err(e @ LocalError::StartFailed { .. }) if attempt < START_ATTEMPTS => {
                    tracing::debug!(error = %e, "ephemeral postgres failed to start, retrying");
                    let _ = this.server.stop(StopMode::Immediate);
                }
                Err(e) => return Err(e),
            }
        }
        create_database(&this.admin_url(), "shardq").await?;
        Ok(this)
    }

    /// The underlying server.
    pub fn server(&self) -> &LocalServer {
        &self.server
    }

    /// The URL of the `shardq` database.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The URL of the `postgres` maintenance database.
    pub fn admin_url(&self) -> String {
        self.server.admin_url()
    }

    /// Stops the server, keeping its data for [`EphemeralServer::start_again`].
    pub fn stop(&self, mode: StopMode) -> Result<(), LocalError> {
        self.server.stop(mode)
    }

    /// Starts the server again on the same port with the same data.
    pub fn start_again(&self) -> Result<(), LocalError> {
        self.server.start()
    }
}

impl Drop for EphemeralServer {
    fn drop(&mut self) {
        let _ = self.server.stop(StopMode::Immediate);
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// A port that was free a moment ago on 127.0.0.1.
pub(crate) fn free_port() -> Result<u16, LocalError> {
    let addr = (Ipv4Addr::LOCALHOST, 0);
    let listener = TcpListener::bind(addr).map_err(LocalError::io("bind", "127.0.0.1:0"))?;
    let port = listener
        .local_addr()
        .map_err(LocalError::io("read address of", "127.0.0.1:0"))?
        .port();
    Ok(port)
}

/// Creates a fresh folder under the system temp dir, mode 0755 so postgres can traverse it.
pub(crate) fn make_temp_root() -> Result<PathBuf, LocalError> {
    let root = std::env::temp_dir().join(unique_name("shardq-tmp"));
    DirBuilder::new()
        .mode(0o755)
        .create(&root)
        .map_err(LocalError::io("create folder", &root))?;
    fs::set_permissions(&root, Permissions::from_mode(0o755))
        .map_err(LocalError::io("set permissions on", &root))?;
    Ok(root)
}
