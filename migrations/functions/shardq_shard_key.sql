-- shardq_shard_key: the shard key of a routing key (a job's ordering key,
-- else its deduplication id), exactly as src/router.rs computes it: FNV-1a
-- 64 of the key's UTF-8 bytes, modulo 65536 (docs/routing-vectors.json
-- pins the values; tests check both against it).
--
-- Only the low 16 bits of the 64-bit hash are kept, and the low 16 bits of
-- a product (and of an XOR) depend only on the low 16 bits of its operands:
-- so the hash is carried in 16 bits, with the offset basis 0xcbf29ce484222325
-- and the prime 0x100000001b3 cut to their low 16 bits (0x2325, 0x01b3).
-- Every step then fits an int, with no 64-bit unsigned arithmetic, which SQL
-- does not have.
CREATE OR REPLACE FUNCTION shardq_shard_key(p_key text) RETURNS int
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
DECLARE
    bytes bytea := convert_to(p_key, 'UTF8');
    h int := 8997; -- 0x2325
BEGIN
    FOR i IN 0 .. length(bytes) - 1 LOOP
        h := ((h # get_byte(bytes, i)) * 435) & 65535; -- 435 = 0x01b3
    END LOOP;
    RETURN h;
END $$;
