//! A TCP proxy in front of a PostgreSQL server that loses replies right after
//! a commit: the server has committed, the client never hears of it.
//!
//! It follows the server's side of the protocol (every message is a type byte
//! and a big-endian length that counts itself but not the type byte) and holds
//! back each *exchange*: the messages up to and including a ReadyForQuery
//! (`Z`). When that `Z` says the session is idle again (`I`: an explicit
//! transaction committed, or the implicit one of a simple query or of an
//! extended-protocol Sync ended) and the exchange has a CommandComplete (`C`)
//! and no ErrorResponse (`E`), then with the configured probability it closes
//! both sockets instead of forwarding the exchange. To the client this is a
//! connection that died after it sent a statement, exactly what a network
//! fault or a terminated backend looks like: it cannot tell whether the
//! statement ran.
//!
//! It also follows the client's requests (a simple Query, or an extended-
//! protocol run that a Sync ends: each gets one `Z`), so that it can say which
//! statement each dropped reply belonged to.
//!
//! Only tokio and rand, so that it can move into a shared harness crate.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The request codes a client may open with to negotiate encryption; the
/// server answers each with a single byte, not a message.
const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;

/// The first byte of a TLS record: a client that starts TLS directly
/// (PostgreSQL 17's `sslnegotiation=direct`) sends no request first.
const TLS_HANDSHAKE: u8 = 0x16;

/// A running proxy; stops (and drops every connection) when dropped.
pub struct LossyProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

/// What the proxy and its connections share.
#[derive(Default)]
struct Shared {
    /// The drop probability, as the bits of an `f64`: the test changes it
    /// while connections use it.
    drop_probability: AtomicU64,
    /// Replies dropped so far.
    dropped: AtomicU64,
    /// The statement of each dropped reply, in order.
    dropped_statements: Mutex<Vec<String>>,
}

impl Shared {
    /// Whether to lose this reply.
    fn roll(&self) -> bool {
        let p = f64::from_bits(self.drop_probability.load(Ordering::Relaxed));
        p > 0.0 && rand::random::<f64>() < p
    }
}

impl LossyProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards every connection to
    /// `upstream`. Drops nothing until [`LossyProxy::set_drop_probability`].
    /// Call it inside a Tokio runtime.
    pub fn start(upstream: SocketAddr) -> LossyProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = listener.local_addr().expect("proxy address");
        let listener = TcpListener::from_std(listener).expect("tokio listener");
        let shared = Arc::new(Shared::default());
        let accept = tokio::spawn(accept_loop(listener, upstream, shared.clone()));
        LossyProxy {
            addr,
            shared,
            accept,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The chance, from 0.0 to 1.0, that a reply after a commit is lost.
    /// Takes effect for the next reply on every connection.
    pub fn set_drop_probability(&self, p: f64) {
        self.shared
            .drop_probability
            .store(p.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    }

    /// Replies dropped so far (each closed one connection).
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// The statement text of every reply dropped so far (of a transaction,
    /// its `COMMIT`), in order.
    pub fn dropped_statements(&self) -> Vec<String> {
        self.shared.dropped_statements.lock().unwrap().clone()
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        // The accept task owns the connection tasks (a JoinSet), so aborting
        // it drops them too, and with them every socket.
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        // Reap finished connections so the set does not grow with every one.
        while connections.try_join_next().is_some() {}
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors, say: give the connections time to close.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        connections.spawn(serve(client, upstream, shared.clone()));
    }
}

/// One client connection; returning closes both sockets. I/O errors just end
/// the connection: each side then sees it closed, as with a real fault.
async fn serve(mut client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let startup_rest = match negotiate(&mut client, &mut server).await {
        Ok(Some(rest)) => rest,
        Ok(None) => {
            // Encrypted: nothing to parse, so no faults; just relay.
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            return;
        }
        Err(_) => return,
    };
    let (from_client, to_client) = client.into_split();
    let (from_server, to_server) = server.into_split();
    // The statement of each request whose `Z` has not come back yet.
    let requests = Mutex::new(VecDeque::new());
    // Whichever direction ends first ends the connection: a client that hung
    // up needs no more replies, and a dropped reply must close both sides.
    tokio::select! {
        _ = relay_requests(from_client, to_server, startup_rest, &requests) => {}
        _ = relay_replies(from_server, to_client, &requests, &shared) => {}
    }
}

/// Relays the client's opening: encryption requests and the server's
/// one-byte answers, then the first 8 bytes of the startup message. Returns
/// how many bytes of the startup message are left, or `None` when the
/// connection is encrypted (its messages cannot be parsed).
async fn negotiate(
    client: &mut TcpStream,
    server: &mut TcpStream,
) -> std::io::Result<Option<usize>> {
    loop {
        let mut head = [0u8; 8];
        client.read_exact(&mut head).await?;
        server.write_all(&head).await?;
        if head[0] == TLS_HANDSHAKE {
            return Ok(None);
        }
        let length = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let code = i32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if length != 8 || (code != SSL_REQUEST && code != GSSENC_REQUEST) {
            // A startup (or cancel) message: from here on both sides speak
            // in typed messages.
            return Ok(Some(usize::try_from(length).unwrap_or(8).saturating_sub(8)));
        }
        let mut answer = [0u8; 1];
        server.read_exact(&mut answer).await?;
        client.write_all(&answer).await?;
        if answer[0] != b'N' {
            // `S` (TLS) or `G` (GSSAPI): encrypted from here on.
            return Ok(None);
        }
        // Refused: the client goes on in plaintext, with another request
        // or the startup message.
    }
}

/// Reads one message (type byte, length, body) into `buf`, replacing what
/// was there. Returns the type byte; the body is `buf[5..]`.
async fn read_message(
    from: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> std::io::Result<u8> {
    let mut head = [0u8; 5];
    from.read_exact(&mut head).await?;
    let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if length < 4 {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    buf.clear();
    buf.extend_from_slice(&head);
    buf.resize(1 + length, 0);
    from.read_exact(&mut buf[5..]).await?;
    Ok(head[0])
}

/// Splits a NUL-terminated string off the front of `bytes`.
fn c_string(bytes: &[u8]) -> (String, &[u8]) {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let text = String::from_utf8_lossy(&bytes[..end]).into_owned();
    (text, bytes.get(end + 1..).unwrap_or_default())
}

/// Relays the client's bytes to the server: the rest of the startup message
/// as is, then message by message, pushing onto `requests` the statement of
/// each request that the server will answer with one `Z`.
async fn relay_requests(
    from_client: impl AsyncRead + Unpin,
    mut to_server: impl AsyncWrite + Unpin,
    startup_rest: usize,
    requests: &Mutex<VecDeque<String>>,
) -> std::io::Result<()> {
    let mut from_client = BufReader::with_capacity(64 * 1024, from_client);
    let mut startup = vec![0u8; startup_rest];
    from_client.read_exact(&mut startup).await?;
    to_server.write_all(&startup).await?;
    // Prepared statements by name, and the statement of the current
    // extended-protocol run.
    let mut prepared: HashMap<String, String> = HashMap::new();
    let mut current = String::new();
    let mut message = Vec::new();
    loop {
        let kind = read_message(&mut from_client, &mut message).await?;
        let body = &message[5..];
        match kind {
            b'Q' => requests.lock().unwrap().push_back(c_string(body).0),
            b'P' => {
                let (name, rest) = c_string(body);
                current = c_string(rest).0;
                prepared.insert(name, current.clone());
            }
            b'B' => {
                let (_portal, rest) = c_string(body);
                if let Some(statement) = prepared.get(&c_string(rest).0) {
                    current = statement.clone();
                }
            }
            b'S' => requests
                .lock()
                .unwrap()
                .push_back(std::mem::take(&mut current)),
            _ => {}
        }
        // Noted before it is sent, so before the server can answer it.
        to_server.write_all(&message).await?;
    }
}

/// Relays the server's messages to the client, one exchange (up to a `Z`)
/// at a time, losing some after a commit. Returns when either side closes,
/// or when it dropped a reply.
async fn relay_replies(
    from_server: impl AsyncRead + Unpin,
    mut to_client: impl AsyncWrite + Unpin,
    requests: &Mutex<VecDeque<String>>,
    shared: &Shared,
) -> std::io::Result<()> {
    let mut from_server = BufReader::with_capacity(64 * 1024, from_server);
    // Messages of the current exchange, not yet forwarded.
    let mut exchange: Vec<u8> = Vec::new();
    let mut message = Vec::new();
    // Until the first `Z` the connection is starting up (authentication
    // round trips, parameters): no faults there, and that `Z` answers no
    // request.
    let mut ready = false;
    let mut completed = false;
    let mut failed = false;
    loop {
        let kind = read_message(&mut from_server, &mut message).await?;
        exchange.extend_from_slice(&message);
        match kind {
            b'C' => completed = true,
            b'E' => failed = true,
            b'Z' => {
                let statement = if ready {
                    requests.lock().unwrap().pop_front().unwrap_or_default()
                } else {
                    String::new()
                };
                let idle = exchange.last() == Some(&b'I');
                if ready && idle && completed && !failed && shared.roll() {
                    shared.dropped.fetch_add(1, Ordering::Relaxed);
                    shared.dropped_statements.lock().unwrap().push(statement);
                    // The server has committed; the caller drops both
                    // sockets without a word to the client.
                    return Ok(());
                }
                ready = true;
                to_client.write_all(&exchange).await?;
                exchange.clear();
                completed = false;
                failed = false;
                continue;
            }
            _ => {}
        }
        // Forward at once what the client must answer before the server
        // says more: authentication during startup, and CopyIn/CopyBoth
        // responses (the server then waits for the client's data, so holding
        // them back until the `Z` would deadlock).
        if !ready || matches!(kind, b'G' | b'W') {
            to_client.write_all(&exchange).await?;
            exchange.clear();
        }
    }
}
