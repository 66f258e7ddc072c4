//! Checks `[[schedules]]` entries into [`Schedule`]s.

use super::super::error::ConfigError;
use super::super::file::ScheduleFile;
use crate::job::EnqueueLimits;
use crate::schedule::{Missed, Schedule, ScheduleError};
use std::collections::HashSet;

pub(super) fn validate_schedules(
    files: Vec<ScheduleFile>,
    limits: &EnqueueLimits,
) -> Result<Vec<Schedule>, ConfigError> {
    let mut names = HashSet::new();
    let mut schedules = Vec::with_capacity(files.len());
    for (index, f) in files.into_iter().enumerate() {
        let name = super::super::redact::redact_text(&f.name);
        let fail = |source: ScheduleError| ConfigError::Schedule {
            index,
            name: name.clone(),
            key: source.key(),
            source,
        };
        if !names.insert(f.name.clone()) {
            return Err(fail(ScheduleError::Duplicate(name.clone())));
        }
        schedules.push(validate_schedule(f, limits).map_err(fail)?);
    }
    Ok(schedules)
}

fn validate_schedule(f: ScheduleFile, limits: &EnqueueLimits) -> Result<Schedule, ScheduleError> {
    let missed: Missed = f.missed.parse()?;
    let schedule = Schedule::new(f.name, &f.cron, f.queue, f.handler)?
        .in_timezone(&f.timezone)?
        .missed(missed)
        .payload(f.payload.unwrap_or_else(|| serde_json::json!({})));
    schedule.validate(limits)?;
    Ok(schedule)
}
