//! Migration bookkeeping.

/// Creates the table that records applied migrations.
pub const MIGRATIONS_TABLE_CREATE: &str = "CREATE TABLE IF NOT EXISTS shardq_migrations (\
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())";

/// Tries the migration lock for this transaction (`got`).
pub const MIGRATION_TRY_LOCK: &str = "SELECT pg_try_advisory_xact_lock($1) AS got";

/// Applied migration versions.
pub const MIGRATIONS_APPLIED: &str = "SELECT version FROM shardq_migrations ORDER BY version";

/// Records one applied migration.
pub const MIGRATION_RECORD: &str = "INSERT INTO shardq_migrations (version, name) VALUES ($1, $2)";

/// Whether the migrations table exists.
pub const MIGRATIONS_TABLE_EXISTS: &str =
    "SELECT to_regclass('shardq_migrations') IS NOT NULL AS present";

/// Newest applied migration, or NULL when none.
pub const MIGRATION_CURRENT: &str = "SELECT max(version) AS version FROM shardq_migrations";

/// This shard's recorded place in the shard map: `shard_count`, `shard_index`
/// (no row: not recorded yet).
pub const SHARD_MAP_GET: &str = "SELECT shard_count, shard_index FROM shardq_shard_map";

/// Records this shard's place in the shard map (`$1` count, `$2` index). Run
/// under [`MIGRATION_TRY_LOCK`], after [`SHARD_MAP_GET`] found no row.
pub const SHARD_MAP_RECORD: &str =
    "INSERT INTO shardq_shard_map (shard_count, shard_index) VALUES ($1, $2)";

/// Whether the shard map table exists (schema version 5 or later).
pub const SHARD_MAP_TABLE_EXISTS: &str =
    "SELECT to_regclass('shardq_shard_map') IS NOT NULL AS present";

/// Tries the migration lock for this session (`got`; no-transaction
/// migrations); released by [`MIGRATION_SESSION_UNLOCK`] or when the session
/// ends.
pub const MIGRATION_SESSION_TRY_LOCK: &str = "SELECT pg_try_advisory_lock($1) AS got";

/// Releases [`MIGRATION_SESSION_TRY_LOCK`].
pub const MIGRATION_SESSION_UNLOCK: &str = "SELECT pg_advisory_unlock($1)";

/// Whether index `$1` (in the current schema) exists but is invalid: the
/// leftover of a `CREATE INDEX CONCURRENTLY` that failed or was cancelled.
pub const INDEX_INVALID: &str = "SELECT NOT i.indisvalid AS invalid FROM pg_index i \
    JOIN pg_class c ON c.oid = i.indexrelid \
    WHERE c.relname = $1 AND c.relnamespace = current_schema()::regnamespace";

/// Creates the table that records the hash of each server-side function's
/// text as last applied (`migrations/functions/`), readable by every role: a
/// worker's start check compares it with its own functions, and it holds
/// nothing secret.
pub const FUNCTIONS_TABLE_CREATE: &str = "CREATE TABLE IF NOT EXISTS shardq_functions (\
    name text PRIMARY KEY, sha256 text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now()); \
    GRANT SELECT ON TABLE shardq_functions TO PUBLIC";

/// Whether the functions table exists.
pub const FUNCTIONS_TABLE_EXISTS: &str =
    "SELECT to_regclass('shardq_functions') IS NOT NULL AS present";

/// Of the functions ($1 names, $2 their file texts), the `name`s whose text's
/// SHA-256 differs from the recorded one, or that have none recorded; in the
/// order given.
pub const FUNCTIONS_STALE: &str = "SELECT f.name FROM unnest($1::text[], $2::text[]) \
    WITH ORDINALITY AS f(name, body, ord) \
    LEFT JOIN shardq_functions r ON r.name = f.name \
    WHERE r.sha256 IS DISTINCT FROM encode(sha256(convert_to(f.body, 'UTF8')), 'hex') \
    ORDER BY f.ord";

/// Records the SHA-256 of function $1's text $2 as applied.
pub const FUNCTION_RECORD: &str = "INSERT INTO shardq_functions (name, sha256) \
    VALUES ($1, encode(sha256(convert_to($2::text, 'UTF8')), 'hex')) \
    ON CONFLICT (name) DO UPDATE SET sha256 = EXCLUDED.sha256, applied_at = now()";
