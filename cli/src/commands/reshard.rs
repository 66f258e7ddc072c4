//! `shardq reshard --to NEW.toml`: moves the shard map to a new list.

use crate::args::ReshardArgs;
use anyhow::{bail, Context, Result};
use shardq::config::{Config, ShardConfig};
use shardq::reshard::{self, Options, Progress, Step};
use shardq::shards::ShardSet;

pub async fn run(config: &Config, args: ReshardArgs) -> Result<()> {
    let new = Config::load(Some(&args.to))
        .with_context(|| format!("cannot load the new shard list {}", args.to.display()))?;
    let (old_count, new_count) = (config.shards.len(), new.shards.len());
    let longer = if new_count >= old_count { &new } else { config };
    let replaced = replaced_places(&config.shards, &new.shards);
    if !replaced.is_empty() {
        return replace(config, &new, &replaced).await;
    }
    let stop_after = match args.stop_after.as_deref() {
        None => None,
        Some("recorded") => Some(Step::Recorded),
        Some("opened") => Some(Step::Opened),
        Some("copied") => Some(Step::Copied),
        Some(other) => bail!("--stop-after {other}: say recorded, opened or copied"),
    };
    let shards = ShardSet::connect(longer)?;
    if !args.dry_run {
        for shard in &shards.all()[old_count..] {
            shardq::migrate::migrate_joining(shard, new_count)
                .await
                .with_context(|| format!("cannot migrate the new shard `{}`", shard.name))?;
        }
    }
    let options = Options {
        dry_run: args.dry_run,
        stop_after,
        patience: args.give_up_after.map(std::time::Duration::from_secs),
    };
    let names: Vec<String> = shards.all().iter().map(|s| s.name.clone()).collect();
    let summary = reshard::reshard(&shards, old_count, new_count, &options, |p| {
        print_progress(&names, &p)
    })
    .await?;
    if summary.ranges == 0 && summary.complete {
        println!("nothing to move: the map (epoch {}) already spreads the keys over these {new_count} shards", summary.epoch);
    } else if summary.complete {
        println!(
            "done: epoch {}, {} ranges moved, {} jobs copied",
            summary.epoch, summary.ranges, summary.moved
        );
    } else if args.dry_run {
        println!("dry run: nothing changed");
    } else {
        println!("stopped as asked; run the command again to finish the move");
    }
    Ok(())
}

/// The places (counting from 0) where the two lists name different servers.
fn replaced_places(old: &[ShardConfig], new: &[ShardConfig]) -> Vec<usize> {
    let same = |a: &ShardConfig, b: &ShardConfig| {
        a.pg.get_hosts() == b.pg.get_hosts()
            && a.pg.get_ports() == b.pg.get_ports()
            && a.pg.get_dbname() == b.pg.get_dbname()
    };
    let pairs = old.iter().zip(new).enumerate();
    pairs
        .filter(|(_, (a, b))| !same(a, b))
        .map(|(i, _)| i)
        .collect()
}

/// The new list replaces the servers at `replaced`: nothing moves; each
/// new server must be a copy of the one it replaces.
async fn replace(old: &Config, new: &Config, replaced: &[usize]) -> Result<()> {
    if old.shards.len() != new.shards.len() {
        bail!(
            "the new list replaces shard {} and has {} shards instead of {}: replace servers \
             with a list of the same length first, then grow or shrink it",
            replaced[0],
            new.shards.len(),
            old.shards.len()
        );
    }
    let shards = ShardSet::connect(new)?;
    reshard::check_replacements(&shards, replaced).await?;
    for &i in replaced {
        println!(
            "shard {i}: `{}` is a copy of `{}` (same place, same map): nothing to move",
            new.shards[i].name, old.shards[i].name
        );
    }
    println!(
        "start processes with the new list; keep the replaced servers stopped (jobs written \
         there after the copy was taken are not on the copy)"
    );
    Ok(())
}

fn print_progress(names: &[String], p: &Progress) {
    let name = |i: usize| names.get(i).map_or("?", String::as_str).to_string();
    match p {
        Progress::Planned {
            epoch,
            moves,
            resumed,
        } => {
            let how = if *resumed {
                "resuming the move to"
            } else {
                "plan for"
            };
            println!("{how} epoch {epoch}: {} ranges move", moves.len());
            for m in moves {
                println!(
                    "    {}..{}  {} → {}  ({} keys)",
                    m.first_key,
                    m.end_key,
                    name(m.from_index),
                    name(m.to_index),
                    m.end_key - m.first_key
                );
            }
        }
        Progress::Done(Step::Recorded) => println!("epoch recorded on every shard"),
        Progress::Done(Step::Opened) => {
            println!("ranges open: their enqueues are held on the new shards")
        }
        Progress::Done(Step::Copied) => println!("copied"),
        Progress::Done(Step::Released) => println!("every range released"),
        Progress::Pass {
            moved,
            left,
            released,
            ranges,
            eta,
        } => {
            let eta = eta.map_or(String::new(), |d| format!(", about {}s left", d.as_secs()));
            println!(
                "{moved} jobs copied; {left} unfinished left on old shards; {released}/{ranges} \
                 ranges released{eta}"
            );
        }
        Progress::Retrying { error } => println!("retrying: {error}"),
    }
}
