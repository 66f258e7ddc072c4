//! Tests that start real servers from the system binaries.

use std::net::{Ipv4Addr, TcpListener};
use std::time::Instant;

use tokio_postgres::NoTls;

use super::ephemeral::make_temp_root;
use super::*;

async fn select_one(url: &str) -> i32 {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
        .query_one("SELECT 1", &[])
        .await
        .expect("select")
        .get(0)
}

/// Two consecutive ports that were free a moment ago.
fn free_port_pair() -> u16 {
    loop {
        let first = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let port = first.local_addr().expect("addr").port();
        if port < u16::MAX && TcpListener::bind((Ipv4Addr::LOCALHOST, port + 1)).is_ok() {
            return port;
        }
    }
}

/// Stops the servers and deletes the folder even when a test fails.
struct Cleanup(LocalOptions, std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for server in servers(&self.0) {
            let _ = server.stop(StopMode::Immediate);
        }
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

#[test]
fn urls_and_ports() {
    let opts = LocalOptions {
        root: "/x".into(),
        base_port: 7000,
        shards: 3,
    };
    let all = servers(&opts);
    assert_eq!(all.len(), 3);
    assert_eq!(all[2].port, 7002);
    assert_eq!(all[2].data_dir, std::path::Path::new("/x/shard-2"));
    assert_eq!(all[1].url(), "postgres://postgres@127.0.0.1:7001/shardq");
    assert_eq!(
        all[1].admin_url(),
        "postgres://postgres@127.0.0.1:7001/postgres"
    );
    assert!(!all[0].is_running());
}

#[tokio::test]
async fn ephemeral_stop_and_start_again() {
    let begin = Instant::now();
    let pg = EphemeralServer::start()
        .await
        .expect("start ephemeral server");
    eprintln!("EphemeralServer::start took {:?}", begin.elapsed());
    assert!(pg.server().is_running());
    assert_eq!(select_one(&pg.url()).await, 1);

    pg.stop(StopMode::Immediate).expect("stop");
    assert!(!pg.server().is_running());
    pg.stop(StopMode::Immediate)
        .expect("stopping a stopped server is a no-op");

    pg.start_again().expect("start again");
    assert!(pg.server().is_running());
    assert_eq!(select_one(&pg.url()).await, 1);

    let data_dir = pg.server().data_dir.clone();
    drop(pg);
    assert!(!data_dir.exists(), "drop deletes the folder");
}

#[tokio::test]
async fn create_database_quotes_and_is_idempotent() {
    let pg = EphemeralServer::start()
        .await
        .expect("start ephemeral server");
    let name = r#"odd "name" db"#;
    create_database(&pg.admin_url(), name)
        .await
        .expect("create");
    create_database(&pg.admin_url(), name)
        .await
        .expect("create again");
    let (client, connection) = tokio_postgres::connect(&pg.admin_url(), NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .expect("query");
    assert_eq!(row.get::<_, i64>(0), 1);
}

#[tokio::test]
async fn up_twice_then_down() {
    let tmp = make_temp_root().expect("temp root");
    let opts = LocalOptions {
        // A missing folder, to check that up creates it.
        root: tmp.join("cluster"),
        base_port: free_port_pair(),
        shards: 2,
    };
    let _cleanup = Cleanup(opts.clone(), tmp);

    let first = up(&opts).await.expect("up");
    assert_eq!(first, servers(&opts));
    for server in &first {
        assert!(server.is_running());
        assert_eq!(select_one(&server.url()).await, 1);
    }

    let second = up(&opts).await.expect("up again");
    assert_eq!(first, second);
    for server in &second {
        assert_eq!(select_one(&server.url()).await, 1);
    }

    down(&opts).expect("down");
    for server in &first {
        assert!(!server.is_running());
    }
    down(&opts).expect("down again is a no-op");
}

#[test]
fn start_failure_reports_the_log() {
    let tmp = make_temp_root().expect("temp root");
    let busy = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = busy.local_addr().expect("addr").port();
    let server = LocalServer::new(&tmp, 0, port);
    let err = server.start().expect_err("port is taken");
    let text = err.to_string();
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(matches!(err, LocalError::StartFailed { .. }), "{text}");
    assert!(
        text.contains("could not create any TCP/IP sockets"),
        "{text}"
    );
}

#[test]
fn identifiers_are_quoted_with_their_quotes_doubled() {
    assert_eq!(super::database::quote_ident(r#"a"b"#), r#""a""b""#);
}
