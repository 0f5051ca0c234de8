//! Backups through a real sidecar on a real MariaDB replica: only the group's operator, proven
//! by its certificate, may ask for one; bad requests name their field and change nothing; one
//! runs at a time; an abandoned backup leaves nothing under the target; a finished one is a
//! whole, verifiable backup of the replica's data at the GTID position its manifest names.

mod support;

use std::time::Duration;

use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::backup;
use bloodraven_sidecar::backups::BackupSettings;
use bloodraven_testkit::pki::{self, pki};
use bloodraven_testkit::s3::{ACCESS_KEY_ID, S3Server, SECRET_ACCESS_KEY};
use mysql_async::prelude::Queryable;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{FakeParty, at, sidecar_for, view};

async fn call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut r = client.request(method, url);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap();
    let code = r.status();
    let text = r.text().await.unwrap();
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Polls `GET /backups/{id}` until it is no longer `Running` (a generous bound: a real
/// `mariadb-backup` of a small server).
async fn finished(client: &reqwest::Client, url: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (code, r) = call(client, reqwest::Method::GET, url, None).await;
        assert_eq!(code, StatusCode::OK, "{r}");
        if r["phase"] != "Running" {
            return r;
        }
        assert!(tokio::time::Instant::now() < deadline, "still running: {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks that the backup at `url` runs, abandons it, and checks it is recorded `Failed`
/// ("abandoned").
async fn abandon_running(operator: &reqwest::Client, url: &str) {
    let (code, r) = call(operator, reqwest::Method::GET, url, None).await;
    assert_eq!(
        (code, r["phase"].as_str()),
        (StatusCode::OK, Some("Running")),
        "{r}"
    );
    let (code, r) = call(operator, reqwest::Method::DELETE, url, None).await;
    assert_eq!(code, StatusCode::OK, "{r}");
    assert_eq!(r["phase"], "Failed", "{r}");
    assert!(r["message"].as_str().unwrap().contains("abandoned"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_operator_starts_a_backup_and_it_is_whole_or_absent() {
    let h = Launcher::start_group(&["bk-iad", "bk-pdx"]).await.unwrap();
    let iad = h.admin(0).unwrap();
    iad.execute("CREATE DATABASE shop").await.unwrap();
    iad.execute("CREATE TABLE shop.t (id INT PRIMARY KEY)")
        .await
        .unwrap();
    iad.execute("INSERT INTO shop.t VALUES (1), (2), (3)")
        .await
        .unwrap();
    h.wait_replicas_caught_up(0, Duration::from_secs(20))
        .await
        .unwrap();

    let op = FakeParty::start(Some(view("bk-iad", 5, at(0)))).await;
    let sidecar = sidecar_for(
        &h,
        1,
        "bk-pdx",
        &op.url,
        &[],
        "127.0.0.1:0".parse().unwrap(),
    )
    .start()
    .await;
    let base = format!("https://{}/backups", sidecar.addr);
    let target = tempfile::tempdir().unwrap();
    let target_url = format!("file://{}", target.path().display());
    let operator = pki().client_as(&pki().operator());
    let take = |id: &str| json!({"id": id, "target": target_url.clone(), "topologyGeneration": 5});
    let post = reqwest::Method::POST;

    // Disabled until the sidecar has the backup account: the answer names the flag.
    let (code, r) = call(&operator, post.clone(), &base, Some(take("b0"))).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{r}");
    assert!(
        r["reason"]
            .as_str()
            .unwrap()
            .contains("--backup-credentials-file"),
        "{r}"
    );

    let password = h.accounts().clone.password.expose().to_string();
    sidecar.enable_backups(BackupSettings {
        host: "127.0.0.1".into(),
        port: h.port(1),
        credentials: h.accounts().clone.clone(),
        tls: h.client_tls(),
        datadir: None,
    });

    // Nobody but the operator: no certificate, a peer site's, another CA's.
    let (_other_ca, foreign) = pki::foreign("bk-iad");
    for (who, client, want) in [
        ("no certificate", pki().client(), StatusCode::UNAUTHORIZED),
        (
            "a peer sidecar",
            pki().client_as(&pki().site("bk-iad")),
            StatusCode::FORBIDDEN,
        ),
        (
            "another CA",
            pki().client_as(&foreign),
            StatusCode::UNAUTHORIZED,
        ),
    ] {
        let (code, r) = call(&client, post.clone(), &base, Some(take("b1"))).await;
        assert_eq!(code, want, "{who}: {r}");
        let (code, _) = call(&client, reqwest::Method::GET, &format!("{base}/b1"), None).await;
        assert_eq!(code, want, "{who}");
    }

    // Hostile or malformed requests name the field and start nothing.
    for (body, field) in [
        (
            json!({"id": "../etc", "target": target_url, "topologyGeneration": 5}),
            "id",
        ),
        (
            json!({"id": "", "target": target_url, "topologyGeneration": 5}),
            "id",
        ),
        (
            json!({"id": "b1", "target": "file://relative", "topologyGeneration": 5}),
            "target",
        ),
        (
            json!({"id": "b1", "target": "file:///a/../b", "topologyGeneration": 5}),
            "target",
        ),
        (
            json!({"id": "b1", "target": "s3://bucket/p", "topologyGeneration": 5}),
            "s3",
        ),
        (
            json!({"id": "b1", "target": "s3://Bucket/p", "topologyGeneration": 5,
                   "s3": {"accessKeyId": "a", "secretAccessKey": "b"}}),
            "target",
        ),
        (
            json!({"id": "b1", "target": target_url, "topologyGeneration": 5,
                   "s3": {"accessKeyId": "a", "secretAccessKey": "b"}}),
            "s3",
        ),
        (json!({"id": "b1", "target": target_url}), "body"),
        (
            json!({"id": "b1", "target": target_url, "topologyGeneration": 5, "x": 1}),
            "body",
        ),
    ] {
        let (code, r) = call(&operator, post.clone(), &base, Some(body.clone())).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{body}: {r}");
        assert_eq!(r["field"], field, "{body}: {r}");
    }
    assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0);

    // Hold the backup at its first lock: a session of ours is in BACKUP STAGE, so
    // mariadb-backup's own `BACKUP STAGE START` waits (one backup stage at a time).
    let holder_opts: mysql_async::Opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(h.port(1))
        .prefer_socket(false)
        .user(Some(h.accounts().clone.user.clone()))
        .pass(Some(password.clone()))
        .ssl_opts(bloodraven_mysql::site::ssl_opts(&h.client_tls()))
        .into();
    let mut holder = mysql_async::Conn::new(holder_opts.clone()).await.unwrap();
    holder.query_drop("BACKUP STAGE START").await.unwrap();

    let (code, r) = call(&operator, post.clone(), &base, Some(take("held"))).await;
    assert_eq!(code, StatusCode::ACCEPTED, "{r}");
    assert_eq!(r["phase"], "Running");
    assert_eq!(r["site"], "bk-pdx");
    // One at a time.
    let (code, r) = call(&operator, post.clone(), &base, Some(take("second"))).await;
    assert_eq!(code, StatusCode::CONFLICT, "{r}");
    assert!(r["reason"].as_str().unwrap().contains("held"), "{r}");
    // It waits on our stage; abandon it: nothing of it remains under the target.
    abandon_running(&operator, &format!("{base}/held")).await;
    let left: Vec<_> = std::fs::read_dir(target.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "an abandoned backup leaves nothing: {left:?}"
    );
    holder.query_drop("BACKUP STAGE END").await.unwrap();
    drop(holder);

    // Taken for real: whole, verifiable, at the replica's position.
    let position = h
        .admin(1)
        .unwrap()
        .query_string("SELECT @@gtid_binlog_pos")
        .await
        .unwrap()
        .unwrap_or_default();
    let (code, r) = call(&operator, post.clone(), &base, Some(take("b1"))).await;
    assert_eq!(code, StatusCode::ACCEPTED, "{r}");
    let r = finished(&operator, &format!("{base}/b1")).await;
    assert_eq!(r["phase"], "Succeeded", "{r}");
    let text = r.to_string();
    assert!(!text.contains(&password), "no secret in a report");
    let m: backup::Manifest = serde_json::from_value(r["manifest"].clone()).unwrap();
    assert_eq!(m.site, "bk-pdx");
    assert_eq!(m.group, "playground");
    assert_eq!(m.topology_generation, 5);
    assert_eq!(m.gtid_position, position, "the replica's position");
    assert_eq!(r["bytes"], m.bytes);
    let storage = backup::Storage::Dir(target.path().to_path_buf());
    assert_eq!(backup::list(&storage).await.unwrap(), vec![m.clone()]);
    // An id is taken once.
    let (code, r) = call(&operator, post.clone(), &base, Some(take("b1"))).await;
    assert_eq!(code, StatusCode::CONFLICT, "{r}");
    let scratch = tempfile::tempdir().unwrap();
    let verified = backup::verify(&storage, "b1", scratch.path())
        .await
        .expect("the backup verifies");
    assert!(verified.tables > 0, "{verified:?}");

    // An unknown id is 404, and a hostile one is not echoed.
    let (code, r) = call(
        &operator,
        reqwest::Method::GET,
        &format!("{base}/%3Cscript%3E"),
        None,
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{r}");
    assert!(!r.to_string().contains("script"), "{r}");

    // Into a bucket of an S3-compatible server, the keys given in the request: abandoned
    // mid-way it leaves no object; taken for real it is whole and verifies from the bucket.
    let s3 = S3Server::start().await.expect("moto");
    s3.create_bucket("backups").await.unwrap();
    let to_bucket = |id: &str| {
        json!({"id": id, "target": "s3://backups/g", "topologyGeneration": 5,
               "s3": {"endpoint": s3.endpoint(), "accessKeyId": ACCESS_KEY_ID,
                      "secretAccessKey": SECRET_ACCESS_KEY}})
    };
    // Held at its first lock again, then abandoned: no object of it is left.
    let mut holder = mysql_async::Conn::new(holder_opts.clone()).await.unwrap();
    holder.query_drop("BACKUP STAGE START").await.unwrap();
    let (code, r) = call(&operator, post.clone(), &base, Some(to_bucket("s1"))).await;
    assert_eq!(code, StatusCode::ACCEPTED, "{r}");
    abandon_running(&operator, &format!("{base}/s1")).await;
    assert!(
        s3.keys("backups", "g/s1/").await.unwrap().is_empty(),
        "an abandoned backup leaves no object"
    );
    holder.query_drop("BACKUP STAGE END").await.unwrap();
    drop(holder);
    let (code, r) = call(&operator, post.clone(), &base, Some(to_bucket("s2"))).await;
    assert_eq!(code, StatusCode::ACCEPTED, "{r}");
    let r = finished(&operator, &format!("{base}/s2")).await;
    assert_eq!(r["phase"], "Succeeded", "{r}");
    assert!(
        !r.to_string().contains(SECRET_ACCESS_KEY),
        "no key in a report"
    );
    let m: backup::Manifest = serde_json::from_value(r["manifest"].clone()).unwrap();
    let stored = s3.keys("backups", "g/s2/").await.unwrap();
    assert!(
        stored.contains(&"g/s2/manifest.json".to_string()),
        "{stored:?}"
    );
    assert_eq!(stored.len(), m.files.len() + 1, "{stored:?}");
    let bucket = s3.storage("backups", "g").unwrap();
    assert_eq!(backup::list(&bucket).await.unwrap(), vec![m]);
    let scratch = tempfile::tempdir().unwrap();
    backup::verify(&bucket, "s2", scratch.path())
        .await
        .expect("the backup verifies from the bucket");
    sidecar.stop().await;
}
