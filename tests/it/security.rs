//! Security: TLS per shard (`sslmode`) against a server with a self-signed
//! certificate, passwords that never leak, and the documented least-privilege
//! role running a whole job cycle.

use crate::common;

use common::count_status;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use shardq::config::Config;
use shardq::shards::ShardSet;
use shardq::{Client, HandlerRegistry, NewJob, Worker, WorkerReport};
use shardq_local::EphemeralServer;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

/// Whether this session's connection is encrypted.
const SSL_IN_USE: &str = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
/// How long a server takes at most to apply a reloaded setting.
const RELOAD_LIMIT: Duration = Duration::from_secs(15);
/// How long a drain of a few hundred jobs may take on a loaded 2-core machine.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// How long one `shardq` command may take.
const CLI_LIMIT: Duration = Duration::from_secs(120);

/// Quick polling, so that `stop_when_empty` notices the end soon.
const FAST: &str = "
[dequeue]
empty_backoff_min_ms = 5
empty_backoff_max_ms = 20
connect_timeout_ms = 10000
[worker]
completion_flush_ms = 2
";

fn shard_toml(name: &str, url: &str, extra: &str) -> String {
    format!("[[shards]]\nname = \"{name}\"\nurl = \"{url}\"\npool_size = 8\n{extra}\n")
}

fn config(name: &str, url: &str, extra: &str) -> Config {
    Config::from_toml(&format!("{}{FAST}", shard_toml(name, url, extra))).expect("valid config")
}

fn config_err(text: &str) -> String {
    match Config::from_toml(text) {
        Ok(_) => panic!("config should be rejected:\n{text}"),
        Err(e) => shardq::error_chain(&e),
    }
}

async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Gives `path` to the `postgres` user when the tests run as root (the server
/// then runs as `postgres` and refuses a key it does not own).
fn give_to_postgres(path: &Path) {
    if !nix::unistd::Uid::effective().is_root() {
        return;
    }
    let user = nix::unistd::User::from_name("postgres")
        .expect("look up user postgres")
        .expect("a postgres user exists when running as root");
    nix::unistd::chown(path, Some(user.uid), Some(user.gid)).expect("chown to postgres");
}

/// Connects to shard 0 of `config` through shardq's pool and asks whether the
/// connection is encrypted; an error is the whole error chain.
async fn ssl_in_use(config: &Config) -> Result<bool, String> {
    let shards = ShardSet::connect(config).map_err(|e| shardq::error_chain(&e))?;
    let shard = shards.get(0);
    let client = shard.client().await.map_err(|e| shardq::error_chain(&e))?;
    let row = client
        .query_one(SSL_IN_USE, &[])
        .await
        .map_err(|e| shardq::error_chain(&shard.query_error(e)))?;
    Ok(row.get(0))
}

/// A CA, a second unrelated CA, and a server certificate for
/// `localhost`/`127.0.0.1` signed by the first.
struct Pki {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    other_ca: PathBuf,
    server_crt: String,
    server_key: String,
}

fn new_ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let pem = params.self_signed(&key).expect("self-sign CA").pem();
    (params, key, pem)
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let (ca_params, ca_key, ca_pem) = new_ca("shardq test CA");
        let (_, _, other_pem) = new_ca("some other CA");
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().expect("server key");
        let mut params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let server_crt = params
            .signed_by(&server_key, &issuer)
            .expect("sign server certificate")
            .pem();
        let ca = dir.path().join("ca.pem");
        let other_ca = dir.path().join("other-ca.pem");
        std::fs::write(&ca, ca_pem).unwrap();
        std::fs::write(&other_ca, other_pem).unwrap();
        Pki {
            _dir: dir,
            ca,
            other_ca,
            server_crt,
            server_key: server_key.serialize_pem(),
        }
    }
}

/// Installs the server certificate and turns `ssl` on by reloading the server.
async fn enable_ssl(server: &EphemeralServer, pki: &Pki) {
    let dir = &server.server().data_dir;
    let (crt, key) = (dir.join("server.crt"), dir.join("server.key"));
    std::fs::write(&crt, &pki.server_crt).unwrap();
    std::fs::write(&key, &pki.server_key).unwrap();
    // PostgreSQL refuses a key others may read.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    give_to_postgres(&crt);
    give_to_postgres(&key);
    let client = admin(&server.admin_url()).await;
    // One statement each: ALTER SYSTEM may not run inside a transaction block.
    for sql in [
        "ALTER SYSTEM SET ssl = on",
        "ALTER SYSTEM SET ssl_cert_file = 'server.crt'",
        "ALTER SYSTEM SET ssl_key_file = 'server.key'",
        "SELECT pg_reload_conf()",
    ] {
        client.batch_execute(sql).await.expect(sql);
    }
    // The postmaster applies the reload asynchronously; new sessions see it after.
    let started = Instant::now();
    loop {
        let row = admin(&server.admin_url())
            .await
            .query_one("SHOW ssl", &[])
            .await
            .unwrap();
        if row.get::<_, String>(0) == "on" {
            break;
        }
        assert!(started.elapsed() < RELOAD_LIMIT, "ssl never turned on");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Enqueues `n` jobs and drains them with a worker that stops when empty.
async fn enqueue_and_drain(config: &Config, shards: &ShardSet, n: usize) -> WorkerReport {
    let client = Client::from_shards(shards.clone(), config.limits.clone());
    let jobs = (0..n)
        .map(|i| NewJob::new("default", "step", serde_json::json!({ "i": i })))
        .collect();
    client.enqueue_many(jobs).await.expect("enqueue");
    let mut registry = HandlerRegistry::with_builtins();
    // A durable step too, so workflow_steps is read and written.
    registry.register("step", |ctx| async move {
        let i = ctx.payload["i"].as_i64().unwrap_or(0);
        let doubled: i64 = ctx.step("double", || async move { Ok(i * 2) }).await?;
        Ok(serde_json::json!({ "doubled": doubled }))
    });
    let worker = Worker::new(config.clone(), shards.clone(), registry).stop_when_empty(true);
    tokio::time::timeout(DRAIN_LIMIT, worker.run(CancellationToken::new()))
        .await
        .expect("the worker drains the queue in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmodes_against_a_server_with_a_self_signed_certificate() {
    let server = EphemeralServer::start().await.expect("start postgres");
    let pki = Pki::new();
    let url = server.url();
    let port = server.server().port;
    let verify = |ca: &Path| {
        format!(
            "sslmode = \"verify-full\"\nsslrootcert = \"{}\"",
            ca.display()
        )
    };

    // Without TLS on the server, `require` fails instead of falling back to plain text.
    let err = ssl_in_use(&config("tls", &url, "sslmode = \"require\""))
        .await
        .unwrap_err();
    assert!(
        err.contains("shard `tls`") && err.contains("sslmode require"),
        "{err}"
    );

    enable_ssl(&server, &pki).await;
    assert_eq!(ssl_in_use(&config("tls", &url, "")).await, Ok(false));
    let disable = config("tls", &url, "sslmode = \"disable\"");
    assert_eq!(ssl_in_use(&disable).await, Ok(false));
    let require = config("tls", &url, "sslmode = \"require\"");
    assert_eq!(ssl_in_use(&require).await, Ok(true));
    // verify-full checks the chain and the name: by IP address and by DNS name.
    assert_eq!(
        ssl_in_use(&config("tls", &url, &verify(&pki.ca))).await,
        Ok(true)
    );
    let by_name = format!("postgres://postgres@localhost:{port}/shardq");
    assert_eq!(
        ssl_in_use(&config("tls", &by_name, &verify(&pki.ca))).await,
        Ok(true)
    );
    // libpq's URL form works too.
    let in_url = format!("{url}?sslmode=verify-full&sslrootcert={}", pki.ca.display());
    assert_eq!(ssl_in_use(&config("tls", &in_url, "")).await, Ok(true));

    // A certificate from another CA is refused...
    let err = ssl_in_use(&config("tls", &url, &verify(&pki.other_ca)))
        .await
        .unwrap_err();
    assert!(
        err.contains("shard `tls`")
            && err.contains("sslmode verify-full")
            && err.contains("UnknownIssuer"),
        "{err}"
    );
    // ...and so is the right CA's certificate for another host name (the
    // connection goes to 127.0.0.1, the name checked is db.example).
    let misnamed = format!("postgres://postgres@db.example:{port}/shardq?hostaddr=127.0.0.1");
    let err = ssl_in_use(&config("tls", &misnamed, &verify(&pki.ca)))
        .await
        .unwrap_err();
    assert!(err.contains("not valid for name"), "{err}");
    // `require` does not check the certificate, like libpq's.
    let misnamed_require = config("tls", &misnamed, "sslmode = \"require\"");
    assert_eq!(ssl_in_use(&misnamed_require).await, Ok(true));

    // A whole cycle over verified TLS: migrate, enqueue, claim, complete.
    let config = config("tls", &url, &verify(&pki.ca));
    let shards = ShardSet::connect(&config).unwrap();
    shardq::migrate::migrate_all(&shards)
        .await
        .expect("migrate over TLS");
    let report = enqueue_and_drain(&config, &shards, 50).await;
    assert_eq!(report.stats.succeeded, 50);
    assert_eq!(count_status(&shards, "succeeded").await, 50);
    // Every connection shardq holds open on the server is encrypted.
    let plain: i64 = admin(&server.admin_url())
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = 'shardq' AND NOT s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plain, 0);
}

#[test]
fn tls_settings_that_cannot_work_name_the_key() {
    let url = "postgres://u@127.0.0.1:5432/db";
    let e = config_err(&shard_toml("a", url, "sslmode = \"verify-full\""));
    assert!(
        e.contains("shards[0].sslrootcert") && e.contains("verify-full"),
        "{e}"
    );
    let e = config_err(&shard_toml("a", url, "sslmode = \"verify-ca\""));
    assert!(
        e.contains("shards[0].sslmode") && e.contains("\"require\""),
        "{e}"
    );
    let e = config_err(&shard_toml(
        "a",
        url,
        "sslmode = \"verify-full\"\nsslrootcert = \"/nonexistent/ca.pem\"",
    ));
    assert!(
        e.contains("sslrootcert /nonexistent/ca.pem") && e.contains("cannot read"),
        "{e}"
    );
    let e = config_err(&shard_toml(
        "a",
        url,
        "sslmode = \"require\"\nsslrootcert = \"/ca.pem\"",
    ));
    assert!(
        e.contains("only used with sslmode = \"verify-full\""),
        "{e}"
    );
    let e = config_err(&shard_toml(
        "a",
        &format!("{url}?sslmode=require"),
        "sslmode = \"disable\"",
    ));
    assert!(
        e.contains("shards[0].sslmode") && e.contains("in the url"),
        "{e}"
    );
    // A file that is not a certificate.
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "hello\n").unwrap();
    let e = config_err(&shard_toml(
        "a",
        url,
        &format!(
            "sslmode = \"verify-full\"\nsslrootcert = \"{}\"",
            junk.display()
        ),
    ));
    assert!(e.contains("no PEM certificate"), "{e}");
    // The default is plain TCP, as before this setting existed.
    let config = Config::from_toml(&shard_toml("a", url, "")).unwrap();
    assert_eq!(config.shards[0].tls.name(), "disable");
    assert_eq!(
        config.shards[0].pg.get_ssl_mode(),
        tokio_postgres::config::SslMode::Disable
    );
}

/// A server where role `app_pw` must give its password (scram-sha-256), and
/// that password, unique to this run.
async fn password_server() -> (EphemeralServer, String) {
    let server = EphemeralServer::start().await.expect("start postgres");
    let password = format!("pw-{:016x}", rand::random::<u64>());
    admin(&server.admin_url())
        .await
        .batch_execute(&format!(
            "CREATE ROLE app_pw LOGIN SUPERUSER PASSWORD '{password}'"
        ))
        .await
        .unwrap();
    // initdb's pg_hba.conf trusts everyone; the first matching line wins.
    let hba = server.server().data_dir.join("pg_hba.conf");
    let text = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("host all app_pw 127.0.0.1/32 scram-sha-256\n{text}"),
    )
    .unwrap();
    admin(&server.admin_url())
        .await
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    // Reloaded once app_pw cannot log in without its password any more.
    let no_password = server.url().replace("postgres@", "app_pw@");
    let started = Instant::now();
    while tokio_postgres::connect(&no_password, NoTls).await.is_ok() {
        assert!(
            started.elapsed() < RELOAD_LIMIT,
            "pg_hba.conf never reloaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (server, password)
}

async fn current_user(config: &Config) -> Result<String, String> {
    let shards = ShardSet::connect(config).map_err(|e| shardq::error_chain(&e))?;
    let client = shards
        .get(0)
        .client()
        .await
        .map_err(|e| shardq::error_chain(&e))?;
    let row = client.query_one("SELECT current_user::text", &[]).await;
    Ok(row.map_err(|e| e.to_string())?.get(0))
}

/// Runs the `shardq` binary with debug logging; returns (success, stdout + stderr).
async fn shardq_cli(config: &Path, env: &[(&str, &str)], args: &[&str]) -> (bool, String) {
    let run = tokio::process::Command::new(shardq_harness::exe::shardq())
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "debug")
        .env_remove("SHARDQ_CONFIG")
        .envs(env.iter().copied())
        // A test that fails or times out leaves no process behind.
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(CLI_LIMIT, run)
        .await
        .unwrap_or_else(|_| panic!("shardq {args:?} ran longer than {CLI_LIMIT:?}"))
        .expect("run shardq");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_from_url_file_or_environment_and_never_in_output() {
    let (server, password) = password_server().await;
    let port = server.server().port;
    let base = format!("postgres://app_pw@127.0.0.1:{port}/shardq");
    let dir = tempfile::tempdir().unwrap();

    // From the URL.
    let in_url = config(
        "pw",
        &base.replace("app_pw@", &format!("app_pw:{password}@")),
        "",
    );
    assert_eq!(current_user(&in_url).await.as_deref(), Ok("app_pw"));
    // From a file (first line).
    let file = dir.path().join("pw.txt");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    let from_file = config(
        "pw",
        &base,
        &format!("password_file = \"{}\"", file.display()),
    );
    assert_eq!(current_user(&from_file).await.as_deref(), Ok("app_pw"));
    // `Debug` of the configuration shows neither.
    for config in [&in_url, &from_file] {
        let debug = format!("{config:?} {:?}", ShardSet::connect(config).unwrap());
        assert!(!debug.contains(&password), "{debug}");
    }

    // A wrong password: the error names the shard and shows no password.
    let wrong = format!("wrong-{:016x}", rand::random::<u64>());
    let bad = config(
        "pw",
        &base.replace("app_pw@", &format!("app_pw:{wrong}@")),
        "",
    );
    let shards = ShardSet::connect(&bad).unwrap();
    let err = shards.get(0).client().await.unwrap_err();
    let text = format!("{} {err:?}", shardq::error_chain(&err));
    assert!(text.contains("shard `pw`"), "{text}");
    assert!(text.contains("password authentication failed"), "{text}");
    assert!(
        !text.contains(&wrong) && !text.contains(&password),
        "{text}"
    );

    // An unset variable and a password given twice are named, not guessed at.
    let var = format!("SHARDQ_TEST_UNSET_{:x}", rand::random::<u32>());
    let e = config_err(&shard_toml(
        "pw",
        &base,
        &format!("password_env = \"{var}\""),
    ));
    assert!(
        e.contains("shards[0].password_env") && e.contains(&var),
        "{e}"
    );
    let twice = shard_toml(
        "pw",
        &base.replace("app_pw@", &format!("app_pw:{password}@")),
        &format!("password_file = \"{}\"", file.display()),
    );
    let e = config_err(&twice);
    assert!(
        e.contains("`url` and `password_file`") && !e.contains(&password),
        "{e}"
    );

    // The binary, with debug logs, through the environment variable.
    let var = "SHARDQ_SECURITY_TEST_PASSWORD";
    let path = dir.path().join("shards.toml");
    std::fs::write(
        &path,
        format!(
            "{}{FAST}",
            shard_toml("pw", &base, &format!("password_env = \"{var}\""))
        ),
    )
    .unwrap();
    let env = [(var, password.as_str())];
    for args in [
        &["migrate"][..],
        &["enqueue", "--queue", "default", "--count", "20"],
        &["status"],
        &["worker", "--until-empty"],
    ] {
        let (ok, output) = shardq_cli(&path, &env, args).await;
        assert!(ok, "shardq {args:?} failed:\n{output}");
        assert!(
            !output.contains(&password),
            "shardq {args:?} printed the password"
        );
        assert!(
            output.contains("DEBUG"),
            "no debug logs to check:\n{output}"
        );
    }
    // The password in the URL, and a failing login.
    let in_url_path = dir.path().join("in-url.toml");
    let url_with = |pw: &str| base.replace("app_pw@", &format!("app_pw:{pw}@"));
    std::fs::write(&in_url_path, shard_toml("pw", &url_with(&password), "")).unwrap();
    let (ok, output) = shardq_cli(&in_url_path, &[], &["status"]).await;
    assert!(ok && !output.contains(&password), "{output}");
    std::fs::write(&in_url_path, shard_toml("pw", &url_with(&wrong), "")).unwrap();
    // (Not `worker`: it keeps retrying a shard it cannot log in to.)
    for args in [&["status"][..], &["migrate"]] {
        let (_, output) = shardq_cli(&in_url_path, &[], args).await;
        assert!(
            output.contains("password authentication failed"),
            "shardq {args:?} did not try to log in:\n{output}"
        );
        assert!(
            !output.contains(&wrong),
            "shardq {args:?} printed the password"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_privilege_role_runs_a_whole_cycle_and_nothing_more() {
    let server = EphemeralServer::start().await.expect("start postgres");
    // The owner (here the superuser) migrates, then runs the documented SQL.
    let owner = config("lp", &server.url(), "");
    let owner_shards = ShardSet::connect(&owner).unwrap();
    shardq::migrate::migrate_all(&owner_shards).await.unwrap();
    let setup = admin(&server.url()).await;
    setup
        .batch_execute(include_str!("../../docs/least_privilege.sql"))
        .await
        .expect("docs/least_privilege.sql runs");
    // Running it again changes nothing and fails nothing.
    setup
        .batch_execute(include_str!("../../docs/least_privilege.sql"))
        .await
        .expect("docs/least_privilege.sql runs twice");
    setup
        .batch_execute("CREATE ROLE app_worker LOGIN IN ROLE shardq_worker")
        .await
        .unwrap();

    let url = server.url().replace("postgres@", "app_worker@");
    let config = config("lp", &url, "");
    let shards = ShardSet::connect(&config).unwrap();
    shardq::migrate::check_all(&shards)
        .await
        .expect("the worker role can read the schema version");
    let report = enqueue_and_drain(&config, &shards, 200).await;
    assert_eq!(report.stats.succeeded, 200);
    assert_eq!((report.stats.retrying, report.stats.claim_errors), (0, 0));
    assert_eq!(count_status(&shards, "succeeded").await, 200);
    // Upkeep and retention run under the role too.
    let shard = shards.get(0);
    shardq::store::upkeep::recover_expired(shard, 100)
        .await
        .unwrap();
    shardq::store::upkeep::promote_due(shard, 100)
        .await
        .unwrap();
    let deleted = shardq::store::upkeep::delete_finished(shard, Duration::ZERO, 10_000)
        .await
        .unwrap();
    assert_eq!(deleted, 200);

    // Messages: a workflow sends to itself and receives it, under the role.
    let owner_client = shardq::Client::from_shards(owner_shards.clone(), owner.limits.clone());
    let mail = owner_client
        .enqueue(NewJob::new("default", "mail", serde_json::json!({})))
        .await
        .unwrap();
    let mut registry = HandlerRegistry::new();
    registry.register("mail", |ctx| async move {
        ctx.send(ctx.id, "self", serde_json::json!("echo")).await?;
        let got = ctx.recv("self", Duration::ZERO).await?;
        ctx.set_event("got", serde_json::json!(got)).await?;
        let read = ctx.get_event(ctx.id, "got", Duration::ZERO).await?;
        Ok(serde_json::json!(read))
    });
    let worker = Worker::new(config.clone(), shards.clone(), registry).stop_when_empty(true);
    tokio::time::timeout(DRAIN_LIMIT, worker.run(CancellationToken::new()))
        .await
        .expect("the worker runs the mail job");
    assert_eq!(
        owner_client
            .job(mail)
            .await
            .unwrap()
            .expect("the job")
            .output,
        Some(serde_json::json!("echo")),
        "the worker role sends and receives, sets and reads an event"
    );

    // A claim of grouped jobs under group limits (the buckets' table).
    owner_client
        .set_queue_limits(
            "grouped",
            shardq::client::QueueLimits {
                group_concurrency: Some(5),
                group_rate: Some(shardq::client::StartRate {
                    count: 1000,
                    per: Duration::from_secs(1),
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let grouped = (0..20)
        .map(|_| shardq::NewJob::new("grouped", "noop", serde_json::json!({})).group("t"))
        .collect();
    owner_client.enqueue_many(grouped).await.unwrap();
    // The claim moves the floors and the grouped rounds as the owner
    // (shardq_advance_ready_floors), though the role may not call the
    // rounds' mover itself (below).
    setup
        .batch_execute("UPDATE shardq_ready_barrier SET advanced_at = '-infinity'")
        .await
        .unwrap();
    let client = shard.client().await.unwrap();
    let taken = client
        .query(
            "SELECT id FROM shardq_claim(1, 0, 'grouped', 10, 'w', 60000) WHERE id IS NOT NULL",
            &[],
        )
        .await
        .expect("the worker role claims under group limits");
    assert_eq!(taken.len(), 5, "the group's concurrency");
    let moved: bool = setup
        .query_one(
            "SELECT max(advanced_at) > now() - interval '1 minute' FROM shardq_ready_barrier",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(moved, "the worker role's claim moved the floors and rounds");
    shardq::store::upkeep::forget_full_buckets(shard, 100)
        .await
        .expect("the worker role forgets full buckets");

    // Nothing beyond that: no DDL, no migration records.
    for sql in [
        "CREATE TABLE x ()",
        "DROP TABLE workflow_status",
        "TRUNCATE workflow_status",
        "INSERT INTO shardq_migrations (version, name) VALUES (999, 'x')",
        "ALTER TABLE workflow_status ADD COLUMN x int",
        // Called out of the floors' move, it could pass a job being written.
        "SELECT shardq_move_group_rounds(1, true)",
    ] {
        let err = client.batch_execute(sql).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: {err}"
        );
    }
    assert!(
        shardq::migrate::migrate_all(&shards).await.is_err(),
        "migrating needs the owner"
    );
    let err = client
        .batch_execute("UPDATE workflow_steps SET output = 'null'")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{err}");

    // A producer enqueues, reads status, cancels; it deletes no job and
    // writes no step output.
    setup
        .batch_execute("CREATE ROLE app_producer LOGIN IN ROLE shardq_producer")
        .await
        .unwrap();
    let url = server.url().replace("postgres@", "app_producer@");
    let producer_config =
        Config::from_toml(&format!("{}{FAST}", shard_toml("lp", &url, ""))).unwrap();
    let producer = shardq::Client::new(&producer_config).unwrap();
    let id = producer
        .enqueue(shardq::NewJob::new(
            "default",
            "noop",
            serde_json::json!({}),
        ))
        .await
        .expect("a producer enqueues");
    assert!(producer.status().await[0].counts.is_some(), "status works");
    // The backlog read (grouped jobs counted from the grouped floors).
    let depth = producer.depth("default").await.unwrap();
    assert!(depth.failed.is_empty(), "depth works: {:?}", depth.failed);
    assert_eq!(depth.counts.queued, 1);
    producer
        .send(id, "t", serde_json::json!(1), Some("k"))
        .await
        .expect("a producer sends a message");
    let sent = producer
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT written FROM shardq_send($1, $2, 't', '2', 'k2')",
            &[&id.shard_key, &id.id],
        )
        .await
        .expect("a producer sends from SQL");
    assert!(sent.get::<_, bool>(0));
    assert_eq!(
        producer
            .get_event(mail, "got", Duration::ZERO)
            .await
            .expect("a producer reads an event"),
        Some(serde_json::json!("echo"))
    );
    assert_eq!(
        producer.cancel(id).await.unwrap().map(|s| s.as_str()),
        Some("cancelled")
    );
    let db = producer.shards().get(0).client().await.unwrap();
    for sql in [
        "DELETE FROM workflow_status",
        "INSERT INTO workflow_steps (shard_key, workflow_id, step_name) VALUES (0, 1, 'x')",
        "UPDATE workflow_steps SET output = 'null'",
        "DELETE FROM workflow_steps",
        "INSERT INTO workflow_events (shard_key, workflow_id, key, value) VALUES (0, 1, 'x', '1')",
        "UPDATE workflow_events SET value = 'null'",
        "SELECT shardq_move_group_rounds(1, true)",
    ] {
        let err = db.batch_execute(sql).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: {err}"
        );
    }
}
