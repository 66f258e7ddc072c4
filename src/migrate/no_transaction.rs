//! Migrations that run outside a transaction, and the rules every migration
//! from version 6 on follows so that no shard stops claiming while it runs.
//!
//! In one transaction, `CREATE INDEX` holds a lock that blocks every write to
//! its table until the transaction ends, and `ADD CONSTRAINT … CHECK` holds
//! ACCESS EXCLUSIVE across the scan that validates it: on a busy shard the
//! whole fleet waits behind the migration. So a migration that indexes or
//! constrains an existing table starts with `-- shardq:no-transaction` and
//! is written as statements that each take only a weak lock: `CREATE INDEX
//! CONCURRENTLY IF NOT EXISTS`, `ADD CONSTRAINT … NOT VALID` then `VALIDATE
//! CONSTRAINT`. Each statement commits on its own, so each is written to be
//! run again after a failure; an index left invalid by a failed concurrent
//! build is dropped (concurrently) and built again.

use super::error::MigrateError;
use super::list::Migration;
#[cfg(test)]
use super::list::MARKER;
use crate::shards::{Shard, ShardError};
use crate::store::schema::{self, MigrationSession};

/// Applies `m` statement by statement under the session-level migration lock,
/// unless it is applied already. Returns whether this call applied it.
pub(super) async fn apply(shard: &Shard, m: &Migration) -> Result<bool, MigrateError> {
    if schema::applied(shard).await?.contains(&m.version) {
        return Ok(false);
    }
    // A session's settings and lock would stay on whichever server
    // connection the pooler lent.
    if shard.behind_pooler() {
        return Err(MigrateError::NeedsSession {
            shard: shard.name.clone(),
            name: m.name,
        });
    }
    let client = shard.client().await?;
    let session = MigrationSession::open(shard, &client).await?;
    session.lock().await?;
    let outcome = apply_locked(shard, &session, m).await;
    let unlocked = session.unlock().await;
    let applied = outcome?;
    unlocked?;
    Ok(applied)
}

/// The body of [`apply`], holding the lock: another process may have applied
/// `m` while this one waited.
async fn apply_locked(
    shard: &Shard,
    session: &MigrationSession<'_>,
    m: &Migration,
) -> Result<bool, MigrateError> {
    if session.applied().await?.contains(&m.version) {
        return Ok(false);
    }
    for statement in statements(m.sql) {
        run_statement(shard, session, &statement)
            .await
            .map_err(|source| MigrateError::Statement {
                shard: shard.name.clone(),
                name: m.name,
                statement: statement.clone(),
                source: Box::new(source),
            })?;
    }
    session.record(m.version, m.name).await?;
    Ok(true)
}

/// Runs one statement on its own; before a concurrent index build, drops the
/// invalid index an earlier failed build of it left behind.
async fn run_statement(
    shard: &Shard,
    session: &MigrationSession<'_>,
    statement: &str,
) -> Result<(), ShardError> {
    if let Some(index) = concurrent_index_name(statement) {
        if session.index_invalid(&index).await? {
            tracing::warn!(shard = %shard.name, index, "dropping an index left invalid by a failed build");
            session.drop_index(&index).await?;
        }
    }
    session.run(statement).await
}

/// The statements of a migration file: each ends with `;` at the end of a
/// line outside a `$$` body (a `DO $$ … $$;` block is one statement, so
/// the steps that must happen together run in one transaction).
pub(crate) fn statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_body = false;
    for line in sql.lines() {
        if line.trim_start().starts_with("--") {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        in_body ^= line.matches("$$").count() % 2 == 1;
        if !in_body && line.trim_end().ends_with(';') {
            out.push(current.trim().to_string());
            current.clear();
        }
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_string());
    }
    out
}

/// The index name of `CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS name`.
fn concurrent_index_name(statement: &str) -> Option<String> {
    let words = words(statement);
    let phrase = ["INDEX", "CONCURRENTLY", "IF", "NOT", "EXISTS"];
    let at = words.windows(phrase.len()).position(|w| w == phrase)?;
    words.get(at + phrase.len()).map(|name| name.to_lowercase())
}

/// Upper-cased words of a statement, comments dropped.
fn words(statement: &str) -> Vec<String> {
    statement
        .lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .flat_map(|line| line.split(|c: char| c.is_whitespace() || "(),;".contains(c)))
        .filter(|w| !w.is_empty())
        .map(str::to_uppercase)
        .collect()
}

/// Checks that a migration takes no lock that stops the fleet while it scans
/// or builds. Tables the migration creates itself are exempt. Returns what
/// to change.
///
/// # Errors
///
/// Each offending statement, with the rule it breaks.
#[cfg(test)]
fn lint(m: &Migration) -> Result<(), Vec<String>> {
    let created: Vec<String> = statements(m.sql)
        .iter()
        .filter_map(|s| table_after(&words(s), &["CREATE", "TABLE"]))
        .collect();
    let existing = |table: Option<String>| table.is_some_and(|t| !created.contains(&t));
    let mut problems = Vec::new();
    for statement in statements(m.sql) {
        let w = words(&statement);
        let has = |phrase: &[&str]| w.windows(phrase.len()).any(|x| x == phrase);
        let first_line = statement.lines().next().unwrap_or("").to_string();
        let is_index = has(&["CREATE", "INDEX"]) || has(&["CREATE", "UNIQUE", "INDEX"]);
        let blocking_build =
            m.runs_in_transaction() || !has(&["CONCURRENTLY", "IF", "NOT", "EXISTS"]);
        if is_index && existing(table_after(&w, &["ON"])) && blocking_build {
            problems.push(format!(
                "{first_line}: index an existing table with CREATE INDEX CONCURRENTLY \
                 IF NOT EXISTS in a migration that starts with `{MARKER}`"
            ));
        }
        if has(&["DROP", "INDEX"]) && !has(&["DROP", "INDEX", "CONCURRENTLY"]) {
            problems.push(format!(
                "{first_line}: DROP INDEX CONCURRENTLY, in a `{MARKER}` migration"
            ));
        }
        let altered = existing(table_after(&w, &["ALTER", "TABLE"]));
        let constraint = has(&["CHECK"]) || has(&["FOREIGN", "KEY"]) || has(&["REFERENCES"]);
        if altered && has(&["ADD"]) && constraint && !has(&["NOT", "VALID"]) {
            problems.push(format!(
                "{first_line}: add the constraint NOT VALID, then VALIDATE CONSTRAINT \
                 in a later statement"
            ));
        }
        if altered && (has(&["SET", "NOT", "NULL"]) || has(&["TYPE"])) {
            problems.push(format!(
                "{first_line}: SET NOT NULL and ALTER COLUMN TYPE scan or rewrite the table \
                 under ACCESS EXCLUSIVE; add a new column or a NOT VALID check instead"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// The (lower-cased) table named after `phrase`, skipping `IF [NOT] EXISTS`
/// and `ONLY`.
#[cfg(test)]
fn table_after(words: &[String], phrase: &[&str]) -> Option<String> {
    let at = words.windows(phrase.len()).position(|w| w == phrase)? + phrase.len();
    words[at..]
        .iter()
        .find(|w| !matches!(w.as_str(), "IF" | "NOT" | "EXISTS" | "ONLY"))
        .map(|t| t.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::list::MIGRATIONS;

    fn migration(sql: &'static str) -> Migration {
        Migration {
            version: 99,
            name: "0099_test.sql",
            sql,
        }
    }

    #[test]
    fn migrations_from_version_6_take_no_blocking_lock() {
        for m in MIGRATIONS.iter().filter(|m| m.version >= 6) {
            if let Err(problems) = lint(m) {
                panic!("{}: {}", m.name, problems.join("\n"));
            }
        }
    }

    #[test]
    fn the_lint_refuses_what_blocks_the_fleet() {
        let blocking = [
            "CREATE INDEX jobs_by_queue ON workflow_status (queue);",
            "ALTER TABLE workflow_status ADD CONSTRAINT c CHECK (attempts >= 0);",
            "ALTER TABLE workflow_status ALTER COLUMN queue SET NOT NULL;",
            "DROP INDEX workflow_status_dequeue;",
        ];
        for sql in blocking {
            let leaked: &'static str = Box::leak(sql.to_string().into_boxed_str());
            assert!(lint(&migration(leaked)).is_err(), "lint passed: {sql}");
        }
        let concurrent = "-- shardq:no-transaction\n\
            CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_by_queue\n    ON workflow_status (queue);\n\
            ALTER TABLE workflow_status ADD CONSTRAINT c CHECK (attempts >= 0) NOT VALID;\n\
            ALTER TABLE workflow_status VALIDATE CONSTRAINT c;\n\
            DROP INDEX CONCURRENTLY IF EXISTS old_index;\n";
        assert_eq!(lint(&migration(concurrent)), Ok(()));
        let new_table = "CREATE TABLE shardq_pauses (queue text PRIMARY KEY);\n\
            CREATE INDEX shardq_pauses_by_queue ON shardq_pauses (queue);";
        assert_eq!(lint(&migration(new_table)), Ok(()));
    }

    #[test]
    fn statements_split_at_line_ends_and_name_their_index() {
        let sql = "-- shardq:no-transaction\n-- why\nCREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS Ix_A\n  ON t (a);\nSELECT 1;";
        let parts = statements(sql);
        assert_eq!(parts.len(), 2);
        assert_eq!(concurrent_index_name(&parts[0]).as_deref(), Some("ix_a"));
        assert_eq!(concurrent_index_name(&parts[1]), None);
        assert!(!migration("-- shardq:no-transaction\nSELECT 1;").runs_in_transaction());
    }

    #[test]
    fn a_do_block_is_one_statement() {
        let sql = "-- shardq:no-transaction\nDO $$\nBEGIN\n    SELECT 1;\n    SELECT 2;\nEND $$;\nSELECT 3;";
        let parts = statements(sql);
        assert_eq!(parts.len(), 2, "{parts:?}");
        assert!(parts[0].starts_with("DO $$") && parts[0].ends_with("END $$;"));
        assert_eq!(parts[1], "SELECT 3;");
    }
}
