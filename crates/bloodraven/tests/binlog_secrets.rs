//! No password reaches a binary log: after a playground start (three real MariaDB servers,
//! the accounts created, replication wired, the operator and sidecars running and a few
//! writes through the application), every site's binary logs — read raw and through
//! `mariadb-binlog` — hold none of the control-plane, replication or application passwords.
//! The account statements run on each server with binary logging off; replicated in clear
//! they would sit in every site's binary log for as long as it is kept.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bloodraven_playground::playground::{Playground, PlaygroundOptions};

/// Every binary log file of a server's data directory (`<site>-bin.000001`, …).
fn binlogs(datadir: &Path, site: &str) -> Vec<std::path::PathBuf> {
    let prefix = format!("{site}-bin.");
    let mut out: Vec<_> = std::fs::read_dir(datadir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_prefix(&prefix)
                    .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit()))
            })
        })
        .collect();
    out.sort();
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_is_in_any_sites_binary_log_after_a_playground_start() {
    let pg = Playground::start(
        PlaygroundOptions::on_free_ports(env!("CARGO_BIN_EXE_bloodraven").into()),
        &|_| {},
    )
    .await
    .expect("the playground starts");
    // Some traffic through the application, so the logs are not just the setup.
    for _ in 0..5 {
        pg.chaos("increment", None).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (secrets, servers) = {
        let h = pg.harness.lock().await;
        let a = h.accounts();
        let secrets: Vec<(&str, String)> = vec![
            ("control-plane", a.failover.password.expose().to_string()),
            ("replication", a.replication.password.expose().to_string()),
            ("application", a.app.password.expose().to_string()),
        ];
        let servers: Vec<(String, std::path::PathBuf)> = h
            .servers()
            .iter()
            .enumerate()
            .map(|(i, s)| (h.name(i).to_string(), s.datadir()))
            .collect();
        (secrets, servers)
    };
    for (_, s) in &secrets {
        assert!(s.len() >= 16, "the passwords are real ones");
    }
    let mut read = 0;
    let mut setup_seen = false;
    for (site, dir) in &servers {
        let files = binlogs(dir, site);
        assert!(
            !files.is_empty(),
            "{site} has binary logs in {}",
            dir.display()
        );
        for f in &files {
            let raw = std::fs::read(f).unwrap();
            read += raw.len();
            let decoded = Command::new("mariadb-binlog")
                .arg("--no-defaults")
                .arg(f)
                .output()
                .expect("mariadb-binlog runs");
            assert!(decoded.status.success(), "mariadb-binlog {}", f.display());
            for (what, secret) in &secrets {
                assert!(
                    !contains(&raw, secret.as_bytes()),
                    "the {what} password is in {}",
                    f.display()
                );
                assert!(
                    !contains(&decoded.stdout, secret.as_bytes()),
                    "the {what} password shows in mariadb-binlog {}",
                    f.display()
                );
            }
            setup_seen |= contains(&decoded.stdout, b"CREATE DATABASE IF NOT EXISTS app");
        }
    }
    // The statements that did reach the logs are there: the check reads real logs.
    assert!(setup_seen, "the replicated setup is in the binary logs");
    println!(
        "read {read} bytes of binary logs on {} sites",
        servers.len()
    );
    pg.shutdown().await;
}
