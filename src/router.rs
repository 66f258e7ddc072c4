//! Routing: which shard a job lives on.
//!
//! A job's `shard_key` is a number in `0..SHARD_KEY_SPACE` fixed at enqueue:
//! the 64-bit FNV-1a hash of its ordering key (UTF-8 bytes) modulo the key
//! space, or uniformly random when the job has no ordering key. FNV-1a is
//! written out here, not taken from a library, so that the mapping can never
//! change under a dependency upgrade; the test pins known values.
//!
//! `shard_key` maps onto the configured shard list by the versioned shard
//! map's ranges (`shard_map`); `shard_index` is the formula of
//! its epoch 1, shard `shard_key * N / SHARD_KEY_SPACE` of `N`, kept as the
//! definition of that epoch (and of the golden vectors). Ranges keep
//! neighbouring keys together, so a resharding can move whole ranges.

use rand::Rng;

/// Number of distinct shard keys.
pub const SHARD_KEY_SPACE: u32 = 1 << 16;

/// 64-bit FNV-1a.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The shard key of an ordering key: stable across processes and versions.
pub fn shard_key_for(ordering_key: &str) -> i32 {
    (fnv1a64(ordering_key.as_bytes()) % u64::from(SHARD_KEY_SPACE)) as i32
}

/// A uniformly random shard key, for jobs without an ordering key.
pub fn random_shard_key<R: Rng>(rng: &mut R) -> i32 {
    rng.gen_range(0..SHARD_KEY_SPACE) as i32
}

// Operator tooling (the map's epoch 1, the golden vectors), behind the
// `internal` feature (see `lib.rs`).
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use index::shard_index;
#[cfg(not(feature = "internal"))]
#[allow(unused_imports)]
pub(crate) use index::shard_index;

#[cfg_attr(not(feature = "internal"), allow(dead_code, unreachable_pub))]
mod index {
    use super::SHARD_KEY_SPACE;

    /// The index of the shard holding `shard_key`, among `shard_count` shards,
    /// by the formula of map epoch 1 (`ShardMap::from_formula`); route by the
    /// loaded map ([`crate::shards::ShardSet::for_key`]) instead.
    pub fn shard_index(shard_key: i32, shard_count: usize) -> usize {
        debug_assert!((0..SHARD_KEY_SPACE as i32).contains(&shard_key));
        (shard_key as u64 * shard_count as u64 / u64::from(SHARD_KEY_SPACE)) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_vectors() {
        // Reference values of FNV-1a 64 (from the FNV specification's test suite).
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn same_key_same_shard_key_and_pinned_values() {
        assert_eq!(shard_key_for("customer-42"), shard_key_for("customer-42"));
        // Pinned: changing these breaks every deployed queue.
        assert_eq!(shard_key_for("a"), 0xec8c);
        assert_eq!(shard_key_for("foobar"), 0x67e8);
    }

    #[test]
    fn shard_index_covers_every_shard_in_ranges() {
        for n in 1..=7 {
            assert_eq!(shard_index(0, n), 0);
            assert_eq!(shard_index(SHARD_KEY_SPACE as i32 - 1, n), n - 1);
            let mut last = 0;
            for key in 0..SHARD_KEY_SPACE as i32 {
                let i = shard_index(key, n);
                assert!(i == last || i == last + 1, "ranges are contiguous");
                last = i;
            }
            assert_eq!(last, n - 1);
        }
    }

    /// The golden vectors other languages check their hash against
    /// (docs/routing-vectors.json): the hash, the shard key and the index
    /// for 1..=8 shards of each key, and its UTF-8 bytes as given.
    #[test]
    fn router_matches_the_routing_vectors_file() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/routing-vectors.json");
        let text = std::fs::read_to_string(path).expect("docs/routing-vectors.json");
        let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(doc["key_space"], u64::from(SHARD_KEY_SPACE));
        let vectors = doc["vectors"].as_array().expect("a vectors array");
        let keys: Vec<&str> = vectors.iter().filter_map(|v| v["key"].as_str()).collect();
        for needed in ["", "é", "日本", "🦀"] {
            assert!(keys.contains(&needed), "the vectors hold {needed:?}");
        }
        assert!(keys.iter().any(|k| k.len() >= 1024), "a long key");
        for v in vectors {
            let key = v["key"].as_str().expect("key");
            let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
            assert_eq!(v["utf8_hex"], hex.as_str(), "{key:?}: UTF-8 bytes");
            let hash = format!("{:016x}", fnv1a64(key.as_bytes()));
            assert_eq!(v["fnv1a64"], hash.as_str(), "{key:?}: fnv1a64");
            let shard_key = shard_key_for(key);
            assert_eq!(v["shard_key"], shard_key, "{key:?}: shard_key");
            let by_count: Vec<usize> = (1..=8).map(|n| shard_index(shard_key, n)).collect();
            let expected: Vec<usize> = serde_json::from_value(v["shard_index_by_count"].clone())
                .expect("shard_index_by_count");
            assert_eq!(expected, by_count, "{key:?}: shard index for 1..=8 shards");
        }
    }

    /// Random keys and many distinct ordering keys both spread evenly:
    /// chi-square over 4 shards stays below the 0.1% critical value (16.27, 3 dof).
    #[test]
    fn keys_spread_evenly_over_shards() {
        let shards = 4;
        let samples = 40_000;
        let chi_square = |counts: &[u64]| {
            let expected = samples as f64 / shards as f64;
            counts
                .iter()
                .map(|&c| (c as f64 - expected).powi(2) / expected)
                .sum::<f64>()
        };
        let mut rng = rand::thread_rng();
        let mut random = vec![0u64; shards];
        let mut keyed = vec![0u64; shards];
        for i in 0..samples {
            random[shard_index(random_shard_key(&mut rng), shards)] += 1;
            keyed[shard_index(shard_key_for(&format!("user-{i}")), shards)] += 1;
        }
        assert!(chi_square(&random) < 16.27, "random: {random:?}");
        assert!(chi_square(&keyed) < 16.27, "keyed: {keyed:?}");
    }
}
