//! A real PgBouncer in transaction pooling mode in front of a test server, for tests
//! that must work through connection poolers.
//!
//! ```ignore
//! let shards = TestShards::servers(1).await;
//! let bouncer = PgBouncer::start(shards.servers[0].server().port).await;
//! let url = bouncer.url_for(&shards.urls[0]); // same database, through PgBouncer
//! ```

use nix::sys::signal::{kill, Signal};
use nix::unistd::{chown, Pid, Uid, User};
use std::fs::{self, DirBuilder, File, Permissions};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static DIR_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// How long `start` waits for PgBouncer to serve a query.
const READY_LIMIT: Duration = Duration::from_secs(10);
/// How many free ports `start` tries (another process may take one between our probe
/// and PgBouncer's bind).
const START_ATTEMPTS: usize = 3;

/// A PgBouncer process on a free 127.0.0.1 port with its files in a temp folder; killed
/// and its folder removed on drop.
pub struct PgBouncer {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    /// Starts PgBouncer in transaction pooling mode in front of the server at
    /// 127.0.0.1:`server_port`, for every database on it.
    pub async fn start(server_port: u16) -> PgBouncer {
        Self::start_with(server_port, &[]).await
    }

    /// Like [`PgBouncer::start`], with `[pgbouncer]` settings replaced or added, e.g.
    /// `&[("default_pool_size", "2")]`.
    pub async fn start_with(server_port: u16, overrides: &[(&str, &str)]) -> PgBouncer {
        let dir = make_dir();
        let mut this = PgBouncer {
            child: None,
            dir,
            port: 0,
        };
        for attempt in 1..=START_ATTEMPTS {
            this.port = free_port();
            this.write_config(server_port, overrides);
            this.child = Some(this.spawn());
            match this.wait_ready().await {
                Ok(()) => return this,
                // Exited early (most likely the port was taken): try another port.
                Err(exited) if exited && attempt < START_ATTEMPTS => this.stop(),
                Err(_) => {
                    this.stop();
                    panic!(
                        "PgBouncer did not start on 127.0.0.1:{} in front of port {server_port}\n{}",
                        this.port,
                        this.log_tail()
                    );
                }
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// The port PgBouncer listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `url` (a URL of the server behind) rewritten to go through PgBouncer: same user,
    /// database and parameters, host and port replaced by PgBouncer's.
    pub fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("url has a scheme");
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let userinfo = match authority.rfind('@') {
            Some(at) => &authority[..=at],
            None => "",
        };
        format!("{scheme}://{userinfo}127.0.0.1:{}{tail}", self.port)
    }

    /// The URL of PgBouncer's admin console (`SHOW POOLS;` etc. through `simple_query`).
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/pgbouncer", self.port)
    }

    /// The last lines of PgBouncer's log and console output.
    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        for name in ["pgbouncer.log", "console.log"] {
            let content = fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let lines: Vec<&str> = content.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            text.push_str(&format!("--- {name} (last lines) ---\n{tail}\n"));
        }
        text
    }

    fn write_config(&self, server_port: u16, overrides: &[(&str, &str)]) {
        let dir = self.dir.display();
        let mut settings: Vec<(String, String)> = [
            ("listen_addr", "127.0.0.1".to_string()),
            ("listen_port", self.port.to_string()),
            ("unix_socket_dir", String::new()),
            ("auth_type", "trust".to_string()),
            ("auth_file", format!("{dir}/userlist.txt")),
            ("admin_users", "postgres".to_string()),
            ("pool_mode", "transaction".to_string()),
            ("default_pool_size", "10".to_string()),
            ("max_client_conn", "200".to_string()),
            ("server_reset_query", String::new()),
            (
                "ignore_startup_parameters",
                "extra_float_digits".to_string(),
            ),
            ("logfile", format!("{dir}/pgbouncer.log")),
            ("pidfile", format!("{dir}/pgbouncer.pid")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (key, value) in overrides {
            match settings.iter_mut().find(|(k, _)| k == key) {
                Some(entry) => entry.1 = value.to_string(),
                None => settings.push((key.to_string(), value.to_string())),
            }
        }
        let mut ini =
            format!("[databases]\n* = host=127.0.0.1 port={server_port}\n\n[pgbouncer]\n");
        for (key, value) in &settings {
            ini.push_str(&format!("{key} = {value}\n"));
        }
        write_readable(&self.dir.join("pgbouncer.ini"), &ini);
        write_readable(&self.dir.join("userlist.txt"), "\"postgres\" \"\"\n");
    }

    fn spawn(&self) -> Child {
        let exe = binary();
        let mut cmd = if Uid::effective().is_root() {
            // PgBouncer refuses to run as root.
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(exe);
            cmd
        } else {
            Command::new(exe)
        };
        let console = File::create(self.dir.join("console.log")).expect("create console.log");
        let console_err = console.try_clone().expect("clone console.log handle");
        cmd.arg(self.dir.join("pgbouncer.ini"))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(console)
            .stderr(console_err);
        cmd.spawn()
            .unwrap_or_else(|e| panic!("spawn PgBouncer ({cmd:?}): {e}"))
    }

    /// `Ok` once a query through PgBouncer succeeds; `Err(true)` when the process exited
    /// first, `Err(false)` on timeout.
    async fn wait_ready(&mut self) -> Result<(), bool> {
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port);
        let started = Instant::now();
        loop {
            let child = self.child.as_mut().expect("spawned");
            if let Ok(Some(_)) = child.try_wait() {
                return Err(true);
            }
            if let Ok(Ok((client, conn))) = tokio::time::timeout(
                Duration::from_secs(2),
                tokio_postgres::connect(&url, tokio_postgres::NoTls),
            )
            .await
            {
                let task = tokio::spawn(conn);
                let ok = client.simple_query("SELECT 1").await.is_ok();
                drop(client);
                let _ = task.await;
                if ok {
                    return Ok(());
                }
            }
            if started.elapsed() > READY_LIMIT {
                return Err(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills PgBouncer (SIGTERM, then SIGKILL after 5 s) and waits for it.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // As root the child is `runuser`: signal PgBouncer itself (by its pidfile), so
        // that runuser sees it exit, reaps it and exits in turn.
        let bouncer = fs::read_to_string(self.dir.join("pgbouncer.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .map(Pid::from_raw);
        let runner = Pid::from_raw(child.id() as i32);
        if let Ok(None) = child.try_wait() {
            let _ = kill(bouncer.unwrap_or(runner), Signal::SIGTERM);
            let started = Instant::now();
            let mut runner_signalled = bouncer.is_none();
            while let Ok(None) = child.try_wait() {
                if !runner_signalled && started.elapsed() > Duration::from_secs(2) {
                    let _ = kill(runner, Signal::SIGTERM);
                    runner_signalled = true;
                }
                if started.elapsed() > Duration::from_secs(5) {
                    for pid in bouncer.into_iter().chain([runner]) {
                        let _ = kill(pid, Signal::SIGKILL);
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = child.wait();
        // Should runuser have gone first, do not leave PgBouncer behind.
        if let Some(pid) = bouncer {
            if kill(pid, None).is_ok() {
                let _ = kill(pid, Signal::SIGKILL);
            }
        }
        let _ = fs::remove_file(self.dir.join("pgbouncer.pid"));
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The PgBouncer binary: /usr/sbin/pgbouncer (Debian) or `pgbouncer` on PATH.
fn binary() -> PathBuf {
    let sbin = Path::new("/usr/sbin/pgbouncer");
    if sbin.is_file() {
        return sbin.to_path_buf();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("pgbouncer"))
        .find(|p| p.is_file())
        .expect("pgbouncer not found at /usr/sbin/pgbouncer or on PATH (apt-get install pgbouncer)")
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A fresh folder in the temp dir, owned by `postgres` when we are root (PgBouncer
/// writes its log and pidfile there).
fn make_dir() -> PathBuf {
    let n = DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
    let r: u32 = rand::random();
    let dir = std::env::temp_dir().join(format!(
        "shardq-pgbouncer-{}-{n}-{r:08x}",
        std::process::id()
    ));
    DirBuilder::new()
        .mode(0o755)
        .create(&dir)
        .unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    fs::set_permissions(&dir, Permissions::from_mode(0o755)).expect("chmod PgBouncer folder");
    if Uid::effective().is_root() {
        let user = User::from_name("postgres")
            .expect("look up the postgres user")
            .expect("a postgres system user (PgBouncer refuses to run as root)");
        chown(&dir, Some(user.uid), Some(user.gid))
            .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", dir.display()));
    }
    dir
}

/// Writes `path` readable by everyone (PgBouncer may run as another user).
fn write_readable(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    fs::set_permissions(path, Permissions::from_mode(0o644))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}
