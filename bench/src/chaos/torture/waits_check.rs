//! After the drain: the waiting workflows' invariants. Every waiting
//! workflow succeeded; no sleep was passed before its wake time (by the
//! shard's clock: at the step after it, and at the claim of the run that
//! passed it, unless that claim was a retry's); every recorded effect step
//! has exactly one effect of the run that recorded it; every child (keyed
//! anywhere) succeeded once, its effect step likewise, and its value
//! reached its parent once, as recorded; each child's message reached its
//! parent once; every message the driver stored is in the mailbox, each received at most once, by the recv that
//! recorded it, a topic's messages received in send order, and a message
//! is left unreceived (or refused) only where a recv of its topic timed out.

use super::super::names::{QUEUE, TORTURE_QUEUE};
use super::mail::{self, Outcome, Sent};
use super::waits::{self, KIDS_TOPIC, TOPICS};
use super::waits_sql as sql;
use anyhow::Result;
use serde::Serialize;
use shardq::Client;
use std::collections::{BTreeMap, HashMap};

/// Offending workflows quoted, as evidence.
const EXAMPLES: usize = 8;

/// What the waiting workflows' rows say.
#[derive(Debug, Default, Clone, Serialize)]
pub struct WaitChecks {
    /// Waiting workflows (rows, acknowledged or not).
    pub workflows: i64,
    /// Waiting workflows that did not succeed.
    pub not_succeeded: i64,
    /// Sleeps passed and checked.
    pub sleeps: i64,
    /// Sleeps passed before their wake time.
    pub early_wakes: i64,
    /// Recorded effect steps.
    pub effect_steps: i64,
    /// Recorded effect steps without exactly one effect of their run.
    pub effects_wrong: i64,
    /// Effects of runs whose record never landed (allowed: at least once).
    pub effect_reruns: i64,
    /// Succeeded workflows without both effect steps recorded.
    pub missing_effect_steps: i64,
    /// Children checked.
    pub children: u64,
    /// Of them, on another shard than their parent's.
    pub children_elsewhere: u64,
    /// Children or gathered results that break an invariant.
    pub children_wrong: u64,
    /// Children's messages received by their parents ([`KIDS_TOPIC`]).
    pub kid_messages: u64,
    /// Children's messages lost, doubled, or not received by their parent.
    pub kid_messages_wrong: u64,
    /// Messages the driver stored (acknowledged).
    pub stored: u64,
    /// Messages received.
    pub received: u64,
    /// Recvs that parked before their message came (woken by the send).
    pub received_after_park: u64,
    /// Recvs that found their message waiting.
    pub received_waiting: u64,
    /// Recvs that timed out.
    pub timed_out: u64,
    /// Messages left unreceived where a recv of their topic timed out.
    pub unreceived: u64,
    /// Sends refused (the workflow had finished) after a recv timed out.
    pub refused: u64,
    /// Messages lost, received twice or wrongly, out of order, or left
    /// unreceived without a timeout.
    pub mail_wrong: u64,
    /// Offending workflows, as evidence.
    pub examples: Vec<String>,
}

impl WaitChecks {
    fn example(&mut self, what: String) {
        if self.examples.len() < EXAMPLES {
            self.examples.push(what);
        }
    }
}

/// A waiting workflow, as its shard's rows say.
#[derive(Debug)]
struct Parent {
    n: u64,
    status: String,
    shard: usize,
    /// `shardq:child:N:result` → the value recorded.
    results: Option<serde_json::Value>,
    gathered: Option<serde_json::Value>,
    /// Children found, per index.
    children: BTreeMap<i64, u64>,
}

/// Waiting workflows by (shard key, id).
type Parents = HashMap<(i32, i64), Parent>;

/// A message in a mailbox.
#[derive(Debug)]
struct Message {
    topic: String,
    seq: i64,
    key: Option<String>,
    received_by: Option<String>,
    k: Option<u64>,
}

/// A recorded recv.
#[derive(Debug)]
struct Recv {
    number: u32,
    topic: String,
    seq: Option<i64>,
    k: Option<u64>,
    parked: bool,
    name: String,
}

/// A workflow's mailbox.
#[derive(Debug, Default)]
struct Mailbox {
    status: String,
    messages: Vec<Message>,
    recvs: Vec<Recv>,
}

/// Checks every waiting workflow on every shard against the driver's sends.
///
/// # Errors
///
/// When a shard cannot be read.
pub async fn check(client: &Client, sent: &[Sent]) -> Result<WaitChecks> {
    let mut c = WaitChecks::default();
    let queues = [QUEUE, TORTURE_QUEUE];
    let mut mailboxes: HashMap<u64, Mailbox> = HashMap::new();
    let mut parents = Parents::new();
    let mut children = Vec::new();
    for shard in client.shards().all() {
        let db = shard.client().await?;
        let on = |e| shard.query_error(e);
        let row = db
            .query_one(
                sql::SLEEP_AND_EFFECT_CHECKS,
                &[&waits::HANDLER, &&queues[..]],
            )
            .await
            .map_err(on)?;
        let workflows: i64 = row.get(0);
        c.workflows += workflows;
        c.not_succeeded += workflows - row.get::<_, i64>(1);
        c.sleeps += row.get::<_, i64>(2);
        let early = row.get::<_, i64>(3) + row.get::<_, i64>(4);
        c.early_wakes += early;
        c.effect_steps += row.get::<_, i64>(5);
        c.effects_wrong += row.get::<_, i64>(6);
        c.effect_reruns += row.get::<_, i64>(7);
        c.missing_effect_steps += row.get::<_, i64>(8);
        if early > 0 || row.get::<_, i64>(6) > 0 {
            let limit = EXAMPLES as i64;
            for v in db
                .query(
                    sql::SLEEP_AND_EFFECT_VIOLATIONS,
                    &[&waits::HANDLER, &&queues[..], &limit],
                )
                .await
                .map_err(on)?
            {
                let (key, id, n, what): (i32, i64, i64, String) =
                    (v.get(0), v.get(1), v.get(2), v.get(3));
                c.example(format!("{} workflow {key}-{id} n={n}: {what}", shard.name));
            }
        }
        for r in db
            .query(sql::PARENT_ROWS, &[&waits::HANDLER, &&queues[..]])
            .await
            .map_err(on)?
        {
            let parent = Parent {
                n: r.get::<_, i64>(2) as u64,
                status: r.get(3),
                shard: shard.index,
                results: r.get(4),
                gathered: r.get(5),
                children: BTreeMap::new(),
            };
            parents.insert((r.get(0), r.get(1)), parent);
        }
        let rows = db
            .query(
                sql::CHILD_ROWS,
                &[&waits::CHILD_HANDLER, &waits::CHILD_STEP],
            )
            .await
            .map_err(on)?;
        children.extend(rows.into_iter().map(|r| (shard.index, r)));
        for r in db
            .query(sql::MAIL_ROWS, &[&waits::HANDLER, &&queues[..]])
            .await
            .map_err(on)?
        {
            let n = r.get::<_, i64>(0) as u64;
            let mailbox = mailboxes.entry(n).or_default();
            mailbox.status = r.get(1);
            let value: Option<serde_json::Value> = r.get(7);
            let k = value.as_ref().and_then(|v| v["k"].as_u64());
            let topic: String = r.get::<_, Option<String>>(3).unwrap_or_default();
            if r.get::<_, &str>(2) == "m" {
                mailbox.messages.push(Message {
                    topic,
                    seq: r.get::<_, Option<i64>>(4).unwrap_or(-1),
                    key: r.get(5),
                    received_by: r.get(6),
                    k,
                });
            } else {
                let name: String = r.get(6);
                let number = name.rsplit(':').next().and_then(|s| s.parse().ok());
                mailbox.recvs.push(Recv {
                    number: number.unwrap_or(0),
                    topic,
                    seq: r.get(4),
                    k,
                    parked: r.get::<_, Option<bool>>(8).unwrap_or(false),
                    name,
                });
            }
        }
    }
    check_children(&mut c, &mut parents, &children);
    check_mail(&mut c, &mut mailboxes, sent);
    Ok(c)
}

/// Per child row (its shard's index and the row), wherever its key put
/// it: its parent is a waiting workflow, it succeeded with its effect step
/// recorded once and one effect of the run that recorded it (a run parked,
/// killed or retried before the record may leave others), its value the
/// expected one,
/// recorded as the parent's result of it and gathered; a succeeded parent
/// has each of its [`waits::children`] once.
fn check_children(
    c: &mut WaitChecks,
    parents: &mut Parents,
    rows: &[(usize, shardq::tokio_postgres::Row)],
) {
    for (shard, r) in rows {
        let (parent_key, parent_id): (Option<i32>, Option<i64>) = (r.get(0), r.get(1));
        let i: Option<i64> = r.get(3);
        let child_id: i64 = r.get(9);
        let Some(parent) = parent_key
            .zip(parent_id)
            .and_then(|key| parents.get_mut(&key))
        else {
            c.children_wrong += 1;
            c.example(format!(
                "shard {shard} child {child_id}: its parent {parent_key:?}-{parent_id:?} is no waiting workflow"
            ));
            continue;
        };
        let (n, i) = (parent.n, i.unwrap_or(-1));
        *parent.children.entry(i).or_default() += 1;
        c.children += 1;
        if *shard != parent.shard {
            c.children_elsewhere += 1;
        }
        let status: String = r.get(4);
        let attempts: i32 = r.get(5);
        let value: Option<i64> = r.get(6);
        let (effects, recorded): (i64, i64) = (r.get(7), r.get(8));
        let expected = waits::child_value(n, i as u64) as i64;
        let result = parent
            .results
            .as_ref()
            .and_then(|m| m.get(format!("shardq:child:{}:result", i + 1)))
            .and_then(serde_json::Value::as_i64);
        let in_gathered = parent
            .gathered
            .as_ref()
            .and_then(|g| g.get(i as usize))
            .and_then(serde_json::Value::as_i64);
        let wrong = if status != "succeeded" {
            Some(format!("status {status}"))
        } else if recorded != 1 || effects != 1 {
            Some(format!(
                "effect step recorded {recorded} times, {effects} effects of its run (attempt {attempts})"
            ))
        } else if value != Some(expected) {
            Some(format!("output {value:?}, expected {expected}"))
        } else if parent.status == "succeeded"
            && (result != Some(expected) || in_gathered != Some(expected))
        {
            Some(format!(
                "parent recorded {result:?}, gathered {in_gathered:?}, child gave {expected}"
            ))
        } else {
            None
        };
        if let Some(what) = wrong {
            c.children_wrong += 1;
            c.example(format!(
                "n={n} child {i} (id {child_id}, shard {shard}): {what}"
            ));
        }
    }
    for parent in parents.values() {
        let n = parent.n;
        let expected = waits::children(n);
        let doubled = parent.children.values().filter(|&&k| k > 1).count();
        let distinct = (0..expected as i64)
            .filter(|i| parent.children.contains_key(i))
            .count() as u64;
        let all_there = distinct == expected && parent.children.len() as u64 == expected;
        if doubled > 0 || (parent.status == "succeeded" && !all_there) {
            c.children_wrong += 1;
            c.example(format!(
                "n={n} ({}): children per index {:?}, expected each of 0..{expected} once",
                parent.status, parent.children
            ));
        }
    }
}

/// The mailbox invariants, per workflow and topic, against the driver's sends.
fn check_mail(c: &mut WaitChecks, mailboxes: &mut HashMap<u64, Mailbox>, sent: &[Sent]) {
    for s in sent {
        let key = mail::key(s.n, s.topic, s.k);
        let mailbox = mailboxes.get(&s.n);
        let stored =
            mailbox.is_some_and(|m| m.messages.iter().any(|x| x.key.as_ref() == Some(&key)));
        let timed_out = mailbox.is_some_and(|m| {
            m.recvs
                .iter()
                .any(|r| r.topic == s.topic && r.seq.is_none())
        });
        match s.outcome {
            Outcome::Stored => {
                c.stored += 1;
                if !stored {
                    c.mail_wrong += 1;
                    c.example(format!("n={} message {key}: stored, then not found", s.n));
                }
            }
            Outcome::Refused if stored || timed_out => c.refused += 1,
            Outcome::Refused => {
                c.mail_wrong += 1;
                c.example(format!(
                    "n={} message {key}: refused, but no recv of its topic timed out",
                    s.n
                ));
            }
            Outcome::Unsure => {}
        }
    }
    for (n, mailbox) in mailboxes.iter_mut() {
        mailbox.recvs.sort_by_key(|r| r.number);
        for topic in TOPICS {
            check_topic(c, *n, mailbox, topic.name);
        }
        check_kids(c, *n, mailbox);
    }
}

/// One topic of one mailbox: each message received once, by the recv that
/// recorded it, in send order; unreceived ones only as many as timeouts.
fn check_topic(c: &mut WaitChecks, n: u64, mailbox: &Mailbox, topic: &str) {
    let messages: Vec<&Message> = mailbox
        .messages
        .iter()
        .filter(|m| m.topic == topic)
        .collect();
    let recvs: Vec<&Recv> = mailbox.recvs.iter().filter(|r| r.topic == topic).collect();
    let mut wrong = Vec::new();
    let mut last_k = None;
    let mut timed_out = 0u64;
    for r in &recvs {
        let Some(seq) = r.seq else {
            timed_out += 1;
            continue;
        };
        c.received += 1;
        if r.parked {
            c.received_after_park += 1;
        } else {
            c.received_waiting += 1;
        }
        match messages.iter().find(|m| m.seq == seq) {
            Some(m) if m.received_by.as_deref() == Some(r.name.as_str()) && m.k == r.k => {}
            found => wrong.push(format!("{} took seq {seq}, whose row is {found:?}", r.name)),
        }
        if r.k <= last_k {
            wrong.push(format!("{} took k={:?} after k={last_k:?}", r.name, r.k));
        }
        last_k = r.k;
    }
    c.timed_out += timed_out;
    let unreceived: Vec<&&Message> = messages
        .iter()
        .filter(|m| m.received_by.is_none())
        .collect();
    for m in messages.iter().filter(|m| m.received_by.is_some()) {
        if !recvs
            .iter()
            .any(|r| Some(&r.name) == m.received_by.as_ref())
        {
            wrong.push(format!(
                "seq {} received by {:?}, which recorded no such message",
                m.seq, m.received_by
            ));
        }
        if let Some(older) = unreceived.iter().find(|u| u.seq < m.seq) {
            wrong.push(format!(
                "seq {} left unreceived, a later seq {} received",
                older.seq, m.seq
            ));
        }
    }
    if unreceived.len() as u64 > timed_out {
        wrong.push(format!(
            "{} unreceived, {timed_out} timed out",
            unreceived.len()
        ));
    } else {
        c.unreceived += unreceived.len() as u64;
    }
    if !wrong.is_empty() {
        c.mail_wrong += wrong.len() as u64;
        c.example(format!(
            "n={n} ({}) topic {topic}: {}",
            mailbox.status,
            wrong.join("; ")
        ));
    }
}

/// The children's messages to workflow `n` ([`KIDS_TOPIC`]): a succeeded
/// workflow received one from each of its children (each index once),
/// each taken by the recv that recorded it, in the order stored, none
/// timed out; no child's message was stored twice.
fn check_kids(c: &mut WaitChecks, n: u64, mailbox: &Mailbox) {
    let messages: Vec<&Message> = mailbox
        .messages
        .iter()
        .filter(|m| m.topic == KIDS_TOPIC)
        .collect();
    let recvs: Vec<&Recv> = mailbox
        .recvs
        .iter()
        .filter(|r| r.topic == KIDS_TOPIC)
        .collect();
    let mut wrong = Vec::new();
    let mut senders: BTreeMap<Option<u64>, u64> = BTreeMap::new();
    for m in &messages {
        *senders.entry(m.k).or_default() += 1;
    }
    if senders.values().any(|&count| count > 1) {
        wrong.push(format!("messages per child {senders:?}"));
    }
    let mut last_seq = None;
    for r in &recvs {
        let Some(seq) = r.seq else {
            wrong.push(format!("{} timed out", r.name));
            continue;
        };
        c.kid_messages += 1;
        match messages.iter().find(|m| m.seq == seq) {
            Some(m) if m.received_by.as_deref() == Some(r.name.as_str()) && m.k == r.k => {}
            found => wrong.push(format!("{} took seq {seq}, whose row is {found:?}", r.name)),
        }
        if Some(seq) <= last_seq {
            wrong.push(format!("{} took seq {seq} after {last_seq:?}", r.name));
        }
        last_seq = Some(seq);
    }
    let expected = waits::children(n);
    if mailbox.status == "succeeded"
        && (messages.len() as u64 != expected || recvs.len() as u64 != expected)
    {
        wrong.push(format!(
            "{} messages and {} recvs, expected {expected} of each",
            messages.len(),
            recvs.len()
        ));
    }
    if !wrong.is_empty() {
        c.kid_messages_wrong += wrong.len() as u64;
        c.example(format!(
            "n={n} ({}) topic {KIDS_TOPIC}: {}",
            mailbox.status,
            wrong.join("; ")
        ));
    }
}
