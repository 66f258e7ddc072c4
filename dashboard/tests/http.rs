//! The dashboard over HTTP (reqwest against a real server on loopback, real
//! PostgreSQL behind it): authentication, CSRF, read-only, keyset paging,
//! the overview's counts, and a shard that hangs.

mod common;

use common::{attrs, loopback, serve, Handlers, Shards};
use reqwest::redirect::Policy;
use reqwest::StatusCode;
use shardq::{Client, Config, NewJob};
use shardq_dashboard::{Auth, DashboardError, DashboardOptions};
use std::collections::BTreeSet;
use std::time::Duration;

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// The page at `path`, whatever its status.
async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    text(
        http()
            .get(format!("http://{addr}{path}"))
            .send()
            .await
            .unwrap(),
    )
    .await
}

async fn text(response: reqwest::Response) -> String {
    response.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_loopback_it_refuses_to_listen_without_authentication() {
    let open = DashboardOptions::new("0.0.0.0:0".parse().unwrap());
    let err = shardq_dashboard::bind(open.clone())
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, DashboardError::Unauthenticated(_)), "{err}");
    assert!(err.to_string().contains("SHARDQ_DASHBOARD_TOKEN"), "{err}");
    let with_auth = DashboardOptions {
        auth: Some(Auth::token("t0ken").unwrap()),
        ..open
    };
    assert!(shardq_dashboard::bind(with_auth).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_the_credentials_are_refused() {
    let shards = Shards::start(1).await;
    let auth = Auth::token("s3cret-token").unwrap();
    let (addr, _stop) = serve(
        shards.client.clone(),
        DashboardOptions {
            auth: Some(auth),
            ..loopback()
        },
    )
    .await;
    let url = format!("http://{addr}/");
    let http = http();
    let none = http.get(&url).send().await.unwrap();
    assert_eq!(none.status(), StatusCode::UNAUTHORIZED);
    let wrong = http
        .get(&url)
        .bearer_auth("s3cret-tokeN")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let jobs = http
        .get(format!("{url}jobs?state=dead"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        jobs.status(),
        StatusCode::UNAUTHORIZED,
        "every page is behind it"
    );
    let right = http
        .get(&url)
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), StatusCode::OK);
    assert!(text(right).await.contains("Overview"));

    let basic = Auth::basic("ops", "pa55").unwrap();
    let (addr, _stop) = serve(
        shards.client.clone(),
        DashboardOptions {
            auth: Some(basic),
            ..loopback()
        },
    )
    .await;
    let url = format!("http://{addr}/");
    let asked = http.get(&url).send().await.unwrap();
    assert_eq!(asked.status(), StatusCode::UNAUTHORIZED);
    assert!(asked.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Basic"));
    let wrong = http
        .get(&url)
        .basic_auth("ops", Some("pa56"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let right = http
        .get(&url)
        .basic_auth("ops", Some("pa55"))
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), StatusCode::OK);

    // Without authentication, only loopback host names are served (DNS rebinding).
    let (addr, _stop) = serve(shards.client.clone(), loopback()).await;
    let rebound = http
        .get(format!("http://{addr}/"))
        .header("host", format!("evil.example:{}", addr.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::MISDIRECTED_REQUEST);
}

/// The CSRF token and cookie a page hands out.
async fn token_and_cookie(http: &reqwest::Client, url: &str) -> (String, String) {
    let page = http.get(url).send().await.unwrap();
    let cookie = page.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let html = text(page).await;
    let token = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a csrf field on the confirm page")
        .to_string();
    (token, cookie)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_without_the_csrf_token_cookie_or_same_origin_is_refused() {
    let shards = Shards::start(2).await;
    let handlers = Handlers::new();
    let (fixture, worker, stop_worker) =
        common::jobs_in_every_state(&shards, &handlers, false).await;
    stop_worker.cancel();
    worker.await.unwrap();
    let id = fixture.dead_on_0;
    let (addr, _stop) = serve(shards.client.clone(), loopback()).await;
    let http = http();
    let action = format!("http://{addr}/jobs/{id}/retry");
    let (token, cookie) = token_and_cookie(&http, &action).await;
    let origin = format!("http://{addr}");

    let post = |form: Vec<(&'static str, String)>, cookie: Option<String>, origin: &str| {
        let mut request = http.post(&action).form(&form).header("origin", origin);
        if let Some(c) = cookie {
            request = request.header("cookie", c);
        }
        request.send()
    };
    let no_token = post(vec![], Some(cookie.clone()), &origin).await.unwrap();
    assert_eq!(no_token.status(), StatusCode::FORBIDDEN);
    let forged = post(
        vec![("csrf", "0".repeat(64))],
        Some(cookie.clone()),
        &origin,
    )
    .await
    .unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    let no_cookie = post(vec![("csrf", token.clone())], None, &origin)
        .await
        .unwrap();
    assert_eq!(no_cookie.status(), StatusCode::FORBIDDEN);
    let other_site = post(
        vec![("csrf", token.clone())],
        Some(cookie.clone()),
        "http://evil.example",
    )
    .await
    .unwrap();
    assert_eq!(other_site.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        shards.status_of(id).await,
        "dead",
        "no refused request retried it"
    );

    let allowed = post(vec![("csrf", token)], Some(cookie), &origin)
        .await
        .unwrap();
    assert_eq!(allowed.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        shards.status_of(id).await,
        "queued",
        "the confirmed retry put it back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_shows_no_actions_and_refuses_their_posts() {
    let shards = Shards::start(2).await;
    let handlers = Handlers::new();
    let (fixture, worker, stop_worker) =
        common::jobs_in_every_state(&shards, &handlers, false).await;
    stop_worker.cancel();
    worker.await.unwrap();
    let id = fixture.dead_on_0;
    let http = http();
    // The token and cookie of a dashboard that allows actions, to show the
    // read-only one refuses even a well-formed request.
    let (addr, _stop) = serve(shards.client.clone(), loopback()).await;
    let (token, _) = token_and_cookie(&http, &format!("http://{addr}/jobs/{id}/retry")).await;

    let (addr, _stop) = serve(
        shards.client.clone(),
        DashboardOptions {
            read_only: true,
            ..loopback()
        },
    )
    .await;
    let page = text(
        http.get(format!("http://{addr}/jobs/{id}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(page.contains("dead"), "{page}");
    assert!(!page.contains("action-retry"), "no retry button: {page}");
    let confirm = http
        .get(format!("http://{addr}/jobs/{id}/retry"))
        .send()
        .await
        .unwrap();
    assert_eq!(confirm.status(), StatusCode::FORBIDDEN);
    let cookie = http
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap()
        .headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let own_token = cookie.split_once('=').unwrap().1.to_string();
    for t in [token, own_token] {
        let post = http
            .post(format!("http://{addr}/jobs/{id}/retry"))
            .form(&[("csrf", t)])
            .header("cookie", &cookie)
            .header("origin", format!("http://{addr}"))
            .send()
            .await
            .unwrap();
        assert_eq!(post.status(), StatusCode::FORBIDDEN);
        assert!(text(post).await.contains("read-only"));
    }
    assert_eq!(shards.status_of(id).await, "dead");
}

/// Follows the "Next page" links from `first`; returns each page's job ids.
async fn walk(http: &reqwest::Client, addr: std::net::SocketAddr, first: &str) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut url = format!("http://{addr}{first}");
    loop {
        let response = http.get(&url).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{url}");
        let html = text(response).await;
        pages.push(attrs(&html, "data-id"));
        let next = html
            .split("id=\"next\" href=\"")
            .nth(1)
            .map(|rest| common::unescape(rest.split('"').next().unwrap()));
        match next {
            Some(path) => url = format!("http://{addr}{path}"),
            None => return pages,
        }
        assert!(pages.len() < 20, "paging does not end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyset_pages_follow_each_other_without_overlap_or_gap() {
    let shards = Shards::start(2).await;
    // 130 ready jobs over both shards, five priorities, two queues: the
    // ready list orders by queue, priority, id on each shard.
    let jobs: Vec<NewJob> = (0..130)
        .map(|i| {
            NewJob::new(
                if i % 3 == 0 { "pa" } else { "pb" },
                "ok",
                serde_json::json!({}),
            )
            .priority(i % 5)
        })
        .collect();
    let ready: BTreeSet<String> = shards
        .client
        .enqueue_many(jobs)
        .await
        .unwrap()
        .iter()
        .map(|id| id.to_string())
        .collect();
    // 70 dead jobs: a worker without their handler; the dead list runs newest first.
    let jobs: Vec<NewJob> = (0..70)
        .map(|_| NewJob::new("dash", "nobody-handles-this", serde_json::json!({})).max_attempts(1))
        .collect();
    let dead: BTreeSet<String> = shards
        .client
        .enqueue_many(jobs)
        .await
        .unwrap()
        .iter()
        .map(|id| id.to_string())
        .collect();
    let (worker, stop) = common::start_worker(&shards, Handlers::new().registry());
    let started = std::time::Instant::now();
    while shards
        .counts()
        .await
        .iter()
        .map(|c| c.get(&("dash".into(), "dead".into())).copied().unwrap_or(0))
        .sum::<i64>()
        < 70
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "jobs did not die in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    worker.await.unwrap();

    let (addr, _stop) = serve(
        shards.client.clone(),
        DashboardOptions {
            page_size: 25,
            ..loopback()
        },
    )
    .await;
    let http = http();
    for (first, expected, pages) in [
        ("/jobs?state=ready", &ready, 6),
        ("/jobs?state=dead", &dead, 3),
    ] {
        let walked = walk(&http, addr, first).await;
        let sizes: Vec<usize> = walked.iter().map(Vec::len).collect();
        assert_eq!(walked.len(), pages, "{first}: pages of {sizes:?}");
        assert!(
            sizes[..pages - 1].iter().all(|&n| n == 25),
            "{first}: full pages but the last: {sizes:?}"
        );
        let all: Vec<&String> = walked.iter().flatten().collect();
        let distinct: BTreeSet<String> = all.iter().map(|s| s.to_string()).collect();
        assert_eq!(all.len(), distinct.len(), "{first}: a job shown twice");
        assert_eq!(&distinct, expected, "{first}: every job shown once");
        assert!(
            !walked[0].contains(&walked[1][0]),
            "{first}: page 2 starts after page 1"
        );
    }
    // One shard only: its jobs, none of the other's.
    let walked = walk(&http, addr, "/jobs?state=dead&shard=s1").await;
    let on_s1: BTreeSet<String> = walked.into_iter().flatten().collect();
    let expected: BTreeSet<String> = dead
        .iter()
        .filter(|id| {
            shards
                .set
                .for_key(id.parse::<shardq::JobId>().unwrap().shard_key)
                .index
                == 1
        })
        .cloned()
        .collect();
    assert_eq!(on_s1, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_sums_each_queue_the_queue_page_shows_each_shard_and_a_hung_shard_holds_neither(
) {
    let shards = Shards::start(2).await;
    let handlers = Handlers::new();
    let (_fixture, worker, stop_worker) =
        common::jobs_in_every_state(&shards, &handlers, true).await;
    // A third shard that accepts connections and never answers.
    let frozen = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let frozen_port = frozen.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = frozen.accept().await {
            held.push(socket);
        }
    });
    let mut urls = shards.urls.clone();
    urls.push(format!(
        "postgres://postgres@127.0.0.1:{frozen_port}/shardq"
    ));
    let config = Config::from_toml(&common::toml(&urls, "")).unwrap();
    let client = Client::new(&config).unwrap();
    let options = DashboardOptions {
        shard_deadline: Duration::from_secs(4),
        ..loopback()
    };
    let (addr, _stop) = serve(client, options).await;
    let page = tokio::time::timeout(Duration::from_secs(20), async { get(addr, "/").await })
        .await
        .expect("the page came despite the frozen shard");

    assert!(page.contains("data-shard=\"s2\""), "{page}");
    assert!(
        page.contains("data-state=\"unreachable\""),
        "the frozen shard is marked: {page}"
    );
    assert_eq!(
        page.matches("data-state=\"up\"").count(),
        0,
        "only sick shards are rows: {page}"
    );
    assert!(page.contains("2 of 3 shards answered"), "{page}");
    assert!(page.contains("Totals leave out s2"), "{page}");
    let expected = shards.counts().await;
    let states = [
        "ready",
        "scheduled",
        "running",
        "retrying",
        "dead",
        "cancelled",
    ];
    for queue in ["dash", "idle"] {
        // The overview: one row per queue, the two answering shards summed.
        for state in states {
            let want: i64 = expected
                .iter()
                .map(|c| {
                    c.get(&(queue.to_string(), state.to_string()))
                        .copied()
                        .unwrap_or(0)
                })
                .sum();
            let cell = format!("data-queue=\"{queue}\" data-state=\"{state}\">");
            assert_eq!(
                cell_value(&page, &cell),
                want,
                "{queue} {state} over the shards"
            );
        }
        // The queue's page: its row on each shard.
        let queue_page = tokio::time::timeout(Duration::from_secs(20), async {
            get(addr, &format!("/queues/{queue}")).await
        })
        .await
        .expect("the queue page came despite the frozen shard");
        assert!(queue_page.contains("No answer from s2"), "{queue_page}");
        for (s, counts) in expected.iter().enumerate() {
            for state in states {
                let want = counts
                    .get(&(queue.to_string(), state.to_string()))
                    .copied()
                    .unwrap_or(0);
                let cell =
                    format!("data-shard=\"s{s}\" data-queue=\"{queue}\" data-state=\"{state}\">");
                assert_eq!(cell_value(&queue_page, &cell), want, "s{s} {queue} {state}");
            }
        }
    }
    // The shards page: the frozen shard on top, each shard's jobs over
    // its queues.
    let shards_page = tokio::time::timeout(Duration::from_secs(20), async {
        get(addr, "/shards").await
    })
    .await
    .expect("the shards page came despite the frozen shard");
    let table = &shards_page[shards_page.find("id=\"shard-rows\"").expect("the table")..];
    let first_row = table.split("<tr data-shard=").nth(1).unwrap();
    assert!(
        first_row.starts_with("\"s2\"") && first_row.contains("no answer"),
        "the shard that did not answer comes first: {table}"
    );
    for (s, counts) in expected.iter().enumerate() {
        for state in states {
            let want: i64 = ["dash", "idle"]
                .iter()
                .map(|q| {
                    counts
                        .get(&(q.to_string(), state.to_string()))
                        .copied()
                        .unwrap_or(0)
                })
                .sum();
            let cell = format!("data-shard=\"s{s}\" data-state=\"{state}\">");
            assert_eq!(
                cell_value(table, &cell),
                want,
                "s{s} {state} on the shards page"
            );
        }
    }
    // The running worker's heartbeat: one live worker row per shard.
    assert_eq!(page.matches("data-worker=").count(), 2, "{page}");
    handlers.release.add_permits(1);
    stop_worker.cancel();
    worker.await.unwrap();
}

/// The number in the count cell that starts with `cell` in `page`.
fn cell_value(page: &str, cell: &str) -> i64 {
    let shown = page
        .split(cell)
        .nth(1)
        .unwrap_or_else(|| panic!("no cell {cell}: {page}"));
    number_in(shown.split("</td>").next().unwrap())
}

/// The number in a count cell (`<a …>3</a>` or `<span …>0</span>`).
fn number_in(cell: &str) -> i64 {
    let mut inside = false;
    let mut out = String::new();
    for c in cell.chars() {
        match c {
            '<' => inside = true,
            '>' => inside = false,
            c if !inside && c.is_ascii_digit() => out.push(c),
            _ => {}
        }
    }
    out.parse()
        .unwrap_or_else(|_| panic!("no number in {cell}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_is_paused_and_resumed_on_every_shard_through_confirmed_forms() {
    let shards = Shards::start(2).await;
    shards
        .client
        .enqueue_many(
            (0..10)
                .map(|_| NewJob::new("mail", "ok", serde_json::json!({})))
                .collect(),
        )
        .await
        .unwrap();
    let (addr, _stop) = serve(shards.client.clone(), loopback()).await;
    let http = http();
    let overview = text(http.get(format!("http://{addr}/")).send().await.unwrap()).await;
    assert!(overview.contains("id=\"pause-mail\""), "{overview}");
    for (action, paused_on) in [
        ("pause", vec!["s0".to_string(), "s1".to_string()]),
        ("resume", vec![]),
    ] {
        let confirm = format!("http://{addr}/queues/mail/{action}");
        let (token, cookie) = token_and_cookie(&http, &confirm).await;
        assert!(
            shards.client.paused_queues().await.unwrap().len() == usize::from(action == "resume"),
            "the confirm page changed nothing"
        );
        let done = http
            .post(&confirm)
            .form(&[("csrf", token)])
            .header("cookie", cookie)
            .header("origin", format!("http://{addr}"))
            .send()
            .await
            .unwrap();
        assert_eq!(done.status(), StatusCode::SEE_OTHER);
        let paused = shards.client.paused_queues().await.unwrap();
        assert_eq!(
            paused
                .iter()
                .flat_map(|p| p.shards.clone())
                .collect::<Vec<_>>(),
            paused_on
        );
        let overview = text(http.get(format!("http://{addr}/")).send().await.unwrap()).await;
        let other = if action == "pause" { "resume" } else { "pause" };
        assert!(
            overview.contains(&format!("id=\"{other}-mail\"")),
            "{overview}"
        );
        assert_eq!(
            overview.contains("paused on s0, s1"),
            action == "pause",
            "{overview}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_lists_the_limited_queues() {
    let shards = Shards::start(2).await;
    let (addr, _stop) = serve(shards.client.clone(), loopback()).await;
    let url = format!("http://{addr}/");
    let page = text(http().get(&url).send().await.unwrap()).await;
    assert!(page.contains("No queue is limited"), "{page}");
    let limits = shardq::client::QueueLimits {
        concurrency: Some(7),
        rate: Some(shardq::client::StartRate {
            count: 30,
            per: Duration::from_secs(60),
        }),
        group_concurrency: Some(2),
        group_rate: None,
    };
    shards
        .client
        .set_queue_limits("mail", limits)
        .await
        .unwrap();
    let page = text(http().get(&url).send().await.unwrap()).await;
    let table = &page[page.find("id=\"limits\"").expect("a limits table")..];
    let row = &table[table.find("data-queue=\"mail\"").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains("<td>7</td>") && row.contains("30 per 60s") && row.contains("2 at once"),
        "{row}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_limits_are_set_and_lifted_through_the_form() {
    let shards = Shards::start(2).await;
    shards
        .client
        .enqueue_many(vec![NewJob::new("mail", "ok", serde_json::json!({}))])
        .await
        .unwrap();
    let (addr, _stop) = serve(shards.client.clone(), loopback()).await;
    let http = http();
    let overview = text(http.get(format!("http://{addr}/")).send().await.unwrap()).await;
    assert!(overview.contains("id=\"limit-mail\""), "{overview}");
    let form = format!("http://{addr}/limits/mail");
    for (fields, want) in [
        (
            [
                ("concurrency", "4"),
                ("rate", "90"),
                ("per", "minute"),
                ("group_concurrency", "2"),
                ("group_rate", "5"),
            ],
            Some((Some(4), Some((90, 60)), Some(2), Some((5, 1)))),
        ),
        (
            [
                ("concurrency", ""),
                ("rate", "3"),
                ("per", "second"),
                ("group_concurrency", ""),
                ("group_rate", ""),
            ],
            Some((None, Some((3, 1)), None, None)),
        ),
        (
            [
                ("concurrency", ""),
                ("rate", ""),
                ("per", "second"),
                ("group_concurrency", ""),
                ("group_rate", ""),
            ],
            None,
        ),
    ] {
        let (token, cookie) = token_and_cookie(&http, &form).await;
        let mut body: Vec<(&str, String)> =
            fields.iter().map(|(k, v)| (*k, v.to_string())).collect();
        body.push(("csrf", token));
        let done = http
            .post(&form)
            .form(&body)
            .header("cookie", cookie)
            .header("origin", format!("http://{addr}"))
            .send()
            .await
            .unwrap();
        assert_eq!(done.status(), StatusCode::SEE_OTHER, "{fields:?}");
        let got = shards.client.queue_limits().await.unwrap();
        let got = got.first().map(|l| {
            (
                l.limits.concurrency,
                l.limits.rate.map(|r| (r.count, r.per.as_secs())),
                l.limits.group_concurrency,
                l.limits.group_rate.map(|r| (r.count, r.per.as_secs())),
            )
        });
        assert_eq!(got, want, "{fields:?}");
    }
    let (token, cookie) = token_and_cookie(&http, &form).await;
    let bad = http
        .post(&form)
        .form(&[("concurrency", "zero"), ("csrf", token.as_str())])
        .header("cookie", cookie)
        .header("origin", format!("http://{addr}"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert!(text(bad).await.contains("give a whole number"));
}

/// Sixteen shards, three queues: the overview lists each queue once with
/// its totals over every shard (the sums of the shards' own rows), and a
/// queue's page has one row per shard that holds its jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_sixteen_shards_each_queue_is_one_row_with_its_totals() {
    const SHARDS: usize = 16;
    let shards = Shards::start(SHARDS).await;
    let mut jobs: Vec<NewJob> = (0..160)
        .map(|_| NewJob::new("emails", "ok", serde_json::json!({})))
        .collect();
    jobs.extend((0..48).map(|_| {
        NewJob::new("reports", "ok", serde_json::json!({})).delay(Duration::from_secs(3600))
    }));
    jobs.extend(
        (0..32).map(|i| NewJob::new("billing", "ok", serde_json::json!({})).group(format!("t{i}"))),
    );
    shards.client.enqueue_many(jobs).await.unwrap();
    let (addr, _stop) = serve(shards.client.clone(), loopback()).await;
    let page = get(addr, "/").await;
    let table = &page[page.find("id=\"queues\"").expect("the queues table")..];
    let table = &table[..table.find("</table>").unwrap()];
    for (queue, state, want) in [
        ("emails", "ready", 160),
        ("reports", "scheduled", 48),
        ("billing", "ready", 32),
    ] {
        assert_eq!(
            table
                .matches(&format!("<tr data-queue=\"{queue}\""))
                .count(),
            1,
            "{queue} once: {table}"
        );
        let cell = format!("data-queue=\"{queue}\" data-state=\"{state}\">");
        assert_eq!(cell_value(table, &cell), want, "{queue} {state}");
    }
    assert!(
        page.contains(&format!("{SHARDS} of {SHARDS} shards answered")),
        "{page}"
    );
    let expected = shards.counts().await;
    let holding = expected
        .iter()
        .filter(|c| c.keys().any(|(q, _)| q == "emails"))
        .count();
    let queue_page = get(addr, "/queues/emails").await;
    assert_eq!(
        queue_page.matches("<tr data-shard=").count(),
        holding,
        "one row per shard with emails jobs"
    );
    for (s, counts) in expected.iter().enumerate() {
        let want = counts
            .get(&("emails".to_string(), "ready".to_string()))
            .copied()
            .unwrap_or(0);
        if want > 0 {
            let cell = format!("data-shard=\"s{s}\" data-queue=\"emails\" data-state=\"ready\">");
            assert_eq!(cell_value(&queue_page, &cell), want, "s{s}");
        }
    }
}

/// The trend: what finishes after the dashboard starts shows in the
/// overview's chart (every queue) and in the queue's page (that queue),
/// each job counted once however many samples pass, failures apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trend_counts_each_finished_job_once_and_its_failures() {
    let shards = Shards::start(2).await;
    let mut jobs: Vec<NewJob> = (0..30)
        .map(|_| NewJob::new("emails", "ok", serde_json::json!({})))
        .collect();
    jobs.extend((0..6).map(|_| NewJob::new("reports", "ok", serde_json::json!({}))));
    shards.client.enqueue_many(jobs).await.unwrap();
    let mut options = loopback();
    options.trend_interval = Duration::from_millis(100);
    let (addr, _stop) = serve(shards.client.clone(), options).await;
    // Finish the jobs as a worker writes outcomes (emails all succeed, 4
    // reports die) while the samples go on; a first sample covers the 10 s
    // before it, however late it comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for shard in shards.set.all() {
        let db = shard.client().await.unwrap();
        db.batch_execute(
            "UPDATE workflow_status SET status = 'succeeded', finished_at = now() \
                 WHERE queue = 'emails'; \
             UPDATE workflow_status SET status = 'dead', finished_at = now() \
                 WHERE queue = 'reports' AND id IN (SELECT id FROM workflow_status \
                     WHERE queue = 'reports' ORDER BY id LIMIT 2)",
        )
        .await
        .unwrap();
    }
    let dead: i64 = {
        let mut n = 0;
        for shard in shards.set.all() {
            let db = shard.client().await.unwrap();
            n += db
                .query_one(
                    "SELECT count(*) FROM workflow_status WHERE status = 'dead'",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0);
        }
        n
    };
    let attr = |page: &str, name: &str| -> i64 {
        let at = page.find(&format!("{name}=\"")).expect(name) + name.len() + 2;
        page[at..].split('"').next().unwrap().parse().unwrap()
    };
    let mut page = String::new();
    // The trend reads spans ending 5 s back (completions still committing).
    for _ in 0..300 {
        page = get(addr, "/").await;
        if attr(&page, "data-done") == 30 + dead {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(attr(&page, "data-done"), 30 + dead, "every queue's trend");
    assert_eq!(attr(&page, "data-failed"), dead);
    // Each queue's row: how many per second ended dead or failed lately.
    let failed_rate = |queue: &str| -> f64 {
        let row = &page[page
            .find(&format!("<tr data-queue=\"{queue}\""))
            .expect(queue)..];
        let at = row.find("data-failed-rate=\"").expect("the rate") + 18;
        row[at..].split('"').next().unwrap().parse().unwrap()
    };
    assert!(failed_rate("reports") > 0.0, "{page}");
    assert_eq!(failed_rate("emails"), 0.0);
    // More samples pass: still each job once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = get(addr, "/").await;
    assert_eq!(attr(&later, "data-done"), 30 + dead);
    assert!(attr(&later, "data-samples") > attr(&page, "data-samples"));
    let queue_page = get(addr, "/queues/reports").await;
    assert_eq!(
        (
            attr(&queue_page, "data-done"),
            attr(&queue_page, "data-failed")
        ),
        (dead, dead),
        "the reports queue's own trend"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shards_page_puts_the_shard_whose_claims_turned_slow_on_top() {
    let shards = Shards::start(2).await;
    // A worker's heartbeat on a shard, as `shardq_workers` holds it:
    // cumulative claims, lock misses and claim time since it started.
    let beat = |shard: usize, claims: i64, busy: i64, claim_us: i64| {
        let db = shards.set.get(shard);
        async move {
            db.client()
                .await
                .unwrap()
                .execute(
                    "INSERT INTO shardq_workers \
                         (worker_id, host, pid, queues, started_at, claims, busy, claim_us) \
                     VALUES ('w', 'h', 1, '{q}', now(), $1, $2, $3) \
                     ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = now(), \
                         claims = EXCLUDED.claims, busy = EXCLUDED.busy, \
                         claim_us = EXCLUDED.claim_us",
                    &[&claims, &busy, &claim_us],
                )
                .await
                .unwrap();
        }
    };
    // Before the dashboard starts: s0's claims were slow (10 ms each), s1's
    // fast (0.1 ms).
    beat(0, 100, 0, 1_000_000).await;
    beat(1, 100, 0, 10_000).await;
    let mut options = loopback();
    options.trend_interval = Duration::from_millis(200);
    let (addr, _stop) = serve(shards.client.clone(), options).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Since then: s0's 100 claims took 10 ms in all, s1's 500 ms, half of
    // them lock misses (`claims` counts those that returned jobs). Since the workers started s0 is still the slower
    // (5.05 ms against 2.6 ms); over the last minute s1 is.
    beat(0, 200, 0, 1_010_000).await;
    beat(1, 150, 50, 510_000).await;
    let row_of = |page: &str, shard: &str| -> String {
        let table = &page[page.find("id=\"shard-rows\"").expect("the table")..];
        let at = table
            .find(&format!("<tr data-shard=\"{shard}\""))
            .expect("its row");
        table[at..].split("</tr>").next().unwrap().to_string()
    };
    let mut page = String::new();
    for _ in 0..100 {
        page = get(addr, "/shards").await;
        if row_of(&page, "s1").contains("5.00 ms") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let slow = row_of(&page, "s1");
    assert!(slow.contains("5.00 ms") && slow.contains("50.0%"), "{slow}");
    let fast = row_of(&page, "s0");
    assert!(fast.contains("0.10 ms") && fast.contains("0.0%"), "{fast}");
    assert!(
        page.find("<tr data-shard=\"s1\"").unwrap() < page.find("<tr data-shard=\"s0\"").unwrap(),
        "the shard whose claims are slow now comes first"
    );
    assert!(slow.contains("aria-label=\"claim time and lock-miss rate\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_page_groups_its_recent_failures_by_error_over_the_shards() {
    let shards = Shards::start(2).await;
    // Per shard: dead and failed jobs of `emails` whose errors differ only
    // in their numbers, another error, one of another queue, one ended two
    // days ago, one that succeeded.
    for (s, timeouts) in [(0usize, 3i64), (1, 2)] {
        let db = shards.set.get(s).client().await.unwrap();
        let shard_key = (0..65_536)
            .find(|k| shardq::router::shard_index(*k, 2) == s)
            .unwrap();
        db.execute(
            "INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at, error) \
             SELECT $1, 'emails', 'ok', CASE WHEN g % 2 = 0 THEN 'dead' ELSE 'failed' END, g, \
                    now() - g * interval '1 second', \
                    'timeout after ' || (30 + g) || ' s talking to 10.0.0.' || g || E'\\nat line ' || g \
             FROM generate_series(1, $2::int8) g",
            &[&shard_key, &timeouts],
        )
        .await
        .unwrap();
        db.batch_execute(&format!(
            "INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at, error) VALUES \
             ({shard_key}, 'emails', 'ok', 'dead', 3, now(), 'invalid payload: no field `to`'), \
             ({shard_key}, 'reports', 'ok', 'dead', 3, now(), 'timeout after 1 s talking to 10.0.0.1'), \
             ({shard_key}, 'emails', 'ok', 'dead', 3, now() - interval '2 days', 'timeout after 1 s talking to 10.0.0.1'), \
             ({shard_key}, 'emails', 'ok', 'succeeded', 1, now(), NULL)"
        ))
        .await
        .unwrap();
    }
    let (addr, _stop) = serve(shards.client.clone(), loopback()).await;
    let page = get(addr, "/queues/emails").await;
    let table = &page[page.find("id=\"failures\"").expect("the failures")..];
    let table = table.split("</table>").next().unwrap();
    let rows: Vec<&str> = table.split("<tr data-error=").skip(1).collect();
    assert_eq!(rows.len(), 2, "two errors: {table}");
    assert!(
        rows[0].starts_with("\"timeout after N s talking to N.N.N.N\"")
            && rows[0].contains("<td class=\"count\">5</td>"),
        "the timeouts of both shards in one row, the old one left out: {table}"
    );
    assert!(
        rows[0].contains(">timeout after 31 s talking to 10.0.0.1<"),
        "the newest one's first line: {table}"
    );
    assert!(
        rows[1].contains("<td class=\"count\">2</td>") && rows[1].contains("invalid payload"),
        "{table}"
    );
    assert!(rows[0].contains("href=\"/jobs/"), "{table}");
}

/// The shards page shows the wakes a shard's finished children owe
/// parents on other shards: two on s0, owed to s1, with the destination
/// and the oldest's age in the cell's title; none on s1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shards_page_shows_the_wakes_owed_to_other_shards() {
    let shards = Shards::start(2).await;
    let key_on = |index: usize| {
        (0..)
            .map(|i| shardq::router::shard_key_for(&format!("k-{i}")))
            .find(|&k| shards.set.for_key(k).index == index)
            .unwrap()
    };
    let (child_key, parent_key) = (key_on(0), key_on(1));
    shards
        .set
        .get(0)
        .client()
        .await
        .unwrap()
        .execute(
            "INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at, \
                parent_shard_key, parent_id, parent_wake) \
             SELECT $1, 'idle', 'x', 'succeeded', now() - interval '90 seconds', $2, g, true \
             FROM generate_series(1, 2) g",
            &[&child_key, &parent_key],
        )
        .await
        .unwrap();
    let (addr, _stop) = serve(shards.client.clone(), loopback()).await;
    let page = get(addr, "/shards").await;
    let row = |shard: &str| {
        let start = page
            .find(&format!("<tr data-shard=\"{shard}\""))
            .expect("the shard's row");
        let row = &page[start..];
        row[..row.find("</tr>").unwrap()].to_string()
    };
    let s0 = row("s0");
    assert!(s0.contains("data-owed=\"2\""), "{s0}");
    assert!(s0.contains("2 to s1, oldest"), "{s0}");
    assert!(row("s1").contains("data-owed=\"0\""), "{}", row("s1"));
}
