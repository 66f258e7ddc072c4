//! A run's view of its workflow's step log: read from the shard once, at
//! the run's first step, then kept in memory, so a step that has not run
//! costs one round trip (its record), not two (a read, then the record).
//!
//! Reading the log once is as safe as reading each step before running it:
//! a step missing from the log is recorded only under this claim's fence
//! (`STEP_RECORD`), and no other claim can record a step while this one
//! holds the fence. A step recorded by this run is added, so a second call
//! of the same name returns the first call's output, as the shard would.

use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use crate::store::steps;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::OnceCell;

/// Recorded outputs by step name (`None`: recorded as SQL NULL).
#[derive(Debug, Default)]
pub(crate) struct StepLog {
    steps: OnceCell<Mutex<HashMap<String, Option<Value>>>>,
}

impl StepLog {
    /// The recorded output of step `name`, reading the log first if this
    /// run has not read it yet.
    pub(crate) async fn get(
        &self,
        shard: &Shard,
        id: JobId,
        name: &str,
    ) -> Result<Option<Option<Value>>, ShardError> {
        let steps = self
            .steps
            .get_or_try_init(|| async { steps::log(shard, id).await.map(Mutex::new) })
            .await?;
        Ok(steps.lock().expect("step log").get(name).cloned())
    }

    /// Notes that step `name` is recorded with `output`.
    pub(crate) fn recorded(&self, name: &str, output: Value) {
        if let Some(steps) = self.steps.get() {
            steps
                .lock()
                .expect("step log")
                .entry(name.to_string())
                .or_insert(Some(output));
        }
    }
}
