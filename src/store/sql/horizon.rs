//! What holds a shard's xmin horizon back, and the dead row versions of the
//! queue table: read from the server's statistics views, not from shardq's
//! tables, so the read costs the same however large the queue is; and,
//! apart, the lease floor's age.

/// One row: for each kind of holder of this database's xmin horizon, how
/// old the oldest one is (seconds where it has a start time, transactions
/// always); the pid of the oldest other session in a transaction; how many
/// sessions of this database hide their transaction from this role (no
/// `pg_read_all_stats`); and table $1's dead and live row versions and
/// seconds since its last autovacuum (NULLs when the table has no
/// statistics yet).
///
/// Holders, as vacuum counts them: sessions of this database (or of none:
/// a walsender whose standby sends `hot_standby_feedback`), the server's
/// replication slots (`xmin`; a slot's `catalog_xmin` holds back only the
/// system catalogs and is read apart), and this database's prepared
/// transactions. This statement's own session and autovacuum workers
/// (vacuum ignores them) are left out. A backend's age is from its
/// `xact_start`; its `backend_xid` counts too (a writer holds the horizon
/// at its own id).
pub const HORIZON_READ: &str = "WITH other AS ( \
        SELECT pid, backend_type = 'walsender' AS standby, \
            greatest(0, extract(epoch FROM now() - xact_start))::float8 AS held_s, \
            greatest(age(backend_xmin), age(backend_xid))::int8 AS held_xids \
        FROM pg_stat_activity \
        WHERE pid <> pg_backend_pid() \
            AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) \
            AND backend_type <> 'autovacuum worker' \
            AND (datid IS NULL OR datname = current_database()) \
    ), oldest AS ( \
        SELECT pid, held_s FROM other WHERE NOT standby ORDER BY held_s DESC NULLS LAST LIMIT 1 \
    ), prepared AS ( \
        SELECT prepared, transaction FROM pg_prepared_xacts WHERE database = current_database() \
    ) \
    SELECT \
        coalesce((SELECT held_s FROM oldest), 0)::float8 AS backend_s, \
        (SELECT pid FROM oldest) AS backend_pid, \
        coalesce((SELECT max(held_xids) FROM other WHERE NOT standby), 0)::int8 AS backend_xids, \
        coalesce((SELECT max(held_xids) FROM other WHERE standby), 0)::int8 AS standby_xids, \
        coalesce((SELECT max(age(xmin)) FROM pg_replication_slots), 0)::int8 AS slot_xids, \
        coalesce((SELECT max(age(catalog_xmin)) FROM pg_replication_slots \
            WHERE database IS NULL OR database = current_database()), 0)::int8 AS slot_catalog_xids, \
        coalesce((SELECT greatest(0, extract(epoch FROM now() - min(prepared))) FROM prepared), \
            0)::float8 AS prepared_s, \
        coalesce((SELECT max(age(transaction)) FROM prepared), 0)::int8 AS prepared_xids, \
        (SELECT count(*) FROM pg_stat_activity \
            WHERE datname = current_database() AND query = '<insufficient privilege>') AS hidden, \
        t.n_dead_tup AS dead_rows, t.n_live_tup AS live_rows, \
        greatest(0, extract(epoch FROM now() - t.last_autovacuum))::float8 AS autovacuum_s \
    FROM (SELECT to_regclass($1) AS relid) q \
    LEFT JOIN pg_stat_user_tables t ON t.relid = q.relid";

/// Seconds since the lease floor (migration 51), by the shard's clock: its
/// newest row, one probe at the end of its primary key however many a
/// held horizon keeps. One row; NULL before the first floor.
pub const LEASE_FLOOR_AGE: &str = "SELECT (SELECT \
        greatest(0, extract(epoch FROM now() - lf.floor_at))::float8 \
    FROM shardq_lease_floor_moves lf ORDER BY lf.move_seq DESC LIMIT 1) AS lease_floor_s";
