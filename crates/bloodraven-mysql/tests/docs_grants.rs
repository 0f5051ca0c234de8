//! docs/mysql.md recommends exactly the grants the launcher gives each account.

use bloodraven_launch::mysql::{APP_GRANTS, CLONE_GRANTS, FAILOVER_GRANTS, REPLICATION_GRANTS};

#[test]
fn the_documented_grants_are_the_launchers() {
    let page = include_str!("../../../docs/mysql.md");
    // Every GRANT statement of the page, on one line.
    let flat = page
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for (account, grants, on) in [
        ("bloodraven", FAILOVER_GRANTS, "*.*"),
        ("repl", REPLICATION_GRANTS, "*.*"),
        ("app", APP_GRANTS, "app.*"),
        ("clone", CLONE_GRANTS, "*.*"),
    ] {
        let want = format!("GRANT {grants} ON {on} TO '{account}'@'%'");
        assert!(flat.contains(&want), "docs/mysql.md lacks: {want}");
    }
}
