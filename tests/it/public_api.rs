//! The library's public surface, checked in: every public module and every
//! name it declares or re-exports at its top level is listed below, once
//! per module (what an embedder sees: 130 names, 49 of them at the root).
//! Two checks keep the list and the code equal:
//!
//! - it compiles: each listed name exists at that path and is public (a
//!   removal or rename fails the build of this test);
//! - [`the_public_surface_is_the_listed_one`] scans `src/` from `lib.rs`
//!   through its `pub mod`s and fails on any top-level `pub` item or
//!   `pub use` name missing here (an addition fails until it is listed).
//!
//! Limits: methods, fields and trait impls are not listed (a new `pub fn`
//! inside an `impl` passes); the scan reads lines at column 0 that start
//! with `pub ` (rustfmt's layout), follows `pub mod` to `name.rs` or
//! `name/mod.rs`, and skips items marked `#[doc(hidden)]`: the operator
//! tooling that the `internal` feature opens to this workspace's CLI,
//! dashboard, benchmarks and tests (the modules `store`, `reshard`,
//! `shard_map`, `prometheus::{backlog, horizon, invariants, limits}`,
//! `schedule::due`, `worker::metrics`, and the read models and per-shard
//! functions that `client`, `migrate`, `config`, `router` and `tls`
//! re-export), which is not listed; an item made by a macro is not seen. Changing the surface on purpose: edit the list in
//! the same commit, so a reviewer sees it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod root {
    #[allow(unused_imports)]
    use shardq::{
        client, config, deadpool_postgres, error_chain, job, migrate, prometheus, router, schedule,
        shards, tls, tokio_postgres, worker, ArgsError, ChildError, ChildHandle, ChildPolicy,
        ChildResult, Client, ClientError, Config, ConfigError, ErrorKind, HandlerError,
        HandlerRegistry, HandlerResult, InvalidJob, JobArgs, JobContext, JobId, JobInfo,
        JobOutcome, JobStatus, MigrateError, Missed, NewJob, OnDuplicate, PausedQueue,
        PermanentFailure, RoutedJob, Schedule, ScheduleError, ShardError, ShardSet, Shardq,
        StepError, Worker, WorkerReport, VERSION,
    };
}

mod client {
    #[allow(unused_imports)]
    use shardq::client::{
        Client, ClientError, ErrorKind, JobInfo, JobOutcome, PausedQueue, PendingEnqueue,
        QueueLimit, QueueLimits, RoutedJob, StartRate,
    };
}

mod config {
    #[allow(unused_imports)]
    use shardq::config::{
        Backoff, Config, ConfigBuilder, ConfigError, DatabaseConfig, DequeueConfig, DequeueMode,
        LocalConfig, Retention, ShardConfig, SlotBounds, WorkerConfig, DEFAULT_CONFIG_PATH,
        SINGLE_SHARD_NAME,
    };
}

mod job {
    #[allow(unused_imports)]
    use shardq::job::{
        ChildPolicy, Debounce, EnqueueLimits, InvalidJob, JobId, JobIdParseError, JobStatus,
        NewJob, OnDuplicate, MAX_ATTEMPTS, MAX_DEBOUNCE_KEY_BYTES, MAX_DEBOUNCE_WAIT,
        MAX_DEDUP_ID_BYTES, MAX_GROUP_BYTES, MAX_HANDLER_BYTES, MAX_ORDERING_KEY_BYTES,
        MAX_QUEUE_BYTES, MAX_TIMEOUT,
    };
}

mod migrate {
    #[allow(unused_imports)]
    use shardq::migrate::{
        check_all, latest_version, migrate_all, migrate_all_within, MigrateError,
    };
}

mod prometheus {
    #[allow(unused_imports)]
    use shardq::prometheus::{prometheus_client, serve, WorkerMetrics, CONTENT_TYPE};
}

mod router {
    #[allow(unused_imports)]
    use shardq::router::{random_shard_key, shard_key_for, SHARD_KEY_SPACE};
}

mod schedule {
    #[allow(unused_imports)]
    use shardq::schedule::{Missed, Schedule, ScheduleError};
}

mod shards {
    #[allow(unused_imports)]
    use shardq::shards::{Listener, PooledClient, Shard, ShardError, ShardSet};
}

mod tls {
    #[allow(unused_imports)]
    use shardq::tls::{CaRoots, TlsError, TlsMode};
}

mod worker {
    #[allow(unused_imports)]
    use shardq::worker::{
        ChildError, ChildHandle, ChildResult, HandlerError, HandlerRegistry, HandlerResult,
        JobContext, PermanentFailure, Stats, StatsSnapshot, StepError, Worker, WorkerReport, NOOP,
        SLEEP,
    };
}

/// Module path (`""` for the crate root) → the names listed for it above.
fn listed() -> BTreeMap<String, BTreeSet<String>> {
    let this = include_str!("public_api.rs");
    let mut out = BTreeMap::new();
    // Split apart, so that this line is not itself a match.
    let needle = concat!("\n    use ", "shardq");
    for statement in this.split(needle).skip(1) {
        let statement = &statement[..statement.find(';').expect("a use ends with ;")];
        // `::module::{A, B}`, or `::module::A` where rustfmt drops the braces of one name.
        let (module, names) = match statement.find('{') {
            Some(open) => (
                &statement[..open],
                &statement[open + 1..statement.rfind('}').expect("a closing brace")],
            ),
            None => statement.rsplit_once("::").expect("a path"),
        };
        let names = names
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(String::from);
        out.entry(module.trim_matches(':').to_string())
            .or_insert_with(BTreeSet::new)
            .extend(names);
    }
    out
}

/// Module path → the names its file declares `pub` or re-exports, for
/// `lib.rs` and every `pub mod` reached from it.
fn declared() -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    scan(String::new(), &root, &mut out);
    out
}

fn scan(module: String, file: &Path, out: &mut BTreeMap<String, BTreeSet<String>>) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut names = BTreeSet::new();
    let mut hidden = false;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("#[") {
            hidden |= line.contains("doc(hidden)");
            continue;
        }
        if !line.starts_with("pub ") {
            if !line.trim().is_empty() && !line.starts_with("//") {
                hidden = false;
            }
            continue;
        }
        let mut statement = line.to_string();
        if statement.starts_with("pub use") {
            while !statement.trim_end().ends_with(';') {
                statement.push(' ');
                statement.push_str(lines.next().expect("a pub use ends with ;").trim());
            }
        }
        if std::mem::take(&mut hidden) {
            continue;
        }
        if let Some(used) = statement.strip_prefix("pub use") {
            names.extend(use_names(used));
            continue;
        }
        let words: Vec<&str> = statement.split_whitespace().collect();
        let at = words
            .iter()
            .position(|w| {
                matches!(
                    *w,
                    "fn" | "struct" | "enum" | "const" | "static" | "trait" | "type" | "mod"
                )
            })
            .unwrap_or_else(|| panic!("{}: unknown item `{statement}`", file.display()));
        let name: String = words[at + 1]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if words[at] == "mod" {
            let child = if module.is_empty() {
                name.clone()
            } else {
                format!("{module}::{name}")
            };
            scan(child, &child_file(file, &name), out);
        }
        names.insert(name);
    }
    out.insert(module, names);
}

/// The names a `pub use` brings in: the last segment of each path, or its
/// `as` name.
fn use_names(used: &str) -> Vec<String> {
    let used = used.trim().trim_end_matches(';');
    let inner = match (used.find('{'), used.rfind('}')) {
        (Some(open), Some(close)) => &used[open + 1..close],
        _ => used,
    };
    inner
        .split([',', '{', '}'])
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| match part.split_once(" as ") {
            Some((_, alias)) => alias.trim().to_string(),
            None => part.rsplit("::").next().unwrap_or(part).trim().to_string(),
        })
        .filter(|name| name != "self")
        .collect()
}

/// Where `mod name;` declared in `parent` lives.
fn child_file(parent: &Path, name: &str) -> PathBuf {
    let file_name = parent.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let dir = if file_name == "lib.rs" || file_name == "mod.rs" {
        parent.parent().expect("a folder").to_path_buf()
    } else {
        parent.with_extension("")
    };
    let flat = dir.join(format!("{name}.rs"));
    if flat.exists() {
        flat
    } else {
        dir.join(name).join("mod.rs")
    }
}

#[test]
fn the_public_surface_is_the_listed_one() {
    let declared = declared();
    let listed = listed();
    let mut problems = Vec::new();
    for (module, names) in &declared {
        let shown = if module.is_empty() { "shardq" } else { module };
        let empty = BTreeSet::new();
        let have = listed.get(module).unwrap_or(&empty);
        for name in names.difference(have) {
            problems.push(format!("public but not listed: {shown}::{name}"));
        }
        for name in have.difference(names) {
            problems.push(format!(
                "listed but not declared at the top of its file: {shown}::{name}"
            ));
        }
    }
    for module in listed.keys().filter(|m| !declared.contains_key(*m)) {
        problems.push(format!("listed module is not public: {module}"));
    }
    assert!(
        problems.is_empty(),
        "the public API changed; if on purpose, update tests/public_api.rs:\n{}",
        problems.join("\n")
    );
}

/// The scan sees what it must: a hidden module is skipped, and the driver
/// layer and the operator tooling are not public.
#[test]
fn the_scan_skips_hidden_modules_and_store_is_not_public() {
    let declared = declared();
    assert!(!declared[""].contains("store"), "{:?}", declared[""]);
    assert!(!declared.keys().any(|m| m.starts_with("store")));
    assert!(declared["client"].contains("Client"));
    assert!(!declared.contains_key("migrate::no_transaction"));
    for hidden in ["reshard", "shard_map"] {
        assert!(!declared[""].contains(hidden), "{:?}", declared[""]);
    }
    for hidden in ["prometheus::backlog", "schedule::due", "worker::metrics"] {
        assert!(!declared.contains_key(hidden), "{hidden}");
    }
    assert!(!declared["client"].contains("CheckReport"));
    assert!(!declared["migrate"].contains("migrate_shard"));
}
