//! Property tests (fuzzing) of the config parser and the payload path: no
//! input makes them panic, and every rejection says what to fix. Cases found
//! by fuzzing are kept below as plain tests.

use proptest::prelude::*;
use shardq::config::Config;
use shardq::job::EnqueueLimits;
use shardq::NewJob;

/// A password the generators put in URLs; no error may repeat it.
const SECRET: &str = "Zq9secretPw";

const KEYS: &[&str] = &[
    "name",
    "url",
    "host",
    "port",
    "dbname",
    "user",
    "pool_size",
    "mode",
    "slots_per_shard",
    "batch_size",
    "queues",
    "concurrency",
    "bogus",
];
const SECTIONS: &[&str] = &[
    "[[shards]]",
    "[dequeue]",
    "[worker]",
    "[local]",
    "[limits]",
    "[nope]",
];

fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        "[a-z:/@.0-9]{0,30}".prop_map(|s| format!("{s:?}")),
        Just("[]".to_string()),
        Just("[\"a\", \"a\"]".to_string()),
        Just("true".to_string()),
        Just(format!("{:?}", format!("postgres://u:{SECRET}@h:5432/db"))),
    ]
}

fn toml_document() -> impl Strategy<Value = String> {
    prop::collection::vec(
        (
            prop::sample::select(SECTIONS),
            prop::collection::vec((prop::sample::select(KEYS), toml_value()), 0..5),
        ),
        0..5,
    )
    .prop_map(|sections| {
        sections
            .into_iter()
            .map(|(header, pairs)| {
                let body: String = pairs
                    .into_iter()
                    .map(|(k, v)| format!("{k} = {v}\n"))
                    .collect();
                format!("{header}\n{body}")
            })
            .collect()
    })
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        ".{0,20}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::from),
            prop::collection::hash_map(".{0,8}", inner, 0..8)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn limits(max: usize) -> EnqueueLimits {
    EnqueueLimits {
        max_payload_bytes: max,
        default_max_attempts: 20,
    }
}

fn contains_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(a) => a.iter().any(contains_nul),
        serde_json::Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_config_parser_never_panics_and_errors_are_explained(doc in toml_document()) {
        if let Err(e) = Config::from_toml(&doc) {
            let text = shardq::error_chain(&e);
            prop_assert!(!text.is_empty());
            prop_assert!(!text.contains(SECRET), "a password leaked into: {text}");
        }
    }

    #[test]
    fn arbitrary_text_never_panics_the_config_parser(doc in ".{0,200}") {
        let _ = Config::from_toml(&doc);
    }

    #[test]
    fn the_payload_check_accepts_exactly_what_postgres_can_store(payload in json_value(), max in 1usize..400) {
        let job = NewJob::new("q", "noop", payload.clone());
        let verdict = job.validate(&limits(max));
        let fits = payload.to_string().len() <= max;
        prop_assert_eq!(verdict.is_ok(), fits && !contains_nul(&payload), "{:?}", verdict);
    }
}

/// Found by fuzzing: a password must not be echoed when the URL is broken.
#[test]
fn a_broken_url_with_a_password_does_not_echo_it() {
    let e =
        Config::from_toml("[[shards]]\nname = \"a\"\nurl = \"postgres://u:pw@h:notaport/db\"\n")
            .unwrap_err();
    assert!(!shardq::error_chain(&e).contains("pw@"));
}

/// Found by fuzzing: an escaped backslash-u sequence is text, not a NUL.
#[test]
fn a_literal_backslash_u0000_is_accepted() {
    let job = NewJob::new("q", "noop", serde_json::json!({ "s": "\\u0000" }));
    assert!(job.validate(&limits(100)).is_ok());
}

/// Found by fuzzing: a TOML error quotes the offending line, which may hold a
/// password in a URL; the error must not repeat it.
#[test]
fn a_toml_error_on_a_line_with_a_password_does_not_echo_it() {
    let doc = "[[shards]]\nqueues = 0\nqueues = \"postgres://u:pw@h:5432/db\"\n";
    let e = Config::from_toml(doc).unwrap_err();
    let text = shardq::error_chain(&e);
    assert!(text.contains("duplicate key"), "{text}");
    assert!(!text.contains("pw@"), "{text}");
}

/// Found by fuzzing: an invalid value is echoed in the error; when that value
/// is a URL with a password, the password must not be.
#[test]
fn an_invalid_mode_holding_a_url_does_not_echo_its_password() {
    let doc = format!("[dequeue]\nmode = \"postgres://u:{SECRET}@h:5432/db\"\n");
    let text = shardq::error_chain(&Config::from_toml(&doc).unwrap_err());
    assert!(text.contains("dequeue.mode"), "{text}");
    assert!(!text.contains(SECRET), "{text}");
}

/// Found by fuzzing: a shard's name is echoed in its errors (and logs); a URL
/// pasted into the name must not show its password.
#[test]
fn a_shard_name_holding_a_url_does_not_echo_its_password() {
    let doc = format!("[[shards]]\nname = \"postgres://u:{SECRET}@h:5432/db\"\n");
    let text = shardq::error_chain(&Config::from_toml(&doc).unwrap_err());
    assert!(text.contains("give either `url` or `host`"), "{text}");
    assert!(!text.contains(SECRET), "{text}");
}
