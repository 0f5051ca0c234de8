//! What every subcommand shares: the exit codes they all use, and how they run async code.
//! Each command adds its own codes (documented with it) after these.

use std::future::Future;

use std::sync::Arc;

use bloodraven_core::config::FailoverGroupSpec;
use bloodraven_core::resources::{FailoverGroupBody, KIND_GROUP};
use bloodraven_core::status::{OperationPhase as _, OperationStatus};
use bloodraven_operator::config::LoadedConfig;
use bloodraven_store::{ObjectKey, Store};

/// Exit codes shared by every subcommand.
pub mod exit {
    /// Done.
    pub const OK: i32 = 0;
    /// Could not run: a connection, local IO, the runtime.
    pub const ERROR: i32 = 1;
    /// Bad command-line input (also clap's own code).
    pub const USAGE: i32 = 2;
    /// The commands that request an operation and follow it (`failover`, `update`,
    /// `restore-in-place`, `site reclone`): it ended in `Failed`.
    pub const FAILED: i32 = 3;
    /// They too: `--wait` passed before it finished (it goes on without the command).
    pub const NOT_FINISHED: i32 = 4;
    /// They too: the request was refused (the rule it breaks is printed); nothing was
    /// written.
    pub const REFUSED: i32 = 5;
}

/// How a command runs its async code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// One thread: clients that make a few requests.
    CurrentThread,
    /// Worker threads: long-running servers and commands that supervise children.
    MultiThread,
}

/// Runs `fut` to completion on a new runtime and returns its value; a runtime that cannot
/// start is reported once and answered with [`exit::ERROR`].
pub fn block_on<F: Future>(flavor: Flavor, fut: F) -> Result<F::Output, i32> {
    let mut builder = match flavor {
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        Flavor::MultiThread => tokio::runtime::Builder::new_multi_thread(),
    };
    match builder.enable_all().build() {
        Ok(rt) => Ok(rt.block_on(fut)),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            Err(exit::ERROR)
        }
    }
}

/// [`block_on`] for a future that already yields the exit code.
pub fn run<F: Future<Output = i32>>(flavor: Flavor, fut: F) -> i32 {
    block_on(flavor, fut).unwrap_or_else(|code| code)
}

/// The store of the platform `cfg` names, for the commands that write requests into it (the
/// embedded store file, or the Kubernetes API: the same annotation either way). A data
/// directory moved to another platform is refused (nobody acts on requests written there).
/// `Err` carries the exit code; the message is already printed.
pub async fn platform_store(cfg: &LoadedConfig) -> Result<Arc<dyn Store>, i32> {
    match bloodraven_operator::platform::open(cfg).await {
        Ok(p) => Ok(p.store()),
        Err(e) => {
            eprintln!("error: {e}");
            Err(exit::ERROR)
        }
    }
}

/// `--wait`'s duration; `Err` carries the usage exit code, the message printed.
pub fn wait_flag(raw: &str) -> Result<std::time::Duration, i32> {
    bloodraven_core::duration::parse_duration(raw).map_err(|e| {
        eprintln!("error: --wait: {e}");
        exit::USAGE
    })
}

/// The operator's configuration file; `Err` carries the usage exit code, the problems
/// printed.
pub fn load_config(
    path: &std::path::Path,
) -> Result<bloodraven_operator::config::LoadedConfig, i32> {
    bloodraven_operator::config::load(path).map_err(|e| {
        eprintln!("error: {e}");
        exit::USAGE
    })
}

/// `--wait` and `--config` of a command that requests an operation and follows it, checked
/// in that order. `Err` carries the exit code; the message is already printed.
pub fn request_flags(
    wait: &str,
    config: &std::path::Path,
) -> Result<(std::time::Duration, LoadedConfig), i32> {
    Ok((wait_flag(wait)?, load_config(config)?))
}

/// The store of the platform `cfg` names and the group `name` in it, spec and status
/// ([`platform_store`] then [`stored_body`]). `Err` carries the exit code; the message is
/// already printed.
pub async fn open_group(
    cfg: &LoadedConfig,
    name: &str,
) -> Result<(Arc<dyn Store>, ObjectKey, FailoverGroupBody), i32> {
    let store = platform_store(cfg).await?;
    let (key, body) = stored_body(&*store, name).await?;
    Ok((store, key, body))
}

/// The stored group named `name` (in whichever namespace holds it), with its spec. `Err`
/// carries the exit code; the message is already printed.
pub async fn stored_group(
    store: &dyn Store,
    name: &str,
) -> Result<(ObjectKey, FailoverGroupSpec), i32> {
    stored_body(store, name).await.map(|(k, b)| (k, b.spec))
}

/// [`stored_group`] with its status too.
pub async fn stored_body(
    store: &dyn Store,
    name: &str,
) -> Result<(ObjectKey, FailoverGroupBody), i32> {
    let all = store.list(KIND_GROUP, None).await.map_err(|e| {
        eprintln!("error: cannot read the groups: {e}");
        exit::ERROR
    })?;
    let Some(obj) = all.iter().find(|o| o.metadata.name == name) else {
        let known: Vec<&str> = all.iter().map(|o| o.metadata.name.as_str()).collect();
        eprintln!(
            "error: --group: no group {name:?} in the store (groups: {}; has the operator run?)",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        );
        return Err(exit::USAGE);
    };
    let body: FailoverGroupBody = obj.decode().map_err(|e| {
        eprintln!("error: the stored group {name} cannot be read: {e}");
        exit::ERROR
    })?;
    Ok((obj.key(), body))
}

/// What a followed operation shows on one look at the stored group.
pub enum Progress {
    /// Nothing of it yet (the request is not taken).
    Nothing,
    /// In flight: this line, printed when it changed.
    Line(String),
    /// Ended: the last progress line, what to print, and the exit code.
    Ended {
        line: String,
        outcome: String,
        code: i32,
    },
}

impl Progress {
    /// How a look at an operation's status reads: `line` while it runs; when it ended, `what`
    /// (e.g. "reclone of pdx") succeeded, or failed with its reason, and its message.
    pub fn of<S: OperationStatus>(what: &str, line: String, status: &S) -> Progress {
        let phase = status.phase();
        let message = status.message();
        if phase == S::Phase::SUCCEEDED {
            Progress::Ended {
                line,
                outcome: format!("{what} succeeded: {message}"),
                code: exit::OK,
            }
        } else if phase == S::Phase::FAILED {
            Progress::Ended {
                line,
                outcome: format!(
                    "{what} failed: {}: {message}",
                    status.failure().unwrap_or("unknown")
                ),
                code: exit::FAILED,
            }
        } else {
            Progress::Line(line)
        }
    }

    /// The operator took the request and refused it; `event` is the reason of the event that
    /// says why.
    pub fn refused(event: &str) -> Progress {
        Progress::Ended {
            line: String::new(),
            outcome: format!("the operator refused the request (see the group's {event} event)"),
            code: exit::REFUSED,
        }
    }
}

/// What [`follow`] says and returns when `wait` passes before the operation ended.
#[derive(Clone, Copy, Debug)]
pub struct Unfinished {
    pub code: i32,
    /// Said after "not finished within N s; ".
    pub says: &'static str,
}

impl Unfinished {
    /// The operation goes on without the command.
    pub const GOES_ON: Unfinished = Unfinished {
        code: exit::NOT_FINISHED,
        says: "it goes on (follow it with `bloodraven status`)",
    };
}

/// [`follow_until`] for an operation that goes on without the command when `wait` passes.
pub async fn follow(
    store: &dyn Store,
    key: &ObjectKey,
    wait: std::time::Duration,
    look: impl FnMut(&bloodraven_store::RawObject, &FailoverGroupBody) -> Progress,
) -> i32 {
    follow_until(store, key, wait, Unfinished::GOES_ON, look).await
}

/// Follows an operation on the stored group `key` for up to `wait`, looking every 250 ms:
/// prints each new progress line on stderr and the outcome on stdout, and returns its exit
/// code, or says and returns `unfinished` when `wait` passes first.
pub async fn follow_until(
    store: &dyn Store,
    key: &ObjectKey,
    wait: std::time::Duration,
    unfinished: Unfinished,
    mut look: impl FnMut(&bloodraven_store::RawObject, &FailoverGroupBody) -> Progress,
) -> i32 {
    let deadline = tokio::time::Instant::now() + wait;
    let mut last = String::new();
    let mut show = |line: String| {
        if !line.is_empty() && line != last {
            eprintln!("{line}");
            last = line;
        }
    };
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(obj)) = store.get(key).await
            && let Ok(body) = obj.decode::<FailoverGroupBody>()
        {
            match look(&obj, &body) {
                Progress::Nothing => {}
                Progress::Line(l) => show(l),
                Progress::Ended {
                    line,
                    outcome,
                    code,
                } => {
                    show(line);
                    println!("{outcome}");
                    return code;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    eprintln!(
        "not finished within {} s; {}",
        wait.as_secs(),
        unfinished.says
    );
    unfinished.code
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bloodraven_core::resources::{API_VERSION, ObjectMeta};
    use bloodraven_core::status::RecloneStatus;
    use bloodraven_store::sqlite::{Durability, SqliteStore};
    use bloodraven_store::{RawObject, StoreExt as _};

    use super::*;

    fn reclone(wire: &str) -> RecloneStatus {
        serde_json::from_str(wire).unwrap()
    }

    /// (line printed, outcome, exit code), or only the line while it runs.
    fn read(p: Progress) -> (String, Option<(String, i32)>) {
        match p {
            Progress::Nothing => (String::new(), None),
            Progress::Line(l) => (l, None),
            Progress::Ended {
                line,
                outcome,
                code,
            } => (line, Some((outcome, code))),
        }
    }

    #[test]
    fn an_operation_is_followed_until_it_succeeds_or_fails() {
        let running = reclone(r#"{"phase":"Copying","message":"12 MB"}"#);
        assert_eq!(
            read(Progress::of("reclone of pdx", "copying".into(), &running)),
            ("copying".to_string(), None)
        );
        let done = reclone(r#"{"phase":"Succeeded","message":"caught up"}"#);
        assert_eq!(
            read(Progress::of("reclone of pdx", "done".into(), &done)),
            (
                "done".to_string(),
                Some(("reclone of pdx succeeded: caught up".to_string(), exit::OK))
            )
        );
        let failed = reclone(r#"{"phase":"Failed","reason":"CopyFailed","message":"dump died"}"#);
        assert_eq!(
            read(Progress::of("reclone of pdx", String::new(), &failed)).1,
            Some((
                "reclone of pdx failed: CopyFailed: dump died".to_string(),
                exit::FAILED
            ))
        );
        let no_reason = reclone(r#"{"phase":"Failed","message":"?"}"#);
        assert_eq!(
            read(Progress::of("reclone of pdx", String::new(), &no_reason)).1,
            Some((
                "reclone of pdx failed: unknown: ?".to_string(),
                exit::FAILED
            ))
        );
    }

    #[tokio::test]
    async fn following_returns_the_outcome_or_says_it_is_unfinished() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("store.db"), Durability::Normal).unwrap();
        let meta = ObjectMeta {
            name: "g1".into(),
            namespace: "default".into(),
            ..ObjectMeta::default()
        };
        let obj =
            RawObject::from_body(API_VERSION, KIND_GROUP, meta, &FailoverGroupBody::default())
                .unwrap();
        let key = store.create(obj).await.unwrap().key();
        let other = Unfinished {
            code: 9,
            says: "it stays",
        };
        // Ended at the first look: its code.
        let code = follow_until(&store, &key, Duration::from_secs(30), other, |_, _| {
            Progress::Ended {
                line: String::new(),
                outcome: "done".into(),
                code: 7,
            }
        })
        .await;
        assert_eq!(code, 7);
        // Never ends: the unfinished code, after looking more than once.
        let mut looks = 0;
        let code = follow_until(&store, &key, Duration::from_millis(600), other, |_, _| {
            looks += 1;
            Progress::Line("still".into())
        })
        .await;
        assert_eq!(code, 9);
        assert!(looks >= 2, "looked {looks} times");
        // The default: it goes on.
        let code = follow(&store, &key, Duration::ZERO, |_, _| unreachable!()).await;
        assert_eq!(code, exit::NOT_FINISHED);
    }
}
