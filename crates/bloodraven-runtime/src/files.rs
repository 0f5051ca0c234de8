//! Files that hold secrets (keys, passwords): written readable by their owner only, from the
//! moment they exist.

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
}
