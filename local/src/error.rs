//! Errors from managing local PostgreSQL servers.

use std::path::PathBuf;
use std::process::ExitStatus;

/// Why starting, stopping or preparing a local PostgreSQL server failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// No PostgreSQL binaries were found on this machine.
    #[error(
        "postgresql binaries not found (looked at SHARDQ_PG_BIN, /usr/lib/postgresql/*/bin \
         and `pg_config --bindir`): install PostgreSQL (`apt-get install -y postgresql`) \
         or set SHARDQ_PG_BIN to the folder holding pg_ctl"
    )]
    BinariesNotFound,

    /// We run as root but there is no `postgres` system user to run the server as.
    #[error(
        "running as root needs a `postgres` system user to run postgresql as, and there is none"
    )]
    NoPostgresUser,

    /// A command could not be launched at all.
    #[error("could not run `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// The launch error.
        #[source]
        source: std::io::Error,
    },

    /// A command ran and exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote to stderr (or stdout when stderr was empty).
        stderr: String,
    },

    /// `pg_ctl start` failed; carries the end of the server log.
    #[error(
        "could not start postgresql in {}: {stderr}\n--- last lines of server.log ---\n{log_tail}",
        data_dir.display()
    )]
    StartFailed {
        /// The data folder of the server.
        data_dir: PathBuf,
        /// What pg_ctl wrote.
        stderr: String,
        /// The last lines of `server.log`.
        log_tail: String,
    },

    /// A file system operation failed.
    #[error("could not {action} {}", path.display())]
    Io {
        /// What we tried, e.g. "create folder".
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A system call through `nix` failed.
    #[error("could not {action}")]
    Nix {
        /// What we tried.
        action: String,
        /// The underlying error.
        #[source]
        source: nix::Error,
    },

    /// Talking to the server failed.
    #[error("postgresql: could not {action}")]
    Postgres {
        /// What we tried.
        action: String,
        /// The underlying error.
        #[source]
        source: tokio_postgres::Error,
    },

    /// A background task running a blocking step panicked or was cancelled.
    #[error("background task for a local server failed")]
    Task(#[source] tokio::task::JoinError),
}

impl LocalError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| LocalError::Io {
            action,
            path,
            source,
        }
    }
}
