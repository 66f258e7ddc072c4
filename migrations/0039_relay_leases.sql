-- Relay leases: one worker process at a time relays the wakes that
-- children on this shard owe parents on another shard (`to_index`, by this
-- shard's map), so a fleet of P processes does not deliver each wake P
-- times (each try locks the parent's row on its shard). A lease is taken
-- when it has expired, renewed by its holder while it delivers, and passes
-- to another process when its holder stops renewing it (dies or stalls):
-- a row, not a session lock, so it needs no connection held and works
-- through a transaction pooler. Times are the shard's clock.
CREATE TABLE shardq_relay_leases (
    to_index integer PRIMARY KEY,
    holder text NOT NULL,
    until timestamptz NOT NULL
);
