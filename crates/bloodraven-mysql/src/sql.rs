//! The statements Bloodraven sends, per server flavour, and the parsers for what comes back.
//!
//! Everything here is pure so both flavours are unit-tested on the generated SQL; MariaDB's
//! statements are also exercised against real servers by the integration tests. MySQL 8.4
//! cannot be installed on the project's machines, so its statements are checked here only.

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;

use bloodraven_core::config::{ReplicationTls, TlsMode};
use bloodraven_core::gtid::GtidFlavor;
use bloodraven_core::semisync::{self, SemiSyncState, Settings};
use serde::Serialize;

/// A server's family and version, from `SELECT VERSION()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Flavor {
    pub kind: FlavorKind,
    pub major: u16,
    pub minor: u16,
    pub patch: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum FlavorKind {
    MariaDb,
    MySql,
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.kind {
            FlavorKind::MariaDb => "MariaDB",
            FlavorKind::MySql => "MySQL",
        };
        write!(f, "{name} {}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Strict fencing's dead man's switch: one event in the `mysql` schema, kept by the primary's
/// sidecar (docs/mysql.md). Created and dropped with binary logging off, so it never reaches
/// a replica.
pub const DEADLINE_EVENT: &str = "mysql.bloodraven_fence_deadline";

/// Drops the dead man's switch (nothing when there is none).
pub const DISARM_DEADLINE: &str = "DROP EVENT IF EXISTS mysql.bloodraven_fence_deadline";

impl Flavor {
    /// Parses `SELECT VERSION()` output, e.g. `10.11.19-MariaDB-0+deb12u1-log` or `8.4.3`.
    pub fn from_version(version: &str) -> Option<Flavor> {
        let kind = if version.to_ascii_lowercase().contains("mariadb") {
            FlavorKind::MariaDb
        } else {
            FlavorKind::MySql
        };
        let numeric: String = version
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let mut it = numeric.split('.').map(str::parse::<u16>);
        let major = it.next()?.ok()?;
        let minor = it.next().and_then(Result::ok).unwrap_or(0);
        let patch = it.next().and_then(Result::ok).unwrap_or(0);
        Some(Flavor {
            kind,
            major,
            minor,
            patch,
        })
    }

    pub fn gtid_flavor(self) -> GtidFlavor {
        match self.kind {
            FlavorKind::MariaDb => GtidFlavor::MariaDb,
            FlavorKind::MySql => GtidFlavor::MySql,
        }
    }

    pub fn is_mariadb(self) -> bool {
        self.kind == FlavorKind::MariaDb
    }

    fn at_least(self, major: u16, minor: u16) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// Whether `read_only` alone stops SUPER holders. MariaDB ≥ 10.11 split `READ ONLY ADMIN`
    /// out of SUPER; MySQL has `super_read_only` for that.
    pub fn read_only_blocks_super(self) -> bool {
        match self.kind {
            FlavorKind::MariaDb => self.at_least(10, 11),
            FlavorKind::MySql => false,
        }
    }

    /// Whether the server has `super_read_only`.
    pub fn has_super_read_only(self) -> bool {
        self.kind == FlavorKind::MySql
    }

    /// Statement that reads the fence variables and the executed GTID set in one row:
    /// `(read_only, super_read_only or NULL, gtid set, server_id)`.
    pub fn variables_query(self) -> &'static str {
        match self.kind {
            FlavorKind::MariaDb => {
                "SELECT @@global.read_only, NULL, @@global.gtid_current_pos, @@global.server_id"
            }
            FlavorKind::MySql => {
                "SELECT @@global.read_only, @@global.super_read_only, @@global.gtid_executed, @@global.server_id"
            }
        }
    }

    /// Statement that reads the fence variables and who the server is in one row:
    /// `(read_only, super_read_only or NULL, server_id, uptime in seconds)`. Uptime tells a
    /// restarted server from the one seen before (a new start moves `now - uptime` later).
    pub fn fence_reading_query(self) -> &'static str {
        match self.kind {
            FlavorKind::MariaDb => {
                "SELECT @@global.read_only, NULL, @@global.server_id, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'"
            }
            FlavorKind::MySql => {
                "SELECT @@global.read_only, @@global.super_read_only, @@global.server_id, VARIABLE_VALUE FROM performance_schema.global_status WHERE VARIABLE_NAME = 'Uptime'"
            }
        }
    }

    pub fn fence_statement(self) -> &'static str {
        match self.kind {
            FlavorKind::MariaDb => "SET GLOBAL read_only = ON",
            // super_read_only=ON implies read_only=ON.
            FlavorKind::MySql => "SET GLOBAL super_read_only = ON",
        }
    }

    /// Sets the dead man's switch `seconds` from now: an event that fences the server by itself
    /// at that moment unless it is set again (the sidecar does, every tick). MariaDB replaces
    /// it in one statement; MySQL 8 has no `CREATE OR REPLACE EVENT`, so it drops it first.
    /// The definer is the sidecar's account, whose fencing right the event uses.
    pub fn arm_deadline_statements(self, seconds: u64) -> Vec<String> {
        let seconds = seconds.max(1);
        match self.kind {
            FlavorKind::MariaDb => vec![format!(
                "CREATE OR REPLACE DEFINER = CURRENT_USER EVENT {DEADLINE_EVENT} ON SCHEDULE AT CURRENT_TIMESTAMP + INTERVAL {seconds} SECOND ON COMPLETION NOT PRESERVE DO {}",
                self.deadline_body()
            )],
            FlavorKind::MySql => vec![
                DISARM_DEADLINE.to_string(),
                format!(
                    "CREATE DEFINER = CURRENT_USER EVENT {DEADLINE_EVENT} ON SCHEDULE AT CURRENT_TIMESTAMP + INTERVAL {seconds} SECOND ON COMPLETION NOT PRESERVE DO {}",
                    self.deadline_body()
                ),
            ],
        }
    }

    /// What the dead man's switch does when it fires: fence, with binary logging off for its
    /// session, because the scheduler then drops the spent event in that same session and a
    /// logged `DROP EVENT` would stop every replica (it has no such event: error 1539).
    fn deadline_body(self) -> String {
        format!(
            "BEGIN SET SESSION sql_log_bin = 0; {}; END",
            self.fence_statement()
        )
    }

    pub fn unfence_statements(self) -> &'static [&'static str] {
        match self.kind {
            FlavorKind::MariaDb => &["SET GLOBAL read_only = OFF"],
            // read_only=OFF implies super_read_only=OFF; be explicit anyway.
            FlavorKind::MySql => &[
                "SET GLOBAL super_read_only = OFF",
                "SET GLOBAL read_only = OFF",
            ],
        }
    }

    pub fn replica_status_query(self) -> &'static str {
        match self.kind {
            FlavorKind::MariaDb => "SHOW SLAVE STATUS",
            FlavorKind::MySql => "SHOW REPLICA STATUS",
        }
    }

    pub fn stop_replica(self) -> &'static str {
        match self.kind {
            FlavorKind::MariaDb => "STOP SLAVE",
            FlavorKind::MySql => "STOP REPLICA",
        }
    }

    pub fn start_replica(self) -> &'static str {
        match self.kind {
            FlavorKind::MariaDb => "START SLAVE",
            FlavorKind::MySql => "START REPLICA",
        }
    }

    pub fn reset_replica_all(self) -> &'static str {
        match self.kind {
            FlavorKind::MariaDb => "RESET SLAVE ALL",
            FlavorKind::MySql => "RESET REPLICA ALL",
        }
    }

    /// Before a server replicates from a new source it must know what it already has.
    /// MariaDB keeps the replication position in `gtid_slave_pos`, which is stale on a former
    /// primary: copy the binlog position over (`log_slave_updates` makes it complete).
    /// MySQL's auto-positioning uses `gtid_executed` directly.
    pub fn prepare_replica_position(self) -> Option<&'static str> {
        match self.kind {
            FlavorKind::MariaDb => Some("SET GLOBAL gtid_slave_pos = @@global.gtid_binlog_pos"),
            FlavorKind::MySql => None,
        }
    }

    /// `CHANGE MASTER TO …` / `CHANGE REPLICATION SOURCE TO …` with GTID auto-positioning,
    /// over TLS as `tls` says: with TLS on, `MASTER_SSL=1` and the CA (as the replica sees
    /// it); with `verify-identity`, also the check of the source's certificate against
    /// `MASTER_HOST` (MariaDB has no separate server-name option). Disabled, nothing is set.
    /// The result carries a password: never log it, never echo an error about it.
    pub fn change_source(
        self,
        host: &str,
        port: u16,
        user: &str,
        password: &str,
        tls: &ReplicationTls,
    ) -> String {
        let (ssl, ca, verify) = match self.kind {
            FlavorKind::MariaDb => (
                "MASTER_SSL",
                "MASTER_SSL_CA",
                "MASTER_SSL_VERIFY_SERVER_CERT",
            ),
            FlavorKind::MySql => (
                "SOURCE_SSL",
                "SOURCE_SSL_CA",
                "SOURCE_SSL_VERIFY_SERVER_CERT",
            ),
        };
        let mut tls_opts = String::new();
        if tls.mode.encrypts() {
            let _ = write!(tls_opts, ", {ssl}=1");
            if let Some(path) = &tls.ca_file {
                let _ = write!(tls_opts, ", {ca}={}", quote(path));
            }
            let on = u8::from(tls.mode == TlsMode::VerifyIdentity);
            let _ = write!(tls_opts, ", {verify}={on}");
        }
        match self.kind {
            FlavorKind::MariaDb => format!(
                "CHANGE MASTER TO MASTER_HOST={}, MASTER_PORT={port}, MASTER_USER={}, MASTER_PASSWORD={}, MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1{tls_opts}",
                quote(host),
                quote(user),
                quote(password)
            ),
            FlavorKind::MySql => format!(
                "CHANGE REPLICATION SOURCE TO SOURCE_HOST={}, SOURCE_PORT={port}, SOURCE_USER={}, SOURCE_PASSWORD={}, SOURCE_AUTO_POSITION=1, SOURCE_CONNECT_RETRY=1, GET_SOURCE_PUBLIC_KEY=1{tls_opts}",
                quote(host),
                quote(user),
                quote(password)
            ),
        }
    }

    /// A statement returning 0 once the server has applied `gtid`, or a timeout marker
    /// (MariaDB `-1`, MySQL `1`) after `timeout_secs`.
    pub fn wait_for_gtid(self, gtid: &str, timeout_secs: f64) -> String {
        match self.kind {
            FlavorKind::MariaDb => format!(
                "SELECT MASTER_GTID_WAIT({}, {timeout_secs:.3})",
                quote(gtid)
            ),
            FlavorKind::MySql => format!(
                "SELECT WAIT_FOR_EXECUTED_GTID_SET({}, {timeout_secs:.3})",
                quote(gtid)
            ),
        }
    }

    /// The statements that give a server the semi-synchronous `settings`: the source side
    /// with `AFTER_SYNC` and the no-fallback timeout (the wait point and timeout before the
    /// switch, so the source never runs a moment with MariaDB's lossy defaults), the replica
    /// side, and — when the replica side changes on a running replica — a restart of its IO
    /// thread, without which the change does not take effect. Variable names per flavour:
    /// MariaDB `rpl_semi_sync_master_*`/`slave_*` (built in), MySQL 8 `rpl_semi_sync_source_*`/
    /// `replica_*` (plugins the user installs).
    pub fn semi_sync_statements(
        self,
        settings: Settings,
        replica_changes: bool,
        replica_running: bool,
    ) -> Vec<String> {
        let (source, replica, io) = match self.kind {
            FlavorKind::MariaDb => ("rpl_semi_sync_master", "rpl_semi_sync_slave", "SLAVE"),
            FlavorKind::MySql => ("rpl_semi_sync_source", "rpl_semi_sync_replica", "REPLICA"),
        };
        let on = |b: bool| if b { "ON" } else { "OFF" };
        let mut out = Vec::new();
        if settings.source {
            out.push(format!("SET GLOBAL {source}_wait_point = 'AFTER_SYNC'"));
            out.push(format!(
                "SET GLOBAL {source}_timeout = {}",
                semisync::NO_FALLBACK_TIMEOUT_MS
            ));
        }
        out.push(format!(
            "SET GLOBAL {source}_enabled = {}",
            on(settings.source)
        ));
        out.push(format!(
            "SET GLOBAL {replica}_enabled = {}",
            on(settings.replica)
        ));
        if replica_changes && replica_running {
            out.push(format!("STOP {io} IO_THREAD"));
            out.push(format!("START {io} IO_THREAD"));
        }
        out
    }

    /// Privileges that let an account write through the fence (or lift it).
    pub fn fence_bypass_privileges(self, grants: &[String]) -> Vec<String> {
        let mut found = Vec::new();
        for g in grants {
            let upper = g.to_ascii_uppercase().replace('_', " ");
            let global = upper.contains(" ON *.* ");
            if !global {
                continue;
            }
            let mut flag = |p: &str| {
                if !found.iter().any(|f: &String| f == p) {
                    found.push(p.to_string());
                }
            };
            if upper.contains("ALL PRIVILEGES") {
                flag("ALL PRIVILEGES");
            }
            match self.kind {
                FlavorKind::MariaDb => {
                    if upper.contains("READ ONLY ADMIN") {
                        flag("READ ONLY ADMIN");
                    }
                    if !self.read_only_blocks_super() && has_word(&upper, "SUPER") {
                        flag("SUPER");
                    }
                }
                FlavorKind::MySql => {
                    // Nothing writes through super_read_only, but these may switch it off.
                    if has_word(&upper, "SUPER") {
                        flag("SUPER");
                    }
                    if upper.contains("SYSTEM VARIABLES ADMIN") {
                        flag("SYSTEM_VARIABLES_ADMIN");
                    }
                }
            }
        }
        found
    }
}

fn has_word(haystack: &str, word: &str) -> bool {
    haystack
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w == word)
}

/// Quotes a string literal for MySQL/MariaDB. Doubles quotes and escapes backslashes: correct
/// for the default `sql_mode` (connections Bloodraven opens clear `NO_BACKSLASH_ESCAPES`).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            '\0' => out.push_str("\\0"),
            _ => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// A replica's replication state, from `SHOW SLAVE STATUS` / `SHOW REPLICA STATUS`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    pub io_running: bool,
    /// The IO thread has started but does not read events yet: MariaDB's `Connecting` (trying
    /// to reach its source) and `Preparing` (connected, registering and negotiating its GTID
    /// position). Both are a thread on its way up, not a stopped one.
    pub io_connecting: bool,
    pub sql_running: bool,
    pub seconds_behind: Option<u64>,
    pub source_host: String,
    pub source_port: u16,
    pub last_io_error: String,
    pub last_sql_error: String,
    pub last_sql_errno: u32,
    /// MariaDB `Gtid_IO_Pos`: what the IO thread has received.
    pub gtid_io_pos: String,
    /// `Master_SSL_Allowed` / `Source_SSL_Allowed`: the connection to the source uses TLS.
    pub ssl_allowed: bool,
    /// `Master_SSL_Verify_Server_Cert` / `Source_SSL_Verify_Server_Cert`: it checks the
    /// source's certificate against its host.
    pub ssl_verify_server_cert: bool,
}

impl ReplicaStatus {
    /// Both threads running.
    pub fn running(&self) -> bool {
        self.io_running && self.sql_running
    }

    /// Builds the status from one row, as column name → value (`None` for SQL NULL).
    /// Reads MySQL 8 names (`Replica_*`, `Source_*`) and MariaDB/legacy names (`Slave_*`,
    /// `Master_*`).
    pub fn from_columns(cols: &BTreeMap<String, Option<String>>) -> ReplicaStatus {
        let get = |names: &[&str]| -> Option<String> {
            names.iter().find_map(|n| cols.get(*n).cloned().flatten())
        };
        let io = get(&["Replica_IO_Running", "Slave_IO_Running"]).unwrap_or_default();
        let sql = get(&["Replica_SQL_Running", "Slave_SQL_Running"]).unwrap_or_default();
        ReplicaStatus {
            io_running: io.eq_ignore_ascii_case("yes"),
            io_connecting: io.eq_ignore_ascii_case("connecting")
                || io.eq_ignore_ascii_case("preparing"),
            sql_running: sql.eq_ignore_ascii_case("yes"),
            seconds_behind: get(&["Seconds_Behind_Source", "Seconds_Behind_Master"])
                .and_then(|s| s.parse().ok()),
            source_host: get(&["Source_Host", "Master_Host"]).unwrap_or_default(),
            source_port: get(&["Source_Port", "Master_Port"])
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            last_io_error: get(&["Last_IO_Error"]).unwrap_or_default(),
            last_sql_error: get(&["Last_SQL_Error"]).unwrap_or_default(),
            last_sql_errno: get(&["Last_SQL_Errno"])
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            gtid_io_pos: get(&["Gtid_IO_Pos"]).unwrap_or_default(),
            ssl_allowed: get(&["Source_SSL_Allowed", "Master_SSL_Allowed"])
                .is_some_and(|v| v.eq_ignore_ascii_case("yes")),
            ssl_verify_server_cert: get(&[
                "Source_SSL_Verify_Server_Cert",
                "Master_SSL_Verify_Server_Cert",
            ])
            .is_some_and(|v| v.eq_ignore_ascii_case("yes")),
        }
    }

    /// Whether the IO thread's last error is a TLS failure (the source's certificate not
    /// verified, no TLS offered): what `ReplicationInsecure` reports.
    pub fn tls_failed(&self) -> bool {
        let e = self.last_io_error.to_ascii_lowercase();
        e.contains("ssl") || e.contains("tls") || e.contains("certificate")
    }
}

/// The statements that read a server's semi-synchronous replication: both answer with
/// `(name, value)` rows, and with none when the server has no semi-synchronous replication
/// (MySQL without the plugins), so they never fail for that reason.
pub const SEMI_SYNC_VARIABLES: &str = "SHOW GLOBAL VARIABLES LIKE 'rpl\\_semi\\_sync\\_%'";
pub const SEMI_SYNC_STATUS: &str = "SHOW GLOBAL STATUS LIKE 'Rpl\\_semi\\_sync\\_%'";

/// Builds a [`SemiSyncState`] from the rows of [`SEMI_SYNC_VARIABLES`] and
/// [`SEMI_SYNC_STATUS`], reading both flavours' names (`master`/`source`, `slave`/`replica`).
pub fn semi_sync_state(
    variables: &[(String, String)],
    status: &[(String, String)],
) -> SemiSyncState {
    let find = |rows: &[(String, String)], names: &[&str]| -> Option<String> {
        rows.iter()
            .find(|(n, _)| names.iter().any(|want| n.eq_ignore_ascii_case(want)))
            .map(|(_, v)| v.clone())
    };
    let on = |v: Option<String>| v.is_some_and(|v| v.eq_ignore_ascii_case("ON") || v == "1");
    let num = |v: Option<String>| v.and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
    let source_enabled = find(
        variables,
        &[
            "rpl_semi_sync_master_enabled",
            "rpl_semi_sync_source_enabled",
        ],
    );
    SemiSyncState {
        available: source_enabled.is_some(),
        source_enabled: on(source_enabled),
        after_sync: find(
            variables,
            &[
                "rpl_semi_sync_master_wait_point",
                "rpl_semi_sync_source_wait_point",
            ],
        )
        .is_some_and(|v| v.eq_ignore_ascii_case("AFTER_SYNC")),
        timeout_ms: num(find(
            variables,
            &[
                "rpl_semi_sync_master_timeout",
                "rpl_semi_sync_source_timeout",
            ],
        )),
        source_active: on(find(
            status,
            &["Rpl_semi_sync_master_status", "Rpl_semi_sync_source_status"],
        )),
        source_clients: u32::try_from(num(find(
            status,
            &[
                "Rpl_semi_sync_master_clients",
                "Rpl_semi_sync_source_clients",
            ],
        )))
        .unwrap_or(u32::MAX),
        waiting_sessions: u32::try_from(num(find(
            status,
            &[
                "Rpl_semi_sync_master_wait_sessions",
                "Rpl_semi_sync_source_wait_sessions",
            ],
        )))
        .unwrap_or(u32::MAX),
        replica_enabled: on(find(
            variables,
            &[
                "rpl_semi_sync_slave_enabled",
                "rpl_semi_sync_replica_enabled",
            ],
        )),
        replica_active: on(find(
            status,
            &["Rpl_semi_sync_slave_status", "Rpl_semi_sync_replica_status"],
        )),
    }
}

/// One row of the process list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub id: u64,
    pub user: String,
    /// The client's host (`host:port`), for logs.
    pub host: String,
    pub command: String,
    /// Seconds in the current state (`TIME`): how long a statement has run, or the session
    /// has been idle.
    pub seconds: u64,
}

impl Session {
    /// `user@host` without the port, for logs and events (never the statement's text).
    pub fn account(&self) -> String {
        let host = self
            .host
            .rsplit_once(':')
            .map_or(self.host.as_str(), |(h, _)| h);
        format!("{}@{host}", self.user)
    }

    /// Whether it is running a statement (not idle).
    pub fn is_busy(&self) -> bool {
        !self.command.eq_ignore_ascii_case("Sleep")
    }
}

/// Commands of threads that belong to replication or the server itself.
const SYSTEM_COMMANDS: &[&str] = &[
    "Binlog Dump",
    "Binlog Dump GTID",
    "Slave_IO",
    "Slave_SQL",
    "Slave_worker",
    "Daemon",
    "Connect",
    "Register Slave",
];

/// Users of the server's own threads.
const SYSTEM_USERS: &[&str] = &["system user", "event_scheduler", "unauthenticated user"];

/// Whether a session is an application session that a fence must kill: not a replication
/// thread (`Binlog Dump` on a source, applier threads on a replica), not a server thread, not
/// our own connection, and not an account on the `spare_users` list (the control-plane accounts).
pub fn is_application_session(s: &Session, own_id: u64, spare_users: &[&str]) -> bool {
    if s.id == own_id {
        return false;
    }
    if SYSTEM_USERS.iter().any(|u| s.user.eq_ignore_ascii_case(u)) || s.user.is_empty() {
        return false;
    }
    if SYSTEM_COMMANDS
        .iter()
        .any(|c| s.command.eq_ignore_ascii_case(c))
    {
        return false;
    }
    !spare_users.iter().any(|u| s.user == *u)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mysql84() -> Flavor {
        Flavor::from_version("8.4.3").unwrap()
    }
    fn maria1011() -> Flavor {
        Flavor::from_version("10.11.19-MariaDB-0+deb12u1-log").unwrap()
    }

    #[test]
    fn detects_flavours() {
        assert_eq!(
            maria1011(),
            Flavor {
                kind: FlavorKind::MariaDb,
                major: 10,
                minor: 11,
                patch: 19
            }
        );
        assert_eq!(mysql84().kind, FlavorKind::MySql);
        assert_eq!(mysql84().to_string(), "MySQL 8.4.3");
        assert_eq!(Flavor::from_version("11.4.2-MariaDB").unwrap().minor, 4);
        assert!(Flavor::from_version("garbage").is_none());
        assert!(maria1011().read_only_blocks_super());
        assert!(
            !Flavor::from_version("10.6.1-MariaDB")
                .unwrap()
                .read_only_blocks_super()
        );
    }

    #[test]
    fn statements_per_flavour() {
        // (flavour, fence, unfence, replica status, re-point, GTID wait)
        let cases = [
            (
                mysql84(),
                "SET GLOBAL super_read_only = ON",
                &[
                    "SET GLOBAL super_read_only = OFF",
                    "SET GLOBAL read_only = OFF",
                ][..],
                "SHOW REPLICA STATUS",
                ("10.0.0.1", 3306, "p'w"),
                "CHANGE REPLICATION SOURCE TO SOURCE_HOST='10.0.0.1', SOURCE_PORT=3306, SOURCE_USER='repl', SOURCE_PASSWORD='p''w', SOURCE_AUTO_POSITION=1, SOURCE_CONNECT_RETRY=1, GET_SOURCE_PUBLIC_KEY=1",
                ("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5", 2.5),
                "SELECT WAIT_FOR_EXECUTED_GTID_SET('3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5', 2.500)",
            ),
            (
                maria1011(),
                "SET GLOBAL read_only = ON",
                &["SET GLOBAL read_only = OFF"][..],
                "SHOW SLAVE STATUS",
                ("127.0.0.1", 3307, "a\\b"),
                "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=3307, MASTER_USER='repl', MASTER_PASSWORD='a\\\\b', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
                ("0-1-5", 1.0),
                "SELECT MASTER_GTID_WAIT('0-1-5', 1.000)",
            ),
        ];
        for (f, fence, unfence, status, (host, port, password), repoint, (gtid, secs), wait) in
            cases
        {
            assert_eq!(f.fence_statement(), fence, "{f}");
            assert_eq!(f.unfence_statements(), unfence, "{f}");
            assert_eq!(f.replica_status_query(), status, "{f}");
            assert_eq!(
                f.change_source(host, port, "repl", password, &ReplicationTls::default()),
                repoint,
                "{f}"
            );
            assert_eq!(f.wait_for_gtid(gtid, secs), wait, "{f}");
        }
        // Over TLS: the CA as the replica sees it, and the check of the source's certificate.
        let verify = ReplicationTls {
            mode: TlsMode::VerifyIdentity,
            ca_file: Some("/etc/mysql/ca.crt".into()),
        };
        assert_eq!(
            mysql84().change_source("db-1", 3306, "repl", "pw", &verify),
            "CHANGE REPLICATION SOURCE TO SOURCE_HOST='db-1', SOURCE_PORT=3306, SOURCE_USER='repl', SOURCE_PASSWORD='pw', SOURCE_AUTO_POSITION=1, SOURCE_CONNECT_RETRY=1, GET_SOURCE_PUBLIC_KEY=1, SOURCE_SSL=1, SOURCE_SSL_CA='/etc/mysql/ca.crt', SOURCE_SSL_VERIFY_SERVER_CERT=1"
        );
        assert_eq!(
            maria1011().change_source("db-1", 3306, "repl", "pw", &verify),
            "CHANGE MASTER TO MASTER_HOST='db-1', MASTER_PORT=3306, MASTER_USER='repl', MASTER_PASSWORD='pw', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1, MASTER_SSL=1, MASTER_SSL_CA='/etc/mysql/ca.crt', MASTER_SSL_VERIFY_SERVER_CERT=1"
        );
        let encrypted = ReplicationTls {
            mode: TlsMode::Required,
            ca_file: None,
        };
        assert_eq!(
            maria1011().change_source("db-1", 3306, "repl", "pw", &encrypted),
            "CHANGE MASTER TO MASTER_HOST='db-1', MASTER_PORT=3306, MASTER_USER='repl', MASTER_PASSWORD='pw', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1, MASTER_SSL=1, MASTER_SSL_VERIFY_SERVER_CERT=0"
        );
        let (mysql, maria) = (mysql84(), maria1011());
        assert_eq!(mysql.stop_replica(), "STOP REPLICA");
        assert_eq!(mysql.reset_replica_all(), "RESET REPLICA ALL");
        assert!(mysql.variables_query().contains("@@global.gtid_executed"));
        assert!(mysql.variables_query().contains("@@global.super_read_only"));
        assert_eq!(mysql.prepare_replica_position(), None);
        assert!(maria.variables_query().contains("gtid_current_pos"));
        assert!(!maria.has_super_read_only());
    }

    #[test]
    fn the_dead_mans_switch_statements_per_flavour() {
        assert_eq!(
            maria1011().arm_deadline_statements(6),
            vec![
                "CREATE OR REPLACE DEFINER = CURRENT_USER EVENT mysql.bloodraven_fence_deadline ON SCHEDULE AT CURRENT_TIMESTAMP + INTERVAL 6 SECOND ON COMPLETION NOT PRESERVE DO BEGIN SET SESSION sql_log_bin = 0; SET GLOBAL read_only = ON; END"
            ]
        );
        // MySQL 8 has no CREATE OR REPLACE EVENT, and fences with super_read_only.
        assert_eq!(
            mysql84().arm_deadline_statements(0),
            vec![
                "DROP EVENT IF EXISTS mysql.bloodraven_fence_deadline".to_string(),
                "CREATE DEFINER = CURRENT_USER EVENT mysql.bloodraven_fence_deadline ON SCHEDULE AT CURRENT_TIMESTAMP + INTERVAL 1 SECOND ON COMPLETION NOT PRESERVE DO BEGIN SET SESSION sql_log_bin = 0; SET GLOBAL super_read_only = ON; END".to_string(),
            ]
        );
    }

    #[test]
    fn quoting() {
        assert_eq!(quote("plain"), "'plain'");
        assert_eq!(quote("it's"), "'it''s'");
        assert_eq!(quote("back\\slash"), "'back\\\\slash'");
        assert_eq!(quote("nul\0"), "'nul\\0'");
    }

    #[test]
    fn replica_status_from_either_naming() {
        let maria: BTreeMap<String, Option<String>> = [
            ("Slave_IO_Running", Some("Yes")),
            ("Slave_SQL_Running", Some("No")),
            ("Seconds_Behind_Master", None),
            ("Master_Host", Some("127.0.0.1")),
            ("Master_Port", Some("3307")),
            ("Last_SQL_Errno", Some("1950")),
            (
                "Last_SQL_Error",
                Some("An attempt was made to binlog GTID 0-2-5"),
            ),
            ("Gtid_IO_Pos", Some("0-1-10")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
        .collect();
        let s = ReplicaStatus::from_columns(&maria);
        assert!(s.io_running && !s.sql_running && !s.running());
        assert_eq!(s.seconds_behind, None);
        assert_eq!((s.source_host.as_str(), s.source_port), ("127.0.0.1", 3307));
        assert_eq!(s.last_sql_errno, 1950);
        assert_eq!(s.gtid_io_pos, "0-1-10");

        let mysql: BTreeMap<String, Option<String>> = [
            ("Replica_IO_Running", Some("Connecting")),
            ("Replica_SQL_Running", Some("Yes")),
            ("Seconds_Behind_Source", Some("4")),
            ("Source_Host", Some("db1")),
            ("Source_Port", Some("3306")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
        .collect();
        let s = ReplicaStatus::from_columns(&mysql);
        assert!(s.io_connecting && !s.io_running && s.sql_running);
        assert_eq!(s.seconds_behind, Some(4));
        assert_eq!(s.source_host, "db1");

        // MariaDB's `Preparing` (connected, not yet reading) is a thread on its way up.
        let preparing: BTreeMap<String, Option<String>> = [
            ("Slave_IO_Running", Some("Preparing")),
            ("Slave_SQL_Running", Some("Yes")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
        .collect();
        let s = ReplicaStatus::from_columns(&preparing);
        assert!(s.io_connecting && !s.io_running);
    }

    #[test]
    fn application_sessions() {
        let s = |id, user: &str, command: &str| Session {
            host: "127.0.0.1:5555".into(),
            seconds: 3,
            id,
            user: user.into(),
            command: command.into(),
        };
        let spare = ["bloodraven"];
        assert!(is_application_session(&s(5, "app", "Query"), 1, &spare));
        assert!(is_application_session(&s(6, "root", "Sleep"), 1, &spare));
        assert!(
            !is_application_session(&s(1, "app", "Query"), 1, &spare),
            "own connection"
        );
        assert!(!is_application_session(
            &s(7, "repl", "Binlog Dump"),
            1,
            &spare
        ));
        assert!(!is_application_session(
            &s(8, "system user", "Slave_SQL"),
            1,
            &spare
        ));
        assert!(!is_application_session(
            &s(9, "event_scheduler", "Daemon"),
            1,
            &spare
        ));
        assert!(!is_application_session(
            &s(10, "bloodraven", "Query"),
            1,
            &spare
        ));
        assert!(!is_application_session(&s(11, "", "Daemon"), 1, &spare));
    }

    #[test]
    fn fence_bypass_detection() {
        let maria = maria1011();
        let grants = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        assert!(
            maria
                .fence_bypass_privileges(&grants(&[
                    "GRANT USAGE ON *.* TO `app`@`127.0.0.1`",
                    "GRANT SELECT, INSERT, UPDATE, DELETE ON `app`.* TO `app`@`127.0.0.1`"
                ]))
                .is_empty()
        );
        assert_eq!(
            maria.fence_bypass_privileges(&grants(&[
                "GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION"
            ])),
            vec!["ALL PRIVILEGES"]
        );
        assert_eq!(
            maria.fence_bypass_privileges(&grants(&[
                "GRANT SELECT, INSERT, READ_ONLY ADMIN ON *.* TO `x`@`%`"
            ])),
            vec!["READ ONLY ADMIN"]
        );
        // SUPER no longer bypasses read_only on 10.11, but does on older MariaDB.
        let super_grant = grants(&["GRANT SUPER, SELECT ON *.* TO `s`@`%`"]);
        assert!(maria.fence_bypass_privileges(&super_grant).is_empty());
        let old = Flavor::from_version("10.6.12-MariaDB").unwrap();
        assert_eq!(old.fence_bypass_privileges(&super_grant), vec!["SUPER"]);
        // ALL PRIVILEGES on one schema is not global.
        assert!(
            maria
                .fence_bypass_privileges(&grants(&["GRANT ALL PRIVILEGES ON `app`.* TO `a`@`%`"]))
                .is_empty()
        );
        let my = mysql84();
        assert_eq!(
            my.fence_bypass_privileges(&grants(&[
                "GRANT SELECT ON *.* TO `a`@`%`",
                "GRANT SYSTEM_VARIABLES_ADMIN ON *.* TO `a`@`%`"
            ])),
            vec!["SYSTEM_VARIABLES_ADMIN"]
        );
    }

    fn rows(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| ((*a).to_string(), (*b).to_string()))
            .collect()
    }

    #[test]
    fn semi_sync_statements_per_flavour_set_the_wait_point_and_timeout_before_enabling() {
        let maria = Flavor::from_version("10.11.19-MariaDB").unwrap();
        let mysql = Flavor::from_version("8.4.3").unwrap();
        let primary = Settings {
            source: true,
            replica: true,
        };
        assert_eq!(
            maria.semi_sync_statements(primary, false, false),
            vec![
                "SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_SYNC'",
                "SET GLOBAL rpl_semi_sync_master_timeout = 4294967295",
                "SET GLOBAL rpl_semi_sync_master_enabled = ON",
                "SET GLOBAL rpl_semi_sync_slave_enabled = ON",
            ]
        );
        assert_eq!(
            mysql.semi_sync_statements(primary, false, false),
            vec![
                "SET GLOBAL rpl_semi_sync_source_wait_point = 'AFTER_SYNC'",
                "SET GLOBAL rpl_semi_sync_source_timeout = 4294967295",
                "SET GLOBAL rpl_semi_sync_source_enabled = ON",
                "SET GLOBAL rpl_semi_sync_replica_enabled = ON",
            ]
        );
        let replica = Settings {
            source: false,
            replica: true,
        };
        // A running replica's IO thread restarts, or the change waits for its next reconnect.
        assert_eq!(
            mysql.semi_sync_statements(replica, true, true),
            vec![
                "SET GLOBAL rpl_semi_sync_source_enabled = OFF",
                "SET GLOBAL rpl_semi_sync_replica_enabled = ON",
                "STOP REPLICA IO_THREAD",
                "START REPLICA IO_THREAD",
            ]
        );
        assert_eq!(
            maria.semi_sync_statements(replica, true, true)[2..],
            ["STOP SLAVE IO_THREAD", "START SLAVE IO_THREAD"]
        );
        assert_eq!(maria.semi_sync_statements(replica, true, false).len(), 2);
    }

    #[test]
    fn semi_sync_state_reads_both_flavours_names_and_a_server_without_it() {
        let maria = semi_sync_state(
            &rows(&[
                ("rpl_semi_sync_master_enabled", "ON"),
                ("rpl_semi_sync_master_timeout", "4294967295"),
                ("rpl_semi_sync_master_wait_point", "AFTER_SYNC"),
                ("rpl_semi_sync_slave_enabled", "OFF"),
            ]),
            &rows(&[
                ("Rpl_semi_sync_master_clients", "2"),
                ("Rpl_semi_sync_master_status", "ON"),
                ("Rpl_semi_sync_master_wait_sessions", "1"),
                ("Rpl_semi_sync_slave_status", "OFF"),
            ]),
        );
        assert_eq!(
            maria,
            SemiSyncState {
                available: true,
                source_enabled: true,
                after_sync: true,
                timeout_ms: 4_294_967_295,
                source_active: true,
                source_clients: 2,
                waiting_sessions: 1,
                replica_enabled: false,
                replica_active: false,
            }
        );
        let mysql = semi_sync_state(
            &rows(&[
                ("rpl_semi_sync_source_enabled", "OFF"),
                ("rpl_semi_sync_source_wait_point", "AFTER_COMMIT"),
                ("rpl_semi_sync_replica_enabled", "ON"),
            ]),
            &rows(&[("Rpl_semi_sync_replica_status", "ON")]),
        );
        assert!(mysql.available && !mysql.source_enabled && !mysql.after_sync);
        assert!(mysql.replica_enabled && mysql.replica_active);
        assert_eq!(semi_sync_state(&[], &[]), SemiSyncState::default());
    }
}
