//! Creating data folders by copying a once-initialized template (initdb takes seconds,
//! a copy takes milliseconds).

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::binaries::{
    chown_to_postgres, create_dirs_0755, has_pg_stat_statements, is_root, pg_command, run,
};
use super::error::LocalError;

/// A name no other process or call uses: `{prefix}-{pid}-{counter}-{random}`.
pub(crate) fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let r: u32 = rand::random();
    format!("{prefix}-{}-{n}-{r:08x}", std::process::id())
}

/// Where the shared template lives; per user, since its files belong to whoever ran initdb.
fn template_path() -> PathBuf {
    let owner = if is_root() {
        "root".to_string()
    } else {
        nix::unistd::Uid::effective().to_string()
    };
    std::env::temp_dir().join(format!("shardq-initdb-template-v1-{owner}"))
}

/// Returns the template data folder, running initdb once if it is missing.
fn ensure_template() -> Result<PathBuf, LocalError> {
    // Threads of one process wait for each other instead of all running initdb.
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let template = template_path();
    if template.join("PG_VERSION").is_file() {
        return Ok(template);
    }
    // A template only appears by rename once complete, so a partial one was damaged
    // (e.g. by a tmp cleaner): drop it so our rename can take its place.
    if template.exists() {
        let _ = fs::remove_dir_all(&template);
    }
    let name = template.file_name().unwrap_or_default().to_string_lossy();
    let staging = std::env::temp_dir().join(unique_name(&format!("{name}.tmp")));
    let result = initdb(&staging).and_then(|()| {
        fs::rename(&staging, &template).or_else(|e| {
            // Another process won the race; its template is as good as ours.
            if template.join("PG_VERSION").is_file() {
                Ok(())
            } else {
                Err(LocalError::io("move template into place at", &template)(e))
            }
        })
    });
    if staging.exists() {
        let _ = fs::remove_dir_all(&staging);
    }
    result.map(|()| template)
}

fn initdb(dir: &Path) -> Result<(), LocalError> {
    DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(LocalError::io("create folder", dir))?;
    chown_to_postgres(dir)?;
    let mut cmd = pg_command("initdb")?;
    cmd.arg("-D").arg(dir).args([
        "-U",
        "postgres",
        "-A",
        "trust",
        "-E",
        "UTF8",
        "--no-sync",
        "--locale=C",
    ]);
    run(&mut cmd).map(drop)
}

/// Server settings appended to postgresql.conf of each new data folder (the port is
/// passed at start instead, since it belongs to the server, not the data).
fn settings() -> String {
    let mut s = String::from(
        "\n# added by shardq\n\
         listen_addresses = '127.0.0.1'\n\
         unix_socket_directories = ''\n\
         max_connections = 300\n\
         shared_buffers = 128MB\n\
         fsync = on\n\
         synchronous_commit = on\n\
         wal_level = minimal\n\
         max_wal_senders = 0\n\
         max_wal_size = 2GB\n\
         checkpoint_timeout = 15min\n\
         autovacuum_naptime = 10s\n",
    );
    if has_pg_stat_statements() {
        s.push_str("shared_preload_libraries = 'pg_stat_statements'\n");
    }
    s
}

/// Creates `data_dir` as a configured copy of the template. A concurrent creator of the
/// same folder is tolerated: the copy is staged beside it and renamed into place.
pub(crate) fn create_data_dir(data_dir: &Path) -> Result<(), LocalError> {
    let template = ensure_template()?;
    let parent = match data_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    create_dirs_0755(parent)?;
    let base = data_dir.file_name().unwrap_or_default().to_string_lossy();
    let staging = parent.join(unique_name(&format!(".{base}.tmp")));
    // `cp -a` keeps the postgres ownership and the 0700 mode postgres insists on.
    let result = run(Command::new("cp").arg("-a").arg(&template).arg(&staging))
        .and_then(|_| {
            let conf = staging.join("postgresql.conf");
            OpenOptions::new()
                .append(true)
                .open(&conf)
                .and_then(|mut f| f.write_all(settings().as_bytes()))
                .map_err(LocalError::io("write settings to", conf))
        })
        .and_then(|()| {
            fs::rename(&staging, data_dir).or_else(|e| {
                if data_dir.join("PG_VERSION").is_file() {
                    Ok(())
                } else {
                    Err(LocalError::io(
                        "move new data folder into place at",
                        data_dir,
                    )(e))
                }
            })
        });
    if staging.exists() {
        let _ = fs::remove_dir_all(&staging);
    }
    result
}
