//! Finding the PostgreSQL binaries and running them, as the `postgres` user when we are root
//! (initdb and postgres refuse to run as root).

use std::fs::{DirBuilder, Permissions};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use nix::unistd::{chown, Uid, User};

use super::error::LocalError;

const DEFAULT_BIN_DIR: &str = "/usr/lib/postgresql/15/bin";

/// The folder holding pg_ctl, initdb and postgres (looked up once per process).
pub(crate) fn bin_dir() -> Result<PathBuf, LocalError> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(find_bin_dir)
        .clone()
        .ok_or(LocalError::BinariesNotFound)
}

fn has_pg_ctl(dir: &Path) -> bool {
    dir.join("pg_ctl").is_file()
}

fn find_bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SHARDQ_PG_BIN") {
        let dir = PathBuf::from(dir);
        return has_pg_ctl(&dir).then_some(dir);
    }
    let default = PathBuf::from(DEFAULT_BIN_DIR);
    if has_pg_ctl(&default) {
        return Some(default);
    }
    newest_installed().or_else(from_pg_config)
}

/// The highest-versioned /usr/lib/postgresql/*/bin (Debian layout).
fn newest_installed() -> Option<PathBuf> {
    let version = |name: &str| -> Option<Vec<u32>> {
        name.split('.').map(|part| part.parse().ok()).collect()
    };
    std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let v = version(entry.file_name().to_str()?)?;
            let bin = entry.path().join("bin");
            has_pg_ctl(&bin).then_some((v, bin))
        })
        .max()
        .map(|(_, bin)| bin)
}

fn from_pg_config() -> Option<PathBuf> {
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (out.status.success() && has_pg_ctl(&dir)).then_some(dir)
}

/// Whether `share/extension/pg_stat_statements.control` is installed (checked once).
pub(crate) fn has_pg_stat_statements() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        let Ok(bin) = bin_dir() else { return false };
        let pg_config = bin.join("pg_config");
        let mut cmd = if pg_config.is_file() {
            Command::new(pg_config)
        } else {
            Command::new("pg_config")
        };
        let Ok(out) = run(cmd.arg("--sharedir")) else {
            return false;
        };
        let share = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        share.join("extension/pg_stat_statements.control").is_file()
    })
}

/// Whether we must hand the binaries over to the `postgres` user.
pub(crate) fn is_root() -> bool {
    Uid::effective().is_root()
}

/// A command for a PostgreSQL binary, wrapped in `runuser -u postgres` when we are root.
pub(crate) fn pg_command(name: &str) -> Result<Command, LocalError> {
    let exe = bin_dir()?.join(name);
    let mut cmd = if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(exe);
        // Our cwd may be unreadable for postgres (e.g. /root).
        cmd.current_dir("/");
        cmd
    } else {
        Command::new(exe)
    };
    cmd.stdin(Stdio::null());
    Ok(cmd)
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|part| part.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` to completion; a non-zero exit becomes an error carrying its stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<Output, LocalError> {
    let command = describe(cmd);
    let out = cmd.output().map_err(|source| LocalError::Spawn {
        command: command.clone(),
        source,
    })?;
    if out.status.success() {
        return Ok(out);
    }
    let text = if out.stderr.iter().all(u8::is_ascii_whitespace) {
        &out.stdout
    } else {
        &out.stderr
    };
    Err(LocalError::CommandFailed {
        command,
        status: out.status,
        stderr: String::from_utf8_lossy(text).trim().to_string(),
    })
}

/// Gives `path` to the `postgres` user when we are root (no-op otherwise).
pub(crate) fn chown_to_postgres(path: &Path) -> Result<(), LocalError> {
    if !is_root() {
        return Ok(());
    }
    let user = User::from_name("postgres")
        .map_err(|source| LocalError::Nix {
            action: "look up the postgres user".into(),
            source,
        })?
        .ok_or(LocalError::NoPostgresUser)?;
    chown(path, Some(user.uid), Some(user.gid)).map_err(|source| LocalError::Nix {
        action: format!("chown {} to postgres", path.display()),
        source,
    })
}

/// Creates `path` and any missing parents with mode 0755, so postgres can traverse them.
pub(crate) fn create_dirs_0755(path: &Path) -> Result<(), LocalError> {
    let missing: Vec<&Path> = path
        .ancestors()
        .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
        .collect();
    for dir in missing.into_iter().rev() {
        match DirBuilder::new().mode(0o755).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(LocalError::io("create folder", dir)(e)),
        }
        // The umask may have narrowed the mode.
        std::fs::set_permissions(dir, Permissions::from_mode(0o755))
            .map_err(LocalError::io("set permissions on", dir))?;
    }
    Ok(())
}
