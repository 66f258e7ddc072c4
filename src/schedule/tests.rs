//! Next-tick computation, DST included (Europe/Berlin, 2026: clocks go
//! forward on March 29 at 02:00 CET = 01:00 UTC, back on October 25 at
//! 03:00 CEST = 01:00 UTC).

use super::*;
use chrono::TimeZone;

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

fn berlin(cron: &str) -> Schedule {
    Schedule::new("b", cron, "q", "noop")
        .unwrap()
        .in_timezone("Europe/Berlin")
        .unwrap()
}

/// The ticks after `from`, `n` of them.
fn ticks(s: &Schedule, from: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
    std::iter::successors(s.next_after(from), |t| s.next_after(*t))
        .take(n)
        .collect()
}

#[test]
fn utc_schedule_ticks_at_its_wall_clock_time() {
    let s = Schedule::new("n", "0 3 * * *", "q", "noop").unwrap();
    assert_eq!(
        ticks(&s, utc(2026, 6, 1, 12, 0), 2),
        vec![utc(2026, 6, 2, 3, 0), utc(2026, 6, 3, 3, 0)]
    );
}

#[test]
fn zone_offsets_apply_in_winter_and_summer() {
    let s = berlin("0 9 * * *");
    assert_eq!(
        s.next_after(utc(2026, 1, 10, 0, 0)),
        Some(utc(2026, 1, 10, 8, 0))
    );
    assert_eq!(
        s.next_after(utc(2026, 7, 10, 0, 0)),
        Some(utc(2026, 7, 10, 7, 0))
    );
}

#[test]
fn a_fixed_time_in_the_spring_gap_runs_right_after_the_gap_once() {
    // 02:30 does not exist on March 29: it runs at 03:00 CEST (01:00 UTC).
    let s = berlin("30 2 * * *");
    assert_eq!(
        ticks(&s, utc(2026, 3, 28, 12, 0), 2),
        vec![utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]
    );
}

#[test]
fn a_fixed_time_in_the_autumn_overlap_runs_once_at_its_first_occurrence() {
    // 02:30 happens twice on October 25 (00:30 and 01:30 UTC): one tick.
    let s = berlin("30 2 * * *");
    assert_eq!(
        ticks(&s, utc(2026, 10, 24, 12, 0), 2),
        vec![utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    );
}

#[test]
fn an_interval_runs_in_both_passes_of_the_repeated_hour() {
    // Every 30 minutes stays every 30 minutes of real time through the
    // overlap: 02:00 and 02:30 CEST, then 02:00 and 02:30 CET.
    let s = berlin("*/30 * * * *");
    assert_eq!(
        ticks(&s, utc(2026, 10, 24, 23, 59), 5),
        vec![
            utc(2026, 10, 25, 0, 0),
            utc(2026, 10, 25, 0, 30),
            utc(2026, 10, 25, 1, 0),
            utc(2026, 10, 25, 1, 30),
            utc(2026, 10, 25, 2, 0),
        ]
    );
}

#[test]
fn an_interval_skips_the_times_the_spring_gap_removes() {
    // 01:30 CET, then 03:00 CEST: 30 minutes of real time.
    let s = berlin("*/30 * * * *");
    assert_eq!(
        ticks(&s, utc(2026, 3, 29, 0, 15), 3),
        vec![
            utc(2026, 3, 29, 0, 30),
            utc(2026, 3, 29, 1, 0),
            utc(2026, 3, 29, 1, 30)
        ]
    );
}

#[test]
fn latest_at_or_before_inverts_next_after_across_dst() {
    for s in [berlin("*/30 * * * *"), berlin("30 2 * * *")] {
        for t in ticks(&s, utc(2026, 10, 24, 0, 0), 10) {
            assert_eq!(s.latest_at_or_before(t), Some(t), "{}", s.expression());
            let just_after = t + chrono::TimeDelta::seconds(1);
            assert_eq!(s.latest_at_or_before(just_after), Some(t));
        }
    }
}

#[test]
fn seconds_field_and_nicknames_parse() {
    let s = Schedule::new("s", "*/10 * * * * *", "q", "noop").unwrap();
    let from = Utc.with_ymd_and_hms(2026, 6, 1, 0, 0, 3).unwrap();
    assert_eq!(
        s.next_after(from),
        Some(Utc.with_ymd_and_hms(2026, 6, 1, 0, 0, 10).unwrap())
    );
    let daily = Schedule::new("d", "@daily", "q", "noop").unwrap();
    assert_eq!(
        daily.next_after(utc(2026, 6, 1, 5, 0)),
        Some(utc(2026, 6, 2, 0, 0))
    );
}

#[test]
fn the_dedup_id_is_the_name_and_the_tick_in_utc() {
    let s = berlin("30 2 * * *");
    assert_eq!(s.dedup_id(utc(2026, 3, 29, 1, 0)), "b@2026-03-29T01:00:00Z");
    assert_eq!(
        s.job_for(utc(2026, 3, 29, 1, 0)).dedup_id.as_deref(),
        Some("b@2026-03-29T01:00:00Z")
    );
}

#[test]
fn bad_input_says_what_to_fix() {
    let err = Schedule::new("x", "61 * * * *", "q", "noop").unwrap_err();
    assert_eq!(err.key(), "cron");
    assert!(err.to_string().contains("not a cron expression"), "{err}");
    let err = Schedule::new("x", "0 0 30 2 *", "q", "noop").unwrap_err();
    assert!(matches!(err, ScheduleError::Never(_)), "{err}");
    let err = Schedule::new("x", "* * * * *", "q", "noop")
        .unwrap()
        .in_timezone("Mars/Olympus")
        .unwrap_err();
    assert_eq!(err.key(), "timezone");
    assert!(err.to_string().contains("IANA"), "{err}");
    let err = Schedule::new("x", "* * * * *", "", "noop").unwrap_err();
    assert_eq!(err.key(), "queue");
    let err = Schedule::new("x", "* * * * *", "q", "").unwrap_err();
    assert_eq!(err.key(), "handler");
    assert_eq!(
        Schedule::new("", "* * * * *", "q", "h").unwrap_err().key(),
        "name"
    );
    assert!("sometimes".parse::<Missed>().is_err());
    assert_eq!("run_once".parse::<Missed>().unwrap(), Missed::RunOnce);
}
