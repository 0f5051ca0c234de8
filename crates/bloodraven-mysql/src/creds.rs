//! MySQL credentials that cannot leak: the password prints as `<redacted>` through `Debug`
//! and `Display`, and load errors never echo file contents.

use std::fmt;
use std::path::Path;

/// A password. Only [`Password::expose`] reveals it, for the one call that needs it.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Password(String);

impl Password {
    pub fn new(s: impl Into<String>) -> Self {
        Password(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A user name and its password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: Password,
}

impl Credentials {
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            user: user.into(),
            password: Password::new(password),
        }
    }

    /// Parses a credentials file: `username=…` and `password=…` lines (`user=` is accepted
    /// for `username=`); blank lines and `#` comments are ignored; values are taken verbatim
    /// after the first `=` (no quoting), with a trailing `\r` removed.
    pub fn parse(text: &str) -> Result<Self, CredentialsError> {
        let mut user = None;
        let mut password = None;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.strip_suffix('\r').unwrap_or(raw);
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(CredentialsError::BadLine { line: i + 1 });
            };
            match k.trim() {
                "username" | "user" => user = Some(v.to_string()),
                "password" => password = Some(v.to_string()),
                _ => return Err(CredentialsError::UnknownKey { line: i + 1 }),
            }
        }
        let user = user.ok_or(CredentialsError::Missing { key: "username" })?;
        if user.is_empty() {
            return Err(CredentialsError::Missing { key: "username" });
        }
        let password = password.ok_or(CredentialsError::Missing { key: "password" })?;
        Ok(Credentials::new(user, password))
    }

    /// The text of a credentials file that [`Credentials::parse`] reads back as these
    /// credentials; it holds the password in clear (write it to a file only its owner reads).
    /// `None` when the format cannot hold them: an empty user name, or a line break in either.
    pub fn file_text(&self) -> Option<String> {
        let (user, password) = (self.user.as_str(), self.password.expose());
        let breaks = |s: &str| s.contains(['\n', '\r']);
        if user.is_empty() || breaks(user) || breaks(password) {
            return None;
        }
        Some(format!("username={user}\npassword={password}\n"))
    }

    /// Reads and parses a credentials file.
    pub fn load(path: &Path) -> Result<Self, CredentialsError> {
        let text = std::fs::read_to_string(path).map_err(|e| CredentialsError::Read {
            path: path.display().to_string(),
            reason: e.kind().to_string(),
        })?;
        Credentials::parse(&text)
    }
}

/// A credentials file could not be used. Never carries the file's contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    #[error("cannot read credentials file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("credentials file line {line}: expected key=value (username=… or password=…)")]
    BadLine { line: usize },
    #[error("credentials file line {line}: unknown key (expected username or password)")]
    UnknownKey { line: usize },
    #[error("credentials file has no {key}= line")]
    Missing { key: &'static str },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_redacts() {
        let c = Credentials::parse("# comment\nusername=bloodraven\npassword=s3cr=t\r\n").unwrap();
        assert_eq!(c.user, "bloodraven");
        assert_eq!(c.password.expose(), "s3cr=t");
        let dbg = format!("{c:?} {}", c.password);
        assert!(!dbg.contains("s3cr"), "{dbg}");
    }

    #[test]
    fn file_text_reads_back_as_the_same_credentials() {
        for (user, password) in [
            ("bloodraven", "s3cr=t"),
            ("a=b", "#not a comment"),
            ("u", ""),
            ("u", " spaced "),
        ] {
            let c = Credentials::new(user, password);
            let text = c.file_text().expect("representable");
            assert_eq!(
                Credentials::parse(&text).unwrap(),
                c,
                "{user:?} {password:?}"
            );
        }
        for (user, password) in [
            ("", "p"),
            ("u\n", "p"),
            ("u", "p\nusername=x"),
            ("u", "p\r"),
        ] {
            assert_eq!(Credentials::new(user, password).file_text(), None);
        }
    }

    #[test]
    fn errors_never_echo_contents() {
        let e = Credentials::parse("hunter2\n").unwrap_err();
        assert_eq!(e, CredentialsError::BadLine { line: 1 });
        assert!(!e.to_string().contains("hunter2"));
        let e = Credentials::parse("pass=hunter2").unwrap_err();
        assert!(!e.to_string().contains("hunter2"));
        assert_eq!(
            Credentials::parse("username=a").unwrap_err(),
            CredentialsError::Missing { key: "password" }
        );
        assert!(matches!(
            Credentials::load(Path::new("/nonexistent/cred")),
            Err(CredentialsError::Read { .. })
        ));
    }
}
