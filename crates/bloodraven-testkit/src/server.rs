//! What a test does on a harness server as root, over its socket, behind the group's back: a
//! session (to hold a lock, rotate binary logs), and a logical dump as an operator takes one
//! for a restore-in-place (`mariadb-dump`, one consistent snapshot).

use std::path::Path;
use std::process::{Command, Stdio};

use bloodraven_mysql::launcher::Launcher;

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
