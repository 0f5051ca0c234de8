//! Test support for the release stories: the fake API server and a releaser wired to it.

#![allow(dead_code)] // each test binary uses a different part

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::release::{RELEASE_ANNOTATION, ReleaseAction};
use bloodraven_core::time::{ManualClock, Timestamp};
use bloodraven_deploy::record::{RecordLine, read_record};
use bloodraven_release::cluster;
use bloodraven_release::{ApplyReport, Releaser, Timeouts};
use k8s_openapi::api::apps::v1::Deployment;

/// The wall-clock instant every story starts at.
pub fn start_time() -> Timestamp {
    Timestamp::parse_rfc3339("2026-11-30T10:00:00Z").expect("fixed time")
}

/// Bounds small enough for tests: polls every 20 ms, gives up after `bound`.
pub fn timeouts(bound: Duration) -> Timeouts {
    Timeouts {
        apply_bound: bound,
        poll_interval: Duration::from_millis(20),
    }
}

/// A releaser talking to `url` through the production client builder (retries off).
pub fn releaser(url: &str, clock: &ManualClock, records: &Path, timeouts: Timeouts) -> Releaser {
    let config = kube::Config::new(url.parse().expect("fake URL"));
    let cluster = cluster::from_config(config).expect("client");
    Releaser::new(
        cluster.client,
        cluster.endpoint,
        Arc::new(clock.clone()),
        records.to_owned(),
        timeouts,
    )
}

/// The steps of a record file, in order.
pub fn steps(path: &Path) -> Vec<String> {
    read_record(path)
        .expect("record")
        .into_iter()
        .map(|l| l.step)
        .collect()
}

pub fn lines(path: &Path) -> Vec<RecordLine> {
    read_record(path).expect("record")
}

/// An image change of the container `app`.
pub fn image(img: &str) -> ReleaseAction {
    ReleaseAction::Image {
        container: "app".into(),
        image: img.into(),
    }
}

/// The image of the first container of `d`'s Pod template.
pub fn app_image(d: &Deployment) -> String {
    d.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .clone()
        .unwrap()
}

/// The release annotation on `d`'s Pod template.
pub fn template_annotation(d: &Deployment) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(RELEASE_ANNOTATION)
        .cloned()
}

/// An observer that shows nothing.
pub fn quiet() -> impl FnMut(&RecordLine) + Send {
    |_: &RecordLine| {}
}

/// Asserts the outcome of `report` by its name (`ready`, `failed`, ...).
pub fn assert_outcome(report: &ApplyReport, name: &str) {
    assert_eq!(report.outcome.name(), name, "{:?}", report.outcome);
}
