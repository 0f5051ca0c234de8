//! Files the processes write or read beside their work: secrets (keys, passwords), written
//! readable by their owner only from the moment they exist, and the tail of a log for an
//! error that explains itself.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// Writes `text` to `path`, readable by its owner only: a new file is created so, never
/// readable by others for a moment; an existing one is narrowed before it is rewritten.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    if path.exists() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?
        .write_all(text.as_bytes())
}

/// The last `lines` lines of a log file (empty when it cannot be read), for an error that
/// should explain itself without a second look.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn private_files_are_never_readable_by_others() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new.cred");
        write_private(&new, "username=a\npassword=b\n").unwrap();
        assert_eq!(mode(&new), 0o600);
        assert_eq!(
            std::fs::read_to_string(&new).unwrap(),
            "username=a\npassword=b\n"
        );
        // A file left readable by others is narrowed, then rewritten whole.
        let old = dir.path().join("old.cred");
        std::fs::write(&old, "a much longer text than the new one\n").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&old, "short\n").unwrap();
        assert_eq!(mode(&old), 0o600);
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "short\n");
        let missing = dir.path().join("no-such-dir").join("x");
        assert!(write_private(&missing, "x").is_err());
    }

    #[test]
    fn tail_keeps_the_last_lines_and_is_empty_when_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.err");
        std::fs::write(&log, "one\ntwo\nthree\n").unwrap();
        assert_eq!(tail(&log, 2), "two\nthree");
        assert_eq!(tail(&log, 10), "one\ntwo\nthree");
        assert_eq!(tail(&log, 0), "");
        assert_eq!(tail(&dir.path().join("missing"), 5), "");
    }
}
