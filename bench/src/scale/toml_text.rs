//! The shards.toml texts the bench writes: for its own pools and for the
//! worker processes of each run.

use shardq::config::ShardFile;
use std::fmt::Write;

/// A TOML basic string (JSON's escapes are valid TOML escapes).
fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

/// A `[[shards]]` entry given by URL (no pool_size: [`config`] adds it).
pub fn url_entry(name: &str, url: &str) -> String {
    format!("name = {}\nurl = {}\n", quote(name), quote(url))
}

/// A `[[shards]]` entry copied from a user's shards.toml, every key but
/// `pool_size`.
pub fn shard_entry(s: &ShardFile) -> String {
    let mut out = format!("name = {}\n", quote(&s.name));
    let strings = [
        ("url", s.url.clone()),
        ("host", s.host.clone()),
        ("dbname", s.dbname.clone()),
        ("user", s.user.clone()),
        ("password", s.password.clone()),
        ("password_env", s.password_env.clone()),
        ("sslmode", s.sslmode.clone()),
        (
            "password_file",
            s.password_file.as_ref().map(|p| p.display().to_string()),
        ),
        (
            "sslrootcert",
            s.sslrootcert.as_ref().map(|p| p.display().to_string()),
        ),
    ];
    for (key, value) in strings {
        if let Some(v) = value {
            let _ = writeln!(out, "{key} = {}", quote(&v));
        }
    }
    if let Some(port) = s.port {
        let _ = writeln!(out, "port = {port}");
    }
    out
}

/// A whole config: the entries with `pool_size`, then `[dequeue]` holding
/// `dequeue_extra` and `[worker]` with `queues` when given.
pub fn config(
    entries: &[String],
    pool_size: usize,
    queues: &[&str],
    dequeue_extra: &str,
) -> String {
    let mut text = String::new();
    for entry in entries {
        let _ = write!(text, "[[shards]]\n{entry}pool_size = {pool_size}\n\n");
    }
    let _ = write!(text, "[dequeue]\n{dequeue_extra}\n");
    if !queues.is_empty() {
        let list: Vec<String> = queues.iter().map(|q| quote(q)).collect();
        let _ = writeln!(text, "[worker]\nqueues = [{}]", list.join(", "));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_config_parses() {
        let entries = vec![
            url_entry("a", "postgres://postgres@127.0.0.1:5432/shardq"),
            url_entry("b\"q", "postgres://postgres@127.0.0.1:5433/shardq"),
        ];
        let text = config(&entries, 9, &["scale"], "lock_timeout_ms = 0\n");
        let c = shardq::Config::from_toml(&text).expect(&text);
        assert_eq!(c.shards.len(), 2);
        assert_eq!(c.shards[1].name, "b\"q");
        assert_eq!(c.shards[0].pool_size, 9);
        assert_eq!(c.worker.queues, vec!["scale".to_string()]);
        assert!(c.database.lock_timeout.is_zero());
    }
}
