//! The embedded platform's update of a site: its `spec.sites[].update.command`, run with the
//! site's name and addresses in its environment, its output logged line by line. The caller
//! bounds it with the site's update timeout; dropping the future kills the command.

use std::process::Stdio;

use bloodraven_core::config::SiteConfig;
use tokio::io::{AsyncBufReadExt, BufReader};

/// How many lines of a command's output are kept for its error message.
const TAIL_LINES: usize = 5;

/// Runs `site`'s update command to its end, logging its output line by line.
pub(crate) async fn run_command(group: &str, site: &SiteConfig) -> Result<(), String> {
    let Some((program, args)) = site.update_command().and_then(<[String]>::split_first) else {
        return Err(format!("{} has no update command", site.name));
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
        .map_err(|e| format!("cannot start {program:?}: {e}"))?;
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
    let status = child
        .wait()
        .await
        .map_err(|e| format!("waiting for {program:?}: {e}"))?;
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
    Err(format!(
        "{program:?} exited with {status}{}",
        if last.is_empty() {
            String::new()
        } else {
            format!("; its last output: {}", last.join(" | "))
        }
    ))
}
