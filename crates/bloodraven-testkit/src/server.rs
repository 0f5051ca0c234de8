//! What a test does on a harness server as root, over its socket, behind the group's back: a
//! session (to hold a lock, rotate binary logs, read the replica's status), and a logical dump
//! as an operator takes one for a restore-in-place (`mariadb-dump`, one consistent snapshot).
//! And what the failover account sees of a server's TLS over TCP.

use std::path::Path;
use std::process::{Command, Stdio};

use bloodraven_core::config::{MysqlTls, TlsMode};
use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::{Endpoint, SiteClient, Timeouts};
use mysql_async::prelude::Queryable;

/// A root session on site `i` of `h`, over its socket.
pub async fn root_session(h: &Launcher, i: usize) -> mysql_async::Conn {
    let socket = h.servers()[i].socket.display().to_string();
    mysql_async::Conn::new(
        mysql_async::OptsBuilder::default()
            .socket(Some(socket))
            .user(Some("root"))
            .pass(Some("")),
    )
    .await
    .unwrap()
}

/// `SHOW ALL SLAVES STATUS` on site `i` of `h`: column `name` of its one connection.
pub async fn slave_column(h: &Launcher, i: usize, name: &str) -> String {
    let mut c = root_session(h, i).await;
    let rows: Vec<mysql_async::Row> = c.query("SHOW ALL SLAVES STATUS").await.unwrap();
    let row = rows.first().expect("a replica");
    let idx = row
        .columns_ref()
        .iter()
        .position(|c| c.name_str() == name)
        .unwrap_or_else(|| panic!("no column {name}"));
    row.get::<Option<String>, _>(idx)
        .flatten()
        .unwrap_or_default()
}

/// The failover account's client of site `i` of `h` over TCP, with `tls`.
pub fn tcp_client(h: &Launcher, i: usize, tls: MysqlTls) -> SiteClient {
    SiteClient::new(
        h.name(i).to_string(),
        Endpoint::tcp("127.0.0.1", h.port(i)).with_tls(tls),
        h.accounts().failover.clone(),
        Timeouts::default(),
    )
}

/// Asserts that site `i` of `h` serves a certificate of the CA bundle `trusted`, not of
/// `untrusted`: a client verifying against `trusted` logs in, one verifying against
/// `untrusted` alone is refused as a TLS failure.
pub async fn assert_certificate_of(h: &Launcher, i: usize, trusted: &Path, untrusted: &Path) {
    let trusting = |ca: &Path| {
        tcp_client(
            h,
            i,
            MysqlTls {
                mode: TlsMode::VerifyIdentity,
                ca_file: Some(ca.display().to_string()),
                server_name: None,
            },
        )
    };
    assert!(trusting(trusted).probe().await.is_ok(), "server {i}");
    let err = trusting(untrusted).probe().await.unwrap_err().to_string();
    assert!(
        err.contains("TLS to the server failed"),
        "server {i}: {err}"
    );
}

/// `mariadb-dump` of database `db` on site `i` of `h`, written to `path` (streamed: large
/// databases never sit in memory). Panics naming `mariadb-dump`'s complaint when it fails.
pub fn dump_database(h: &Launcher, i: usize, db: &str, path: &Path) {
    let tool = bloodraven_mysql::clone::find_tool("mariadb-dump").expect("mariadb-dump");
    let socket = h.servers()[i].socket.display().to_string();
    let out = Command::new(tool)
        .args([
            format!("--socket={socket}"),
            "--user=root".into(),
            "--single-transaction".into(),
            "--add-drop-database".into(),
            "--databases".into(),
            db.into(),
        ])
        .stdout(std::fs::File::create(path).unwrap())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mariadb-dump {db}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
