//! `shardq job show|cancel|retry`.

use crate::args::JobAction;
use anyhow::{bail, Result};
use shardq::config::Config;
use shardq::Client;
use shardq::JobStatus;

pub async fn run(config: &Config, action: JobAction) -> Result<()> {
    let client = Client::new(config)?;
    match action {
        JobAction::Show { id } => match client.job(id).await? {
            Some(info) => println!("{}", serde_json::to_string_pretty(&info)?),
            None => bail!("no job {id}: check the id and that --config names the same shards"),
        },
        JobAction::Cancel { id } => match client.cancel(id).await? {
            Some(JobStatus::Running) => {
                println!("job {id} is running; its handler was asked to stop")
            }
            Some(_) => println!("job {id} cancelled"),
            None => bail!("job {id} cannot be cancelled: it does not exist or has finished"),
        },
        JobAction::Retry { id } => {
            if !client.retry(id).await? {
                bail!("job {id} cannot be retried: only dead, failed or cancelled jobs can");
            }
            println!("job {id} queued again");
        }
    }
    Ok(())
}
