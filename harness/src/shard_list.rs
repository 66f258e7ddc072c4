//! A shard list as shardq's config reads it (`[[shards]]` entries), for the
//! tests, benchmarks and chaos runs that write one over servers they started.

/// `[[shards]]` entries in routing order, written out by [`ShardList::toml`].
#[derive(Debug, Clone, Default)]
pub struct ShardList {
    /// Each shard's name and URL, in routing order.
    shards: Vec<(String, String)>,
    /// Every shard's `pool_size`; `None` leaves the config's default.
    pool_size: Option<usize>,
}

impl ShardList {
    /// Shards named `s0`, `s1`, … at `urls`, in that order.
    pub fn numbered(urls: impl IntoIterator<Item = impl Into<String>>) -> ShardList {
        urls.into_iter()
            .enumerate()
            .fold(ShardList::default(), |list, (i, url)| {
                list.shard(format!("s{i}"), url)
            })
    }

    /// The list with one more shard, `name` at `url`, at its end.
    pub fn shard(mut self, name: impl Into<String>, url: impl Into<String>) -> ShardList {
        self.shards.push((name.into(), url.into()));
        self
    }

    /// The list with a pool of `size` connections per shard.
    pub fn pool_size(mut self, size: usize) -> ShardList {
        self.pool_size = Some(size);
        self
    }

    /// The entries as TOML, then `extra` (more sections).
    pub fn toml(&self, extra: &str) -> String {
        let mut text = String::new();
        for (name, url) in &self.shards {
            text.push_str(&format!("[[shards]]\nname = \"{name}\"\nurl = \"{url}\"\n"));
            if let Some(size) = self.pool_size {
                text.push_str(&format!("pool_size = {size}\n"));
            }
            text.push('\n');
        }
        text + extra
    }
}

#[cfg(test)]
mod tests {
    use super::ShardList;

    #[test]
    fn entries_are_named_in_order_with_their_pool_then_the_extra_sections() {
        let urls = ["postgres://a/x", "postgres://b/y"];
        assert_eq!(
            ShardList::numbered(urls).pool_size(4).toml("[worker]\n"),
            "[[shards]]\nname = \"s0\"\nurl = \"postgres://a/x\"\npool_size = 4\n\n\
             [[shards]]\nname = \"s1\"\nurl = \"postgres://b/y\"\npool_size = 4\n\n[worker]\n"
        );
        assert_eq!(
            ShardList::default().shard("one", urls[0]).toml(""),
            "[[shards]]\nname = \"one\"\nurl = \"postgres://a/x\"\n\n"
        );
    }
}
