//! The lossy proxy's faults against a real PostgreSQL server: a delay holds
//! every reply, a silence answers nothing while the sockets stay open, a
//! refusal fails connections at once, and `Fault::None` restores service.

use shardq_harness::lossy_proxy::{Fault, LossyProxy};
use shardq_harness::test_shards::wait_until;
use shardq_local::EphemeralServer;
use std::future::Future;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::{Client, NoTls};

/// What each reply is held under `Fault::Delay`: long enough to stand out
/// from a loaded machine's own latency as a lower bound.
const DELAY: Duration = Duration::from_millis(400);
/// How long a silent proxy is watched for an answer that must not come.
const SILENCE_WATCH: Duration = Duration::from_millis(1500);
/// Generous deadline for what must happen (a 2-core CI machine under load).
const EVENTUALLY: Duration = Duration::from_secs(30);

/// A server and a proxy in front of it.
struct Setup {
    server: EphemeralServer,
    proxy: LossyProxy,
}

impl Setup {
    async fn start() -> Setup {
        let server = EphemeralServer::start().await.expect("start postgres");
        let proxy = LossyProxy::start(([127, 0, 0, 1], server.server().port).into());
        Setup { server, proxy }
    }

    /// A client through the proxy.
    async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        connect(&format!(
            "host=127.0.0.1 port={} user=postgres dbname=shardq",
            self.proxy.addr().port()
        ))
        .await
    }

    /// A client straight to the server.
    async fn direct(&self) -> Client {
        connect(&self.server.url()).await.expect("connect directly")
    }
}

async fn connect(conninfo: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(conninfo, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// How long `f` takes, and its output.
async fn timed<T>(f: impl Future<Output = T>) -> (Duration, T) {
    let start = Instant::now();
    let out = f.await;
    (start.elapsed(), out)
}

/// The first 8 bytes of a startup message (length 8 would be a request):
/// enough for the proxy to take it as the opening of a session.
const STARTUP_HEAD: [u8; 8] = [0, 0, 0, 40, 0, 3, 0, 0];

#[tokio::test]
async fn delay_holds_every_reply() {
    let setup = Setup::start().await;
    let client = setup.connect().await.expect("connect");
    client.simple_query("SELECT 'before'").await.expect("query");
    assert!(setup.proxy.fault_statements().is_empty());

    setup.proxy.set_fault(Fault::Delay(DELAY));
    let (took, out) = timed(client.simple_query("SELECT 'simple'")).await;
    out.expect("a delayed simple query still answers");
    assert!(
        took >= DELAY,
        "a simple query took {took:?} under a {DELAY:?} delay"
    );
    let (took, row) = timed(client.query_one("SELECT $1::int", &[&7i32])).await;
    assert_eq!(row.expect("extended query").get::<_, i32>(0), 7);
    assert!(took >= DELAY, "an extended query took {took:?}");
    let (took, second) = timed(setup.connect()).await;
    let second = second.expect("connect under a delay");
    assert!(took >= DELAY, "opening a session took {took:?}");
    second.simple_query("SELECT 1").await.expect("query");
    let noted = setup.proxy.fault_statements();
    assert!(noted.iter().any(|s| s == "SELECT 'simple'"), "{noted:?}");
    assert!(noted.iter().any(|s| s == "SELECT $1::int"), "{noted:?}");

    setup.proxy.set_fault(Fault::None);
    client.simple_query("SELECT 'after'").await.expect("query");
    let noted = setup.proxy.fault_statements();
    assert!(!noted.iter().any(|s| s == "SELECT 'after'"), "{noted:?}");
    assert!(!noted.iter().any(|s| s == "SELECT 'before'"), "{noted:?}");
}

#[tokio::test]
async fn silent_answers_nothing_with_sockets_open_until_it_ends() {
    let setup = Setup::start().await;
    let direct = setup.direct().await;
    direct
        .batch_execute("CREATE TABLE heard (n int)")
        .await
        .expect("create table");
    let client = setup.connect().await.expect("connect");
    let in_flight = setup.connect().await.expect("connect");
    client.simple_query("SELECT 1").await.expect("query");
    // Sent before the silence, answered (by the server) during it.
    let sleeper = tokio::spawn(async move {
        let out = in_flight.simple_query("SELECT pg_sleep(1)").await;
        (in_flight, out.is_ok())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    setup.proxy.set_fault(Fault::Silent);
    let unanswered = client.execute("INSERT INTO heard VALUES (1)", &[]);
    assert!(
        tokio::time::timeout(SILENCE_WATCH, unanswered)
            .await
            .is_err(),
        "a silent proxy answered"
    );
    assert!(!client.is_closed(), "the silence closed an open socket");
    let count: i64 = direct
        .query_one("SELECT count(*) FROM heard", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(
        count, 0,
        "the server heard a statement sent during the silence"
    );
    // New connections are accepted, and get nothing.
    let mut raw = TcpStream::connect(setup.proxy.addr())
        .await
        .expect("accepted");
    raw.write_all(&STARTUP_HEAD).await.expect("write");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(SILENCE_WATCH, raw.read(&mut byte)).await;
    assert!(read.is_err(), "a new connection got {read:?}");
    assert!(
        tokio::time::timeout(SILENCE_WATCH, setup.connect())
            .await
            .is_err(),
        "a session opened through a silent proxy"
    );
    // The client, the sleeper and the raw socket (the timed-out attempt is gone).
    wait_until(EVENTUALLY, "3 connections open", || async {
        setup.proxy.connections() == 3
    })
    .await;
    let noted = setup.proxy.fault_statements();
    assert!(
        noted.iter().any(|s| s == "INSERT INTO heard VALUES (1)"),
        "{noted:?}"
    );
    assert!(noted.iter().any(|s| s == "SELECT pg_sleep(1)"), "{noted:?}");
    assert!(!sleeper.is_finished(), "the reply in flight came through");

    setup.proxy.set_fault(Fault::None);
    wait_until(EVENTUALLY, "the silent sessions closed", || async {
        client.is_closed()
    })
    .await;
    let (_in_flight, answered) = sleeper.await.expect("sleeper");
    assert!(
        !answered,
        "the swallowed reply came through after the silence"
    );
    let read = tokio::time::timeout(EVENTUALLY, raw.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the raw socket was not closed: {read:?}"
    );
    let after = setup.connect().await.expect("connect after the silence");
    after
        .execute("INSERT INTO heard VALUES (2)", &[])
        .await
        .expect("insert");
    wait_until(EVENTUALLY, "only the new session open", || async {
        setup.proxy.connections() == 1
    })
    .await;
}

#[tokio::test]
async fn refuse_fails_fast_and_resets_open_sessions() {
    let setup = Setup::start().await;
    let client = setup.connect().await.expect("connect");
    client.simple_query("SELECT 1").await.expect("query");

    setup.proxy.set_fault(Fault::Refuse);
    wait_until(EVENTUALLY, "the open session was reset", || async {
        client.is_closed()
    })
    .await;
    assert!(client.simple_query("SELECT 1").await.is_err());
    let attempt = tokio::time::timeout(EVENTUALLY, setup.connect()).await;
    assert!(
        matches!(attempt, Ok(Err(_))),
        "a connection through a refusing proxy did not fail: {:?}",
        attempt.map(|r| r.map(|_| ()))
    );
    let mut raw = TcpStream::connect(setup.proxy.addr()).await.expect("tcp");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(EVENTUALLY, raw.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "a refused socket stayed open: {read:?}"
    );
    wait_until(EVENTUALLY, "no connection open", || async {
        setup.proxy.connections() == 0
    })
    .await;
    assert!(setup.proxy.fault_statements().is_empty());

    setup.proxy.set_fault(Fault::None);
    let after = setup.connect().await.expect("connect after the refusal");
    after.simple_query("SELECT 1").await.expect("query");
}

#[tokio::test]
async fn connections_counts_the_open_clients() {
    let setup = Setup::start().await;
    let first = setup.connect().await.expect("connect");
    let second = setup.connect().await.expect("connect");
    wait_until(EVENTUALLY, "2 open", || async {
        setup.proxy.connections() == 2
    })
    .await;
    drop(first);
    wait_until(EVENTUALLY, "1 open", || async {
        setup.proxy.connections() == 1
    })
    .await;
    second.simple_query("SELECT 1").await.expect("query");
    drop(second);
    wait_until(EVENTUALLY, "none open", || async {
        setup.proxy.connections() == 0
    })
    .await;
}
