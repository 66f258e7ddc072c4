//! What a failed statement means for the caller, from its SQLSTATE (never
//! from its message).

use crate::shards::ShardError;
use tokio_postgres::error::SqlState;

/// SQLSTATE of a write routed by a shard map older than the shard's
/// (`shardq_check_route`, migrations/functions/).
pub(crate) const STALE_MAP: &str = "SQ004";

/// SQLSTATE of a write into a range moving to its shard that the move has
/// not opened yet (`shardq_hold_moving`): a running `shardq reshard` opens
/// it within seconds of recording the new map; a stopped one when run
/// again.
pub(crate) const MOVE_NOT_OPEN: &str = "SQ005";

/// The kinds of failure callers act on differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// `lock_timeout` passed (SQLSTATE 55P03): a table or row lock is held
    /// by someone else; try again later or elsewhere.
    LockNotAvailable,
    /// The server cancelled the statement (57014: `statement_timeout`, or an
    /// operator's `pg_cancel_backend`); it did nothing.
    QueryCanceled,
    /// The statement failed on its data (class 22, data exception, or 23,
    /// integrity constraint violation): it fails the same way again.
    Data,
    /// A unique constraint refused the write (23505); also [`ErrorKind::Data`]
    /// for retrying, told apart for callers that report it.
    UniqueViolation,
    /// The server ran out of memory or of room in its lock table for this
    /// statement (53200, `out of memory` / `out of shared memory`): the
    /// same statement fails the same way while it is that big; a smaller
    /// one (fewer rows, fewer locks) may pass.
    OutOfMemory,
    /// A value could not be converted to or from its SQL type on the client
    /// (no SQLSTATE; the server refused nothing): the wrong Rust type for a
    /// parameter, a value out of the type's range, a column that does not
    /// decode. A parameter that fails to encode stops the statement before
    /// it is sent (it did not run); either way the same call fails the same
    /// way again.
    Conversion,
    /// The shard refused a write routed by an old shard map (SQLSTATE
    /// SQ004, `shardq_check_route`): it wrote nothing; reload the map and
    /// route again. Not a data error: the same job written by the current
    /// map passes.
    StaleMap,
    /// No answer: the connection broke or the client-side deadline passed.
    /// The statement may have run; everything shardq runs is safe to repeat.
    NoAnswer,
    /// No connection could be had.
    Unreachable,
    /// Anything else the server refused (restarting, out of resources, …).
    Other,
}

impl ErrorKind {
    /// Whether the statement may have run although it failed: no answer
    /// came ([`ErrorKind::NoAnswer`]), or a row of its answer did not
    /// decode ([`ErrorKind::Conversion`]: shardq cannot tell that from a
    /// parameter that did not encode, so it assumes the worse).
    pub fn may_have_run(self) -> bool {
        matches!(self, ErrorKind::NoAnswer | ErrorKind::Conversion)
    }

    /// Whether a retry of the same statement fails the same way.
    pub fn is_permanent(self) -> bool {
        matches!(
            self,
            ErrorKind::Data | ErrorKind::UniqueViolation | ErrorKind::Conversion
        )
    }
}

impl ShardError {
    /// The SQLSTATE of a statement the server rejected, if that is what failed.
    pub fn sqlstate(&self) -> Option<&SqlState> {
        match self {
            ShardError::Query { source, .. } => source.code(),
            _ => None,
        }
    }

    /// What the failure means for the caller.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ShardError::Connect { .. } | ShardError::Tls { .. } | ShardError::Build { .. } => {
                ErrorKind::Unreachable
            }
            ShardError::Timeout { .. } => ErrorKind::NoAnswer,
            ShardError::Query { source, .. } => match source.code() {
                None => without_sqlstate(source),
                Some(code) if *code == SqlState::LOCK_NOT_AVAILABLE => ErrorKind::LockNotAvailable,
                Some(code) if *code == SqlState::QUERY_CANCELED => ErrorKind::QueryCanceled,
                Some(code) if *code == SqlState::UNIQUE_VIOLATION => ErrorKind::UniqueViolation,
                Some(code) if *code == SqlState::OUT_OF_MEMORY => ErrorKind::OutOfMemory,
                Some(code) if code.code() == STALE_MAP => ErrorKind::StaleMap,
                Some(code) if matches!(&code.code()[..2], "22" | "23") => ErrorKind::Data,
                Some(_) => ErrorKind::Other,
            },
        }
    }

    /// Whether the statement failed on its data and would fail the same way
    /// again (SQLSTATE class 22 or 23, or a value that does not convert). Everything else (connection lost,
    /// timeouts, lock waits, server restarting) may pass on a retry.
    pub fn is_permanent(&self) -> bool {
        self.kind().is_permanent()
    }
}

/// The kind of a client-side failure (no SQLSTATE), by its type, never its
/// message: an I/O error, a closed connection, or one with no cause (an
/// unexpected message, a timeout) means the reply may be lost; a cause of
/// any other type is a value's own `ToSql`/`FromSql` error.
fn without_sqlstate(e: &tokio_postgres::Error) -> ErrorKind {
    use std::error::Error;
    if e.is_closed() {
        return ErrorKind::NoAnswer;
    }
    match e.source() {
        Some(cause) if !cause.is::<std::io::Error>() => ErrorKind::Conversion,
        _ => ErrorKind::NoAnswer,
    }
}
