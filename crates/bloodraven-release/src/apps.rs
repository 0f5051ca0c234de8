//! The applications file (`--apps FILE`, default `~/.config/bloodraven/apps.yaml`): which
//! application `--app NAME` means — its namespace and the selector its Pods carry.
//!
//! ```yaml
//! applications:
//!   - name: web
//!     namespace: shop
//!     selector: app=web,tier=frontend
//!   - name: api
//!     selector: app in (api, api-canary)
//! ```
//!
//! Every problem names the file and the field (`applications[1].selector`) and the rule.

use std::path::{Path, PathBuf};

use bloodraven_core::names::check_dns1123_label;
use bloodraven_core::release::AppCheck;
use bloodraven_core::release::selector::Selector;
use serde::Deserialize;

/// One application of the file.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Application {
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub selector: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppsFile {
    applications: Vec<Application>,
}

/// An application found in the file, checked.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub check: AppCheck,
    /// The application's namespace, when the file names one.
    pub namespace: Option<String>,
}

/// Why `--app` could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum AppsError {
    #[error(
        "--apps {path}: cannot read it ({source}); it lists each application's name, namespace and selector (see docs/release.md)"
    )]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("--apps {path}: {detail}")]
    Invalid { path: String, detail: String },
    #[error("--app {name}: no such application in {path} (applications: {known})")]
    Unknown {
        name: String,
        path: String,
        known: String,
    },
}

/// `~/.config/bloodraven/apps.yaml` (under `$XDG_CONFIG_HOME` when set).
pub fn default_path() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("bloodraven/apps.yaml"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/bloodraven/apps.yaml"))
}

/// Parses and checks an applications file's text.
pub fn parse(text: &str, path: &Path) -> Result<Vec<Application>, AppsError> {
    let shown = path.display().to_string();
    let invalid = |detail: String| AppsError::Invalid {
        path: shown.clone(),
        detail,
    };
    let file: AppsFile = serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?;
    let mut seen = std::collections::BTreeSet::new();
    for (i, a) in file.applications.iter().enumerate() {
        let field = |f: &str| format!("applications[{i}].{f}");
        if a.name.trim().is_empty() {
            return Err(invalid(format!("{}: must not be empty", field("name"))));
        }
        if !seen.insert(a.name.clone()) {
            return Err(invalid(format!(
                "{}: {:?} is listed twice",
                field("name"),
                a.name
            )));
        }
        if let Some(ns) = &a.namespace
            && let Err(rule) = check_dns1123_label(ns)
        {
            return Err(invalid(format!("{}: {rule}", field("namespace"))));
        }
        Selector::parse(&a.selector).map_err(|e| invalid(format!("{}: {e}", field("selector"))))?;
    }
    Ok(file.applications)
}

/// Finds application `name` in the file at `path`.
pub fn resolve(name: &str, path: &Path) -> Result<Resolved, AppsError> {
    let text = std::fs::read_to_string(path).map_err(|source| AppsError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let apps = parse(&text, path)?;
    let Some(a) = apps.iter().find(|a| a.name == name) else {
        return Err(AppsError::Unknown {
            name: name.to_owned(),
            path: path.display().to_string(),
            known: if apps.is_empty() {
                "none".to_owned()
            } else {
                apps.iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        });
    };
    let selector = Selector::parse(&a.selector).map_err(|e| AppsError::Invalid {
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    Ok(Resolved {
        check: AppCheck::Selector {
            name: Some(a.name.clone()),
            selector,
        },
        namespace: a.namespace.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_an_application_and_names_every_problem() {
        let dir = std::env::temp_dir().join(format!("bloodraven-apps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("apps.yaml");
        std::fs::write(
            &p,
            "applications:\n  - name: web\n    namespace: shop\n    selector: app=web,tier in (frontend)\n  - name: api\n    selector: app=api\n",
        )
        .unwrap();
        let r = resolve("web", &p).unwrap();
        assert_eq!(r.namespace.as_deref(), Some("shop"));
        assert!(matches!(r.check, AppCheck::Selector { name: Some(ref n), .. } if n == "web"));
        let e = resolve("billing", &p).unwrap_err().to_string();
        assert!(
            e.contains("--app billing: no such application") && e.contains("web, api"),
            "{e}"
        );
        let e = resolve("web", &dir.join("missing.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read it"), "{e}");

        for (text, want) in [
            (
                "applications:\n  - name: web\n    selector: \"\"\n",
                "applications[0].selector: must not be empty",
            ),
            (
                "applications:\n  - name: web\n    selector: app=-x\n",
                "applications[0].selector",
            ),
            (
                "applications:\n  - name: web\n    namespace: Shop\n    selector: app=web\n",
                "applications[0].namespace",
            ),
            (
                "applications:\n  - name: a\n    selector: x=1\n  - name: a\n    selector: x=2\n",
                "applications[1].name: \"a\" is listed twice",
            ),
            (
                "applications:\n  - name: a\n    selector: x=1\n    extra: 1\n",
                "extra",
            ),
            ("apps: []\n", "apps"),
        ] {
            let e = parse(text, &p).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
