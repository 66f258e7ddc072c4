//! The two directions of one proxied connection, after its opening.
//!
//! Requests are relayed message by message; replies are gathered into
//! exchanges (up to a ReadyForQuery, `Z`) by a reader and forwarded by a
//! writer, so that a delayed exchange does not stop the reader and each one
//! is held from its own arrival.

use super::faults::Fault;
use super::shared::Shared;
use super::wire::{c_string, read_message};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Exchanges read but not yet forwarded, at most: past it the reader waits,
/// so a client that does not read slows the server as it would directly.
const EXCHANGES_IN_FLIGHT: usize = 1024;

/// A client request that the server answers with one `Z`.
pub(super) struct Request {
    /// Its statement (of an extended-protocol run, the last one parsed or bound).
    statement: String,
    /// Whether it is already among the fault statements.
    noted: bool,
}

/// The requests whose `Z` has not come back yet, oldest first.
pub(super) type Requests = Mutex<VecDeque<Request>>;

/// Relays the client's bytes to the server: the rest of the startup message
/// as is, then message by message, pushing onto `requests` the statement of
/// each request that the server will answer with one `Z`. During a silence
/// it reads the client's messages and drops them.
pub(super) async fn relay_requests(
    from_client: impl AsyncRead + Unpin,
    mut to_server: impl AsyncWrite + Unpin,
    startup_rest: usize,
    requests: &Requests,
    shared: &Shared,
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
        let fault = shared.fault();
        let body = &message[5..];
        let request = match kind {
            b'Q' => Some(c_string(body).0),
            b'P' => {
                let (name, rest) = c_string(body);
                current = c_string(rest).0;
                prepared.insert(name, current.clone());
                None
            }
            b'B' => {
                let (_portal, rest) = c_string(body);
                if let Some(statement) = prepared.get(&c_string(rest).0) {
                    current = statement.clone();
                }
                None
            }
            b'S' => Some(std::mem::take(&mut current)),
            _ => None,
        };
        if let Some(statement) = request {
            let noted = fault != Fault::None;
            if noted {
                shared.note_fault_statement(&statement);
            }
            if fault != Fault::Silent {
                requests
                    .lock()
                    .unwrap()
                    .push_back(Request { statement, noted });
            }
        }
        if fault == Fault::Silent {
            // Never reaches the server, so no `Z` will answer it.
            continue;
        }
        // Noted before it is sent, so before the server can answer it.
        to_server.write_all(&message).await?;
    }
}

/// What the reply reader hands the writer.
enum Out {
    /// Bytes to forward at `at`.
    Send { at: Instant, bytes: Vec<u8> },
    /// Forward nothing more: end the connection.
    Close,
}

/// Relays the server's messages to the client, one exchange (up to a `Z`)
/// at a time, losing some after a commit, delaying or swallowing them as the
/// fault says. Returns when either side closes, or when it dropped a reply.
pub(super) async fn relay_replies(
    from_server: impl AsyncRead + Unpin,
    to_client: impl AsyncWrite + Unpin,
    requests: &Requests,
    shared: &Shared,
) {
    let (tx, rx) = mpsc::channel(EXCHANGES_IN_FLIGHT);
    let read = async {
        // Whatever ended the reading (the server closed, a reply is to be
        // lost), what was read before it is still forwarded, then the
        // connection ends.
        let _ = read_replies(from_server, &tx, requests, shared).await;
        let _ = tx.send(Out::Close).await;
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = read => {}
        _ = write_replies(rx, to_client, shared) => {}
    }
}

/// Gathers the server's messages into exchanges and queues each for the
/// writer, stamped with when it may be forwarded.
async fn read_replies(
    from_server: impl AsyncRead + Unpin,
    tx: &mpsc::Sender<Out>,
    requests: &Requests,
    shared: &Shared,
) -> std::io::Result<()> {
    let mut from_server = BufReader::with_capacity(64 * 1024, from_server);
    // Messages of the current exchange, not yet queued.
    let mut exchange: Vec<u8> = Vec::new();
    let mut message = Vec::new();
    // Until the first `Z` the connection is starting up (authentication
    // round trips, parameters): no lost replies there, and that `Z` answers
    // no request.
    let mut ready = false;
    let mut completed = false;
    let mut failed = false;
    loop {
        let kind = read_message(&mut from_server, &mut message).await?;
        exchange.extend_from_slice(&message);
        let arrived = Instant::now();
        let fault = shared.fault();
        match kind {
            b'C' => completed = true,
            b'E' => failed = true,
            b'Z' => {
                let request = if ready {
                    requests.lock().unwrap().pop_front()
                } else {
                    None
                };
                let statement = match request {
                    Some(Request { statement, noted }) => {
                        if fault != Fault::None && !noted {
                            // Sent before the fault, answered during it.
                            shared.note_fault_statement(&statement);
                        }
                        statement
                    }
                    None => String::new(),
                };
                let idle = exchange.last() == Some(&b'I');
                if ready && idle && completed && !failed && shared.roll(&statement) {
                    shared.dropped.fetch_add(1, Ordering::Relaxed);
                    shared.dropped_statements.lock().unwrap().push(statement);
                    // The server has committed; the connection ends without
                    // a word to the client.
                    return Ok(());
                }
                ready = true;
                let at = match fault {
                    Fault::Delay(delay) if shared.delays(&statement) => arrived + delay,
                    _ => arrived,
                };
                let bytes = std::mem::take(&mut exchange);
                if tx.send(Out::Send { at, bytes }).await.is_err() {
                    return Ok(());
                }
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
            let bytes = std::mem::take(&mut exchange);
            if tx.send(Out::Send { at: arrived, bytes }).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// Forwards each queued exchange when its time comes, unless the proxy is
/// silent then (the exchange is swallowed).
async fn write_replies(
    mut rx: mpsc::Receiver<Out>,
    mut to_client: impl AsyncWrite + Unpin,
    shared: &Shared,
) -> std::io::Result<()> {
    while let Some(Out::Send { at, bytes }) = rx.recv().await {
        tokio::time::sleep_until(at).await;
        if shared.fault() == Fault::Silent {
            continue;
        }
        to_client.write_all(&bytes).await?;
    }
    Ok(())
}
