//! Status writes of an idle group in Kubernetes mode: the operator, on real MariaDB servers,
//! keeps a three-site group on the test kit's fake API server; once the group has settled,
//! every write to the group's status subresource is counted for a while. Reported as writes
//! per minute, with the poll count of the same window.
//!
//! Run: `cargo bench -p bloodraven-operator --bench status_writes -- [SECONDS] [POLL]`
//! (default 60 seconds at `pollInterval` 2s, the spec's default).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::kube::{active_and_followed, group_in_cluster};
use support::{GROUP, Timings};
use tokio::time::Instant;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let seconds: u64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(60);
    let poll: &'static str = args
        .iter()
        .find(|a| a.ends_with('s') && a.parse::<u64>().is_err())
        .map_or("2s", |p| String::leak(p.clone()));
    let timings = Timings {
        poll,
        ..Timings::default()
    };
    let (_live, c, op) = group_in_cluster(timings).await;
    c.wait(GROUP, Duration::from_secs(60), "bootstrap", |g| {
        active_and_followed(g, "iad")
    })
    .await;
    // Settled: the bootstrap's writes are done.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = Instant::now();
    let before = c.status_writes();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let writes = c.status_writes() - before;
    let took = started.elapsed().as_secs_f64();
    let poll_seconds = bloodraven_core::duration::parse_duration(poll)
        .unwrap()
        .as_secs_f64();
    bloodraven_testkit::figure!(
        "idle group, pollInterval {poll}: {writes} status writes in {took:.0} s ({:.1} per minute; {:.0} polls)",
        f64::from(u32::try_from(writes).unwrap_or(u32::MAX)) * 60.0 / took,
        took / poll_seconds
    );
    op.stop().await;
}
