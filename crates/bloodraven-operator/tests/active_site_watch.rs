//! Following the primary without polling, on real MariaDB servers with the operator
//! in-process: `/active-site?watch=true` streams the current view, then each announced one
//! (server-sent events), and `?after=N` answers once the generation is past `N`.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{GROUP, Live, Timings, request_failover};
use tokio::time::Instant;

/// Reads server-sent events from `resp` until one carries a view, returning it.
async fn next_view(resp: &mut reqwest::Response, buf: &mut String) -> Value {
    loop {
        while let Some(data) = bloodraven_testkit::sse::take_event_data(buf) {
            if !data.is_empty() {
                return serde_json::from_str(&data).unwrap();
            }
        }
        let chunk = tokio::time::timeout(Duration::from_secs(30), resp.chunk())
            .await
            .expect("an event within 30 s")
            .unwrap()
            .expect("the stream stays open");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_sees_each_announcement_and_a_long_poll_answers_after_it() {
    let live = Live::start(Timings::default()).await;
    let op = support::replicating(&live).await;
    let base = format!("http://{}", op.http_addr);
    let http = reqwest::Client::new();
    let mut resp = http
        .get(format!("{base}/active-site?group={GROUP}&watch=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut buf = String::new();
    let first = next_view(&mut resp, &mut buf).await;
    assert_eq!(
        (
            first["activeSite"].as_str(),
            first["topologyGeneration"].as_u64()
        ),
        (Some("iad"), Some(1))
    );

    // A long poll past the current generation waits for the next announcement.
    let poll = tokio::spawn({
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http
                .get(format!("{base}/active-site?group={GROUP}&after=1"))
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap(), Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!poll.is_finished(), "nothing newer yet");

    request_failover(&op, "pdx").await;
    let next = next_view(&mut resp, &mut buf).await;
    let seen = Instant::now();
    assert_eq!(
        (
            next["activeSite"].as_str(),
            next["topologyGeneration"].as_u64()
        ),
        (Some("pdx"), Some(2))
    );
    let (code, body, answered) = poll.await.unwrap();
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["topologyGeneration"], 2);
    assert!(
        answered.max(seen) - answered.min(seen) < Duration::from_secs(5),
        "the long poll answered with the announcement"
    );
    // Already past: answered at once.
    let r = support::plain_get(&op, &format!("/active-site?group={GROUP}&after=0")).await;
    assert_eq!(r.status(), 200);
    // Bad input names the parameter.
    let r = support::plain_get(&op, &format!("/active-site?group={GROUP}&after=soon")).await;
    assert_eq!(r.status(), 400);
    op.stop().await;
}
