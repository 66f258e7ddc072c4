//! Statements on a server rather than a shard's schema.

/// Whether database $1 exists on the server.
pub const DATABASE_EXISTS: &str = "SELECT 1 FROM pg_database WHERE datname = $1";
