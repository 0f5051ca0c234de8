//! Signed topology against a real MariaDB server, a fake operator and a fake peer over HTTP:
//! forged relayed views (another key, an altered field, a replayed older view) change nothing;
//! a genuine relayed view fences by rule #1; the group's spec.sidecar timings, carried in the
//! signed view, replace the flags' unless they are pinned.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use bloodraven_core::contract::logs;
use bloodraven_core::time::Timestamp;
use bloodraven_core::wire::ActiveSite;
use bloodraven_launch::mysql::Launcher;
use bloodraven_runtime::topology::{SigningKey, Verifier};
use bloodraven_sidecar::trust::Trust;
use serde_json::Value;
use support::{
    FakeParty, Mode, at, free_port, local, msg, records, sidecar_for, status, view, wait_until,
};
use tokio::time::sleep;

const TICK: Duration = Duration::from_secs(1);

struct Keys {
    _dir: tempfile::TempDir,
    operator: SigningKey,
    stranger: SigningKey,
    public: PathBuf,
}

impl Keys {
    /// Trust in the operator's public key, with the spec's timings pinned or not.
    fn trust(&self, pin_timings: bool) -> Trust {
        Trust {
            verifier: Some(Verifier::load(std::slice::from_ref(&self.public)).unwrap()),
            pin_timings,
        }
    }
}

fn keys() -> Keys {
    let dir = tempfile::tempdir().unwrap();
    let public = dir.path().join("operator.pub");
    let operator = SigningKey::generate(&dir.path().join("operator.key"), &public).unwrap();
    let stranger = SigningKey::generate(
        &dir.path().join("stranger.key"),
        &dir.path().join("stranger.pub"),
    )
    .unwrap();
    Keys {
        _dir: dir,
        operator,
        stranger,
        public,
    }
}

/// A view of group playground/default carrying timings (4 s lease, 1 s tick), signed by `key`.
fn signed(key: &SigningKey, site: &str, generation: u64, observed_at: Timestamp) -> ActiveSite {
    let mut v = view(site, generation, observed_at);
    v.group = "playground".into();
    v.namespace = "default".into();
    v.lease_timeout_seconds = Some(4);
    v.peer_check_interval_seconds = Some(1);
    key.sign(&mut v);
    v
}

async fn fenced(h: &Launcher) -> bool {
    h.admin(0).unwrap().is_fenced().await.unwrap_or(false)
}

fn refusals(captured: &bloodraven_runtime::logging::Captured) -> Vec<String> {
    captured
        .records()
        .into_iter()
        .filter(|r| msg(r).starts_with("refused an active-site view"))
        .filter_map(|r| r.get("reason").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn forged_relayed_views_are_refused_and_a_genuine_one_fences() {
    let captured = bloodraven_runtime::logging::capture();
    let site = "sg-a";
    let h = Launcher::start_group(&[site]).await.unwrap();
    let k = keys();
    let op = FakeParty::start(Some(signed(&k.operator, site, 1, at(0)))).await;
    let peer = FakeParty::start(None).await;
    let port = free_port();
    let trust = k.trust(false);
    let sidecar = sidecar_for(
        &h,
        0,
        site,
        &op.url,
        std::slice::from_ref(&peer.url),
        local(port),
    )
    .trust(trust)
    .start()
    .await;
    assert!(sidecar.safety_net.cleared(), "{:?}", sidecar.safety_net);
    // The spec's timings, from the verified view, replace the flags' (3 s lease).
    let s = status(sidecar.addr).await;
    assert_eq!(s["signedTopology"], true, "{s}");
    assert_eq!(s["lease_timeout"], "4s", "{s}");
    assert_eq!(s["timings_source"], "operator", "{s}");
    // From now on only the peer relays views: the operator keeps answering /healthz but
    // serves no view, so the lease stays fresh and only rule #1 can fence.
    op.set_view(None);

    // 1. Another key, naming another site with a newer observedAt.
    peer.set_view(Some(signed(&k.stranger, "sg-b", 2, at(10))));
    // 2. Our key, but a field altered after signing.
    let mut altered = signed(&k.operator, site, 2, at(10));
    altered.active_site = "sg-b".into();
    // 3. A genuine view, but older than what the sidecar already holds (a replay).
    let replayed = signed(&k.operator, "sg-b", 0, at(-5));
    // 4. Unsigned.
    let unsigned = view("sg-b", 2, at(10));
    for (what, forged) in [
        ("another key", None),
        ("an altered field", Some(altered)),
        ("a replayed older view", Some(replayed)),
        ("an unsigned view", Some(unsigned)),
    ] {
        if let Some(v) = forged {
            peer.set_view(Some(v));
        }
        sleep(TICK * 3).await;
        assert!(!fenced(&h).await, "{what} fenced the primary");
        let s = status(sidecar.addr).await;
        assert_eq!(s["topology"]["activeSite"], site, "{what}: {s}");
    }
    let reasons = refusals(&captured);
    for needle in [
        "not one of this sidecar's operator keys",
        "does not verify",
        "not signed",
    ] {
        assert!(
            reasons.iter().any(|r| r.contains(needle)),
            "no refusal saying {needle:?}: {reasons:?}"
        );
    }
    assert!(records(&captured, site, logs::SELF_FENCING).is_empty());

    // A genuine newer view naming another site, relayed by the peer: rule #1.
    peer.set_view(Some(signed(&k.operator, "sg-b", 3, at(20))));
    wait_until(Duration::from_secs(20), || fenced(&h))
        .await
        .expect("a genuine relayed view fences by rule #1");
    let fencing = records(&captured, site, logs::SELF_FENCING);
    assert!(
        fencing
            .first()
            .is_some_and(|r| msg(r).contains("rule #1") && msg(r).contains("relayed by peer")),
        "{fencing:?}"
    );
    let s = status(sidecar.addr).await;
    assert_eq!(s["topology"]["activeSite"], "sg-b", "{s}");
    sidecar.stop().await;
    op.set_mode(Mode::Down).await;
}

#[tokio::test]
async fn pinned_timings_win_and_a_sidecar_without_a_key_says_so() {
    let h = Launcher::start_group(&["sg-p", "sg-q"]).await.unwrap();
    let k = keys();
    let op = FakeParty::start(Some(signed(&k.operator, "sg-p", 1, at(0)))).await;
    let pinned = sidecar_for(&h, 0, "sg-p", &op.url, &[], local(free_port()))
        .trust(k.trust(true))
        .start()
        .await;
    assert!(pinned.safety_net.cleared());
    let s = status(pinned.addr).await;
    assert_eq!(s["lease_timeout"], "3s", "{s}");
    assert_eq!(s["timings_source"], "pinned", "{s}");
    assert_eq!(s["signedTopology"], true, "{s}");
    // Without a key: views are adopted unsigned, the flags' timings apply, status says so.
    let open = sidecar_for(&h, 1, "sg-q", &op.url, &[], local(free_port()))
        .start()
        .await;
    let s = status(open.addr).await;
    assert_eq!(s["signedTopology"], false, "{s}");
    assert_eq!(s["timings_source"], "flags", "{s}");
    assert_eq!(s["lease_timeout"], "3s", "{s}");
    pinned.stop().await;
    open.stop().await;
}

/// A sidecar whose key does not match the operator's stays fenced at start (its safety net
/// cannot trust the answer) and says why.
#[tokio::test]
async fn the_safety_net_does_not_trust_an_answer_signed_by_another_key() {
    let captured = bloodraven_runtime::logging::capture();
    let h = Launcher::start_group(&["sg-s"]).await.unwrap();
    let k = keys();
    let op = FakeParty::start(Some(signed(&k.stranger, "sg-s", 1, at(0)))).await;
    let sidecar = sidecar_for(&h, 0, "sg-s", &op.url, &[], local(free_port()))
        .trust(k.trust(false))
        .start()
        .await;
    assert!(!sidecar.safety_net.cleared(), "{:?}", sidecar.safety_net);
    assert!(h.admin(0).unwrap().is_fenced().await.unwrap());
    let lines: Vec<String> = captured
        .records()
        .iter()
        .filter(|r| msg(r) == logs::SAFETY_NET_QUERY_FAILED)
        .filter_map(|r| r.get("reason").and_then(Value::as_str).map(str::to_owned))
        .collect();
    assert!(lines.iter().any(|r| r.contains("refused")), "{lines:?}");
    sidecar.stop().await;
}
