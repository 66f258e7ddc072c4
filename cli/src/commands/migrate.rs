//! `shardq migrate`.

use anyhow::Result;
use shardq::config::Config;
use shardq::shards::ShardSet;

pub async fn run(config: &Config) -> Result<()> {
    let shards = ShardSet::connect(config)?;
    let applied = shardq::migrate::migrate_all(&shards).await?;
    for (shard, versions) in shards.all().iter().zip(applied) {
        if versions.is_empty() {
            println!(
                "{}: up to date (version {})",
                shard.name,
                shardq::migrate::latest_version()
            );
        } else {
            println!("{}: applied {:?}", shard.name, versions);
        }
    }
    Ok(())
}
