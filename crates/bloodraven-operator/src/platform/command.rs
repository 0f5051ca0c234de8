//! The embedded platform's update of a site: its `spec.sites[].update.command`, run with the
//! site's name and addresses in its environment, its output logged line by line. The caller
//! bounds it with the site's update timeout; dropping the future kills the command.

use std::process::Stdio;

use bloodraven_core::config::SiteConfig;
use tokio::io::{AsyncBufReadExt, BufReader};

/// How many lines of a command's output are kept for its error message.
const TAIL_LINES: usize = 5;

/// Why an update command did not succeed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CommandError {
    #[error("{site} has no update command")]
    Missing { site: String },
    #[error("cannot start {program:?}: {source}")]
    Start {
        program: String,
        source: std::io::Error,
    },
    #[error("waiting for {program:?}: {source}")]
    Wait {
        program: String,
        source: std::io::Error,
    },
    /// It ran and failed; `last` is its last lines of output (stdout and stderr as they
    /// came).
    #[error("{program:?} exited with {status}{}", last_output(last))]
    Exited {
        program: String,
        status: std::process::ExitStatus,
        last: Vec<String>,
    },
}

fn last_output(last: &[String]) -> String {
    if last.is_empty() {
        String::new()
    } else {
        format!("; its last output: {}", last.join(" | "))
    }
}

/// Runs `site`'s update command to its end, logging its output line by line.
pub(crate) async fn run_command(group: &str, site: &SiteConfig) -> Result<(), CommandError> {
    let Some((program, args)) = site.update_command().and_then(<[String]>::split_first) else {
        return Err(CommandError::Missing {
            site: site.name.clone(),
        });
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("BLOODRAVEN_GROUP", group)
        .env("BLOODRAVEN_SITE", &site.name)
        .env("BLOODRAVEN_MYSQL_HOST", &site.mysql_host)
        .env("BLOODRAVEN_MYSQL_PORT", site.mysql_port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| CommandError::Start {
            program: program.clone(),
            source,
        })?;
    let tail = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    let mut readers = Vec::new();
    for (stream, out) in [
        (
            "stdout",
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
        (
            "stderr",
            child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
    ] {
        let Some(out) = out else { continue };
        let (group, name, tail) = (group.to_string(), site.name.clone(), tail.clone());
        readers.push(tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(group = %group, site = %name, stream, "update: {line}");
                let mut t = tail
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                t.push_back(line);
                if t.len() > TAIL_LINES {
                    t.pop_front();
                }
            }
        }));
    }
    // Dropped at the caller's timeout: `kill_on_drop` kills the command.
    let status = child.wait().await.map_err(|source| CommandError::Wait {
        program: program.clone(),
        source,
    })?;
    for r in readers {
        let _ = r.await;
    }
    if status.success() {
        return Ok(());
    }
    let last: Vec<String> = tail
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .cloned()
        .collect();
    Err(CommandError::Exited {
        program: program.clone(),
        status,
        last,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloodraven_core::config::{CredentialsRef, SiteRole, SiteUpdate};

    fn site(command: &[&str]) -> SiteConfig {
        SiteConfig {
            name: "pdx".into(),
            role: SiteRole::PrimaryCandidate,
            mysql_host: "127.0.0.1".into(),
            mysql_port: 3307,
            credentials: CredentialsRef::default(),
            mysql_tls: bloodraven_core::config::MysqlTls::default(),
            replication_host: "127.0.0.1".into(),
            replication_port: 3307,
            sidecar_url: "http://127.0.0.1:1".into(),
            priority: 0,
            update: Some(SiteUpdate {
                command: command.iter().map(|c| (*c).to_string()).collect(),
                timeout: std::time::Duration::from_secs(30),
            }),
            selector: None,
            workload: None,
        }
    }

    #[tokio::test]
    async fn a_command_runs_with_the_site_in_its_environment() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("seen");
        let script = format!(
            "echo \"$BLOODRAVEN_GROUP $BLOODRAVEN_SITE $BLOODRAVEN_MYSQL_HOST:$BLOODRAVEN_MYSQL_PORT\" > {}",
            out.display()
        );
        run_command("g1", &site(&["sh", "-c", &script]))
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "g1 pdx 127.0.0.1:3307\n"
        );
    }

    #[tokio::test]
    async fn a_failed_command_says_how_it_exited_and_its_last_output() {
        let script = "for i in 1 2 3 4 5 6; do echo line$i; done; echo oops >&2; exit 3";
        let e = run_command("g1", &site(&["sh", "-c", script]))
            .await
            .unwrap_err();
        let CommandError::Exited { last, .. } = &e else {
            panic!("{e:?}");
        };
        // The last five lines, whichever stream each came on.
        assert_eq!(last.len(), TAIL_LINES);
        assert!(last.contains(&"oops".to_string()), "{last:?}");
        assert!(!last.contains(&"line1".to_string()), "{last:?}");
        let shown = e.to_string();
        assert!(shown.starts_with("\"sh\" exited with exit status: 3; its last output: "));
        assert!(shown.contains("oops"), "{shown}");

        let e = run_command("g1", &site(&["/no/such/updater"]))
            .await
            .unwrap_err();
        assert!(matches!(e, CommandError::Start { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("cannot start \"/no/such/updater\": ")
        );

        let e = run_command("g1", &site(&[])).await.unwrap_err();
        assert_eq!(e.to_string(), "pdx has no update command");
    }
}
