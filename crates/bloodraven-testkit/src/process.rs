//! Child processes a test or a bench starts and must not leave behind.

use std::ops::{Deref, DerefMut};
use std::process::Child;

/// A child process killed (`kill -9`) and reaped when dropped, so a failed assertion never
/// leaves one running after its directory is gone.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl From<Child> for KillOnDrop {
    fn from(c: Child) -> Self {
        KillOnDrop(c)
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to its end: its exit code (`-1` when a signal ended it), standard output and
/// standard error.
pub fn outcome(cmd: &mut std::process::Command) -> (i32, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
