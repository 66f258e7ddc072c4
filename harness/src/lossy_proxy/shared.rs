//! What the proxy and its connections share: the drop and delay settings a
//! test changes while connections read them, the fault now, and what was
//! dropped or seen under a fault.

use super::faults::{Fault, FaultState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use tokio::sync::watch;

/// What the proxy and its connections share.
pub(super) struct Shared {
    /// The drop probability, as the bits of an `f64`: the test changes it
    /// while connections use it.
    pub(super) drop_probability: AtomicU64,
    /// When set, only replies to statements containing this text are
    /// dropped (the others pass whatever the probability).
    pub(super) drop_only: Mutex<Option<String>>,
    /// Texts whose next matching reply is lost whatever the probability
    /// (each once): a fault a test must see happen at least once.
    pub(super) drop_next: Mutex<Vec<String>>,
    /// When set, a [`Fault::Delay`] holds only the replies to statements
    /// containing this text.
    pub(super) delay_only: Mutex<Option<String>>,
    /// Replies dropped so far.
    pub(super) dropped: AtomicU64,
    /// The statement of each dropped reply, in order.
    pub(super) dropped_statements: Mutex<Vec<String>>,
    /// The fault now; every connection subscribes.
    pub(super) fault: watch::Sender<FaultState>,
    /// Statements sent or answered while a fault was on, in order.
    pub(super) fault_statements: Mutex<Vec<String>>,
    /// Client connections open now.
    pub(super) connections: AtomicUsize,
}

impl Shared {
    pub(super) fn new() -> Shared {
        Shared {
            drop_probability: AtomicU64::new(0),
            drop_only: Mutex::new(None),
            drop_next: Mutex::new(Vec::new()),
            delay_only: Mutex::new(None),
            dropped: AtomicU64::new(0),
            dropped_statements: Mutex::new(Vec::new()),
            fault: watch::Sender::new(FaultState::default()),
            fault_statements: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
        }
    }

    /// Whether to lose this reply, to `statement`.
    pub(super) fn roll(&self, statement: &str) -> bool {
        {
            let mut next = self.drop_next.lock().unwrap();
            if let Some(at) = next
                .iter()
                .position(|text| statement.contains(text.as_str()))
            {
                next.swap_remove(at);
                return true;
            }
        }
        let p = f64::from_bits(self.drop_probability.load(Ordering::Relaxed));
        let chosen = self
            .drop_only
            .lock()
            .unwrap()
            .as_deref()
            .is_none_or(|only| statement.contains(only));
        p > 0.0 && chosen && rand::random::<f64>() < p
    }

    /// Whether a delay holds the reply to `statement`.
    pub(super) fn delays(&self, statement: &str) -> bool {
        self.delay_only
            .lock()
            .unwrap()
            .as_deref()
            .is_none_or(|only| statement.contains(only))
    }

    /// The fault now.
    pub(super) fn fault(&self) -> Fault {
        self.fault.borrow().fault
    }

    /// Notes `statement` as sent or answered while a fault was on.
    pub(super) fn note_fault_statement(&self, statement: &str) {
        self.fault_statements
            .lock()
            .unwrap()
            .push(statement.to_owned());
    }
}
