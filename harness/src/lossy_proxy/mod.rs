//! A TCP proxy in front of a PostgreSQL server that loses replies right after
//! a commit, and injects the faults of a sick server ([`Fault`]): slow
//! replies, silence with the sockets open, refused connections.
//!
//! Lost replies: it follows the server's side of the protocol and holds back
//! each *exchange*: the messages up to and including a ReadyForQuery (`Z`).
//! When that `Z` says the session is idle again (`I`: an explicit
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
//! statement each dropped reply belonged to, and which statements were sent
//! or answered while a fault was on.
//!
//! Encrypted connections are relayed as they are: no lost replies, delays or
//! silence there, but a refusal still resets them.
//!
//! Only tokio and rand, so that it can move into a shared harness crate.

mod faults;
mod relay;
mod shared;
mod wire;

pub use faults::Fault;

use faults::{discard, watch_fault, End};
use relay::{relay_replies, relay_requests, Requests};
use shared::Shared;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The server address in a shard URL (a local server: 127.0.0.1 and the
/// URL's port, 5432 when it names none), for [`LossyProxy::start`].
///
/// # Panics
///
/// When `url` is not a PostgreSQL URL.
pub fn server_addr(url: &str) -> SocketAddr {
    let config: tokio_postgres::Config = url.parse().expect("shard url");
    let port = config.get_ports().first().copied().unwrap_or(5432);
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A running proxy; stops (and drops every connection) when dropped.
pub struct LossyProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

/// Counts one client connection as open while it lives.
struct Open<'a>(&'a AtomicUsize);

impl<'a> Open<'a> {
    fn new(connections: &'a AtomicUsize) -> Open<'a> {
        connections.fetch_add(1, Ordering::Relaxed);
        Open(connections)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl LossyProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards every connection to
    /// `upstream`. Drops nothing until [`LossyProxy::set_drop_probability`],
    /// injects nothing until [`LossyProxy::set_fault`].
    /// Call it inside a Tokio runtime.
    pub fn start(upstream: SocketAddr) -> LossyProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = listener.local_addr().expect("proxy address");
        let listener = TcpListener::from_std(listener).expect("tokio listener");
        let shared = Arc::new(Shared::new());
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

    /// Drops only replies to statements whose text contains `only` (`None`:
    /// any statement), at the drop probability: a lost reply at the exact
    /// statement a test is about.
    pub fn set_drop_only(&self, only: Option<&str>) {
        *self.shared.drop_only.lock().unwrap() = only.map(str::to_owned);
    }

    /// Loses the next reply (after a commit) to a statement whose text
    /// contains `text`, whatever the probability: a test that needs the
    /// fault at that statement gets it at least once instead of by chance.
    pub fn drop_next(&self, text: &str) {
        self.shared.drop_next.lock().unwrap().push(text.to_owned());
    }

    /// Makes a [`Fault::Delay`] hold only the replies to statements whose
    /// text contains `only` (`None`: every reply): a slow answer to one
    /// statement while the rest of the session flows.
    pub fn set_delay_only(&self, only: Option<&str>) {
        *self.shared.delay_only.lock().unwrap() = only.map(str::to_owned);
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

    /// Injects `fault` on every connection, open or new, from the next
    /// message on (see [`Fault`] for what each does and how it ends);
    /// [`Fault::None`] ends it.
    pub fn set_fault(&self, fault: Fault) {
        self.shared
            .fault
            .send_modify(|state| *state = state.with(fault));
    }

    /// The fault now.
    pub fn fault(&self) -> Fault {
        self.shared.fault()
    }

    /// The statements clients sent while a fault was on, and those sent just
    /// before it whose reply came (or was swallowed) during it, in order
    /// (of an extended-protocol run, its statement; of a transaction, each
    /// statement of it). A refused connection sends none.
    pub fn fault_statements(&self) -> Vec<String> {
        self.shared.fault_statements.lock().unwrap().clone()
    }

    /// Client connections open now (those accepted during a silence too).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::Relaxed)
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

/// One client connection; returning closes both sockets (or resets them,
/// when a refusal ends it). I/O errors just end the connection: each side
/// then sees it closed, as with a real fault.
async fn serve(mut client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) {
    let _open = Open::new(&shared.connections);
    let mut faults = shared.fault.subscribe();
    let opened = *faults.borrow_and_update();
    let end = match opened.fault {
        Fault::Refuse => End::Reset,
        Fault::Silent => tokio::select! {
            end = watch_fault(&mut faults, opened.opened_generation()) => end,
            () = discard(&mut client) => End::Close,
        },
        Fault::None | Fault::Delay(_) => tokio::select! {
            end = watch_fault(&mut faults, opened.opened_generation()) => end,
            () = relay(&mut client, upstream, &shared) => End::Close,
        },
    };
    if end == End::Reset {
        // No linger: the close sends RST, as a host without the server does.
        let _ = client.set_zero_linger();
    }
}

/// Connects to the server and relays both ways until either side closes.
async fn relay(client: &mut TcpStream, upstream: SocketAddr, shared: &Shared) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let startup_rest = match wire::negotiate(client, &mut server).await {
        Ok(Some(rest)) => rest,
        Ok(None) => {
            // Encrypted: nothing to parse, so no faults; just relay.
            let _ = tokio::io::copy_bidirectional(client, &mut server).await;
            return;
        }
        Err(_) => return,
    };
    let (from_client, to_client) = client.split();
    let (from_server, to_server) = server.split();
    let requests: Requests = Mutex::new(VecDeque::new());
    // Whichever direction ends first ends the connection: a client that hung
    // up needs no more replies, and a dropped reply must close both sides.
    tokio::select! {
        _ = relay_requests(from_client, to_server, startup_rest, &requests, shared) => {}
        () = relay_replies(from_server, to_client, &requests, shared) => {}
    }
}
