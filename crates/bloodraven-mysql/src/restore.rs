//! Loading a logical dump into a fenced server (restore-in-place): checking the dump, then
//! streaming it into `mariadb` with binary logging off for the session, so the load creates
//! no GTID and nothing of it replicates.
//!
//! The dump must be a whole `mariadb-dump` (or `mysqldump`) file: its first line names the
//! tool and its last says `-- Dump completed`, so a truncated file is refused before anything
//! is loaded. Replication statements a dump may carry (`CHANGE MASTER`, `SET GLOBAL
//! gtid_slave_pos`) are not run: the lines are blanked, so the client's line numbers in an
//! error are the file's.

use std::path::Path;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::clone::{
    Endpoint, LOAD_TOOL, OptionsFile, Progress, find_tool, private_dir, spawn, stderr_tail,
};

/// What a dump holds, read without loading it (`bloodraven restore-in-place --check`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpSummary {
    /// Its first line (the tool and its version).
    pub header: String,
    /// The databases it creates or switches to, in order.
    pub databases: Vec<String>,
    pub bytes: u64,
    pub lines: u64,
}

/// Why a restore's load failed. Nothing here carries a credential.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("cannot read the dump {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a mariadb-dump file: {why}")]
    NotADump { path: String, why: String },
    #[error(transparent)]
    Tool(#[from] crate::clone::CloneError),
    #[error("streaming {path} into {site} failed after {bytes} bytes: {source}")]
    Stream {
        path: String,
        site: String,
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("mariadb on {site} stopped the load{}: {stderr}", line.map(|l| format!(" at line {l} of the dump")).unwrap_or_default())]
    Load {
        site: String,
        line: Option<u64>,
        stderr: String,
    },
}

impl RestoreError {
    /// The dump itself is unusable (as opposed to the load failing).
    pub fn is_invalid_dump(&self) -> bool {
        matches!(self, RestoreError::NotADump { .. })
    }
}

/// Whether a line of the dump is a replication statement the load must not run.
fn replication_statement(line: &[u8]) -> bool {
    let l = String::from_utf8_lossy(&line[..line.len().min(64)]).to_ascii_uppercase();
    l.starts_with("CHANGE MASTER") || l.starts_with("SET GLOBAL GTID_SLAVE_POS")
}

/// The database a `CREATE DATABASE` or `USE` line names.
fn database_of(line: &str) -> Option<String> {
    let rest = line
        .strip_prefix("CREATE DATABASE /*!32312 IF NOT EXISTS*/ ")
        .or_else(|| line.strip_prefix("CREATE DATABASE IF NOT EXISTS "))
        .or_else(|| line.strip_prefix("CREATE DATABASE "))
        .or_else(|| line.strip_prefix("USE "))?;
    let name = rest.trim_start().strip_prefix('`')?;
    name.split('`').next().map(String::from)
}

/// Reads the whole dump: its header, its databases, whether it is complete.
pub async fn inspect(path: &Path) -> Result<DumpSummary, RestoreError> {
    let shown = path.display().to_string();
    let read = |source| RestoreError::Read {
        path: shown.clone(),
        source,
    };
    let file = tokio::fs::File::open(path).await.map_err(read)?;
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut line = Vec::new();
    let mut s = DumpSummary {
        header: String::new(),
        databases: Vec::new(),
        bytes: 0,
        lines: 0,
    };
    let mut last = String::new();
    let mut first = String::new();
    loop {
        line.clear();
        let n = r.read_until(b'\n', &mut line).await.map_err(read)?;
        if n == 0 {
            break;
        }
        s.bytes += n as u64;
        s.lines += 1;
        let text = String::from_utf8_lossy(&line[..line.len().min(256)]);
        let text = text.trim_end();
        // The header is the first line, or the second after the sandbox-mode comment that
        // MariaDB's dump tool writes first since 10.5.25 / 10.11.8
        // (`/*M!999999\- enable the sandbox mode */`).
        if s.lines <= 2
            && s.header.is_empty()
            && (text.starts_with("-- MariaDB dump") || text.starts_with("-- MySQL dump"))
        {
            s.header = text.to_string();
        }
        if s.lines == 1 {
            first = text.to_string();
        }
        if let Some(db) = database_of(text)
            && !s.databases.contains(&db)
        {
            s.databases.push(db);
        }
        if !text.is_empty() {
            last = text.to_string();
        }
    }
    let not = |why: String| RestoreError::NotADump {
        path: shown.clone(),
        why,
    };
    if s.header.is_empty() {
        return Err(not(format!(
            "its first line is {:?}, not a `-- MariaDB dump` header",
            first.chars().take(80).collect::<String>()
        )));
    }
    if !last.starts_with("-- Dump completed") {
        return Err(not(format!(
            "it does not end with `-- Dump completed` (truncated? its last line is {:?})",
            last.chars().take(80).collect::<String>()
        )));
    }
    Ok(s)
}

/// The line number of a `mariadb` client error ("… at line 57: …").
fn error_line(stderr: &str) -> Option<u64> {
    let at = stderr.find(" at line ")?;
    stderr[at + 9..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|d| d.parse().ok())
}

/// Streams the dump into `target` (fenced; the clone account may write under `read_only`),
/// binary logging off for the session, counting bytes into `progress`. Returns the bytes
/// loaded.
pub async fn load(
    path: &Path,
    target: &Endpoint,
    progress: &Progress,
) -> Result<u64, RestoreError> {
    find_tool(LOAD_TOOL)?;
    let shown = path.display().to_string();
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|source| RestoreError::Read {
            path: shown.clone(),
            source,
        })?;
    let dir = private_dir()?;
    let cnf = OptionsFile::write(&dir, "target.cnf", target)?;
    let mut client = spawn(LOAD_TOOL, &cnf.load_args(), true)?;
    let stderr = stderr_tail(&mut client);
    let Some(mut to) = client.stdin.take() else {
        return Err(RestoreError::Stream {
            path: shown,
            site: target.site.clone(),
            bytes: 0,
            source: std::io::Error::other("the client's stdin was not opened"),
        });
    };
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut line = Vec::new();
    let mut total = 0u64;
    let stream_err = |bytes, source| RestoreError::Stream {
        path: shown.clone(),
        site: target.site.clone(),
        bytes,
        source,
    };
    let piped: Result<(), RestoreError> = async {
        loop {
            line.clear();
            let n = r
                .read_until(b'\n', &mut line)
                .await
                .map_err(|e| stream_err(total, e))?;
            if n == 0 {
                break;
            }
            let out: &[u8] = if replication_statement(&line) {
                b"--\n"
            } else {
                &line
            };
            to.write_all(out).await.map_err(|e| stream_err(total, e))?;
            total += n as u64;
            progress.add(n as u64);
        }
        to.shutdown().await.map_err(|e| stream_err(total, e))?;
        Ok(())
    }
    .await;
    drop(to);
    let status = client.wait().await;
    let err = stderr.await.unwrap_or_default();
    if !status.as_ref().is_ok_and(std::process::ExitStatus::success) {
        return Err(RestoreError::Load {
            site: target.site.clone(),
            line: error_line(&err),
            stderr: if err.is_empty() {
                status.map_or_else(|e| e.to_string(), |s| s.to_string())
            } else {
                err
            },
        });
    }
    piped?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_the_databases_and_a_client_error_its_line() {
        assert_eq!(
            database_of(
                "CREATE DATABASE /*!32312 IF NOT EXISTS*/ `orders` /*!40100 DEFAULT CHARACTER SET latin1 */;"
            ),
            Some("orders".into())
        );
        assert_eq!(database_of("USE `app`;"), Some("app".into()));
        assert_eq!(database_of("INSERT INTO `t` VALUES (1)"), None);
        assert_eq!(
            error_line("ERROR 1064 (42000) at line 57: You have an error in your SQL syntax"),
            Some(57)
        );
        assert_eq!(error_line("ERROR 2002 (HY000): Can't connect"), None);
        assert!(replication_statement(
            b"CHANGE MASTER TO MASTER_LOG_FILE='x', MASTER_LOG_POS=4;\n"
        ));
        assert!(replication_statement(
            b"SET GLOBAL gtid_slave_pos='0-1-5';\n"
        ));
        assert!(!replication_statement(
            b"-- SET GLOBAL gtid_slave_pos='0-1-5';\n"
        ));
        assert!(!replication_statement(
            b"INSERT INTO t VALUES ('CHANGE MASTER')\n"
        ));
    }

    #[tokio::test]
    async fn an_incomplete_or_foreign_file_is_not_a_dump() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let whole = write(
            "whole.sql",
            "-- MariaDB dump 10.19  Distrib 10.11.6-MariaDB\n--\nCREATE DATABASE /*!32312 IF NOT EXISTS*/ `app`;\nUSE `app`;\nINSERT INTO t VALUES (1);\n-- Dump completed on 2027-01-15 10:00:00\n",
        );
        let s = inspect(&whole).await.unwrap();
        assert_eq!(s.databases, ["app"]);
        assert_eq!(s.lines, 6);
        // The sandbox-mode line newer dump tools write before the header.
        let sandboxed = write(
            "sandboxed.sql",
            "/*M!999999\\- enable the sandbox mode */ \n-- MariaDB dump 10.19-11.8.3-MariaDB\nUSE `app`;\n-- Dump completed on 2027-01-15 10:00:00\n",
        );
        let s = inspect(&sandboxed).await.unwrap();
        assert!(s.header.starts_with("-- MariaDB dump 10.19"), "{s:?}");
        let cut = write(
            "cut.sql",
            "-- MariaDB dump 10.19\nUSE `app`;\nINSERT INTO t VALUES (1),(2",
        );
        let e = inspect(&cut).await.unwrap_err();
        assert!(
            e.is_invalid_dump() && e.to_string().contains("Dump completed"),
            "{e}"
        );
        let foreign = write("x.sql", "SELECT 1;\n-- Dump completed\n");
        let e = inspect(&foreign).await.unwrap_err();
        assert!(e.to_string().contains("MariaDB dump"), "{e}");
        let e = inspect(&dir.path().join("missing.sql")).await.unwrap_err();
        assert!(e.to_string().contains("cannot read"), "{e}");
    }
}
