//! Groups whose truth is the store, where several operators share it (etcd): created and
//! changed with `bloodraven apply -f FILE`, never by an operator because of its own file.
//!
//! # Invariants
//! - Nothing here writes to the store. A leader acts on the stored spec; its file is only
//!   compared with it ([`GroupSource::drift`]: condition `ConfigInSync`/`ConfigDrift`, metric
//!   `bloodraven_config_drift`), and a group in the file but not in the store is reported.
//! - Local things stay local: credential files named by a stored spec are resolved against
//!   this operator's own configuration directory, and a site's `update.command` runs only
//!   when this operator's own file names the same command for that site (writing the store
//!   is not a way to run commands on operator hosts).
//! - Drift compares what a user configures ([`FailoverGroupSpec::configured`]): the request
//!   blocks commands write into the spec, the status and the annotations are not compared.

use std::path::PathBuf;
use std::sync::Arc;

use bloodraven_core::config::{FailoverGroupSpec, GroupConfig, validate_group};
use bloodraven_core::resources::{FailoverGroupBody, KIND_DATABASE};
use bloodraven_core::time::Timestamp;
use bloodraven_store::{RawObject, Store};
use serde_json::Value;

use super::{GroupRefused, GroupSource, PlatformFuture, PrepareError};
use crate::config::{DatabaseDoc, GroupDoc, LoadedConfig, resolve_credentials};

/// The stored groups, compared with this operator's file.
#[derive(Debug)]
pub struct StoredGroups {
    groups: Vec<GroupDoc>,
    databases: Vec<DatabaseDoc>,
    /// This operator's configuration directory: relative credential paths resolve here.
    base: PathBuf,
}

impl StoredGroups {
    pub fn of(cfg: &LoadedConfig) -> Self {
        StoredGroups {
            groups: cfg.groups.clone(),
            databases: cfg.databases.clone(),
            base: cfg.base.clone(),
        }
    }

    fn file_group(&self, obj: &RawObject) -> Option<&GroupDoc> {
        self.groups.iter().find(|g| {
            g.metadata.name == obj.metadata.name && g.metadata.namespace == obj.metadata.namespace
        })
    }

    /// A stored spec as this operator runs it: credential paths resolved here, and update
    /// commands kept only where this operator's own file names the same one.
    fn local(&self, obj: &RawObject, mut spec: FailoverGroupSpec) -> FailoverGroupSpec {
        let _ = resolve_credentials(&mut spec, &self.base, false);
        let own = self.file_group(obj);
        for site in &mut spec.sites {
            let Some(update) = site.update.as_ref() else {
                continue;
            };
            let same = own
                .and_then(|g| g.spec.sites.iter().find(|s| s.name == site.name))
                .and_then(|s| s.update.as_ref())
                .is_some_and(|u| u.command == update.command);
            if !same && !update.command.is_empty() {
                tracing::warn!(group = %obj.metadata.name, site = %site.name, "the stored spec names an update command for this site that this operator's own configuration file does not: it is not run here (docs/security.md)");
                site.update = None;
            }
        }
        spec
    }
}

impl GroupSource for StoredGroups {
    /// Writes nothing: reports the file's databases the store lacks or holds otherwise (the
    /// groups are reported by [`GroupSource::unstored`] and [`GroupSource::drift`]).
    fn prepare<'a>(
        &'a self,
        store: &'a Arc<dyn Store>,
        _now: Timestamp,
    ) -> PlatformFuture<'a, Result<(), PrepareError>> {
        Box::pin(async move {
            let stored = store.list(KIND_DATABASE, None).await?;
            for d in &self.databases {
                let found = stored.iter().find(|o| {
                    o.metadata.name == d.metadata.name
                        && o.metadata.namespace == d.metadata.namespace
                });
                let want = serde_json::to_value(&d.spec).unwrap_or(Value::Null);
                match found {
                    None => {
                        tracing::warn!(database = %d.metadata.name, namespace = %d.metadata.namespace, "{}: this operator's configuration file has a MysqlDatabase the store lacks; not created (`bloodraven apply -f FILE` creates it)", bloodraven_core::reason::ConditionReason::ConfigDrift.as_str());
                    }
                    Some(o) if o.body.get("spec") != Some(&want) => {
                        let mut fields = Vec::new();
                        differences(
                            o.body.get("spec").unwrap_or(&Value::Null),
                            &want,
                            "spec",
                            &mut fields,
                        );
                        tracing::warn!(database = %d.metadata.name, namespace = %d.metadata.namespace, fields = %fields.join(", "), "{}: this operator's configuration file differs from the stored MysqlDatabase, which is in force", bloodraven_core::reason::ConditionReason::ConfigDrift.as_str());
                    }
                    Some(_) => {}
                }
            }
            Ok(())
        })
    }

    fn config_of(&self, obj: &RawObject) -> Result<GroupConfig, GroupRefused> {
        let body: FailoverGroupBody = obj.decode().map_err(GroupRefused::Decode)?;
        let spec = self.local(obj, body.spec);
        validate_group(&obj.metadata.name, &obj.metadata.namespace, &spec)
            .map_err(GroupRefused::Invalid)
    }

    fn drift(&self, obj: &RawObject) -> Option<Vec<String>> {
        let Some(own) = self.file_group(obj) else {
            return Some(vec![
                "(the group is not in this operator's configuration file)".into(),
            ]);
        };
        let stored = obj
            .decode::<FailoverGroupBody>()
            .map(|b| {
                let mut spec = b.spec.configured();
                let _ = resolve_credentials(&mut spec, &self.base, false);
                spec
            })
            .ok()?;
        let a = serde_json::to_value(&stored).ok()?;
        let b = serde_json::to_value(own.spec.configured()).ok()?;
        let mut fields = Vec::new();
        differences(&a, &b, "spec", &mut fields);
        Some(fields)
    }

    fn unstored(&self, stored: &[RawObject]) -> Vec<(String, String)> {
        self.groups
            .iter()
            .filter(|g| {
                !stored.iter().any(|o| {
                    o.metadata.name == g.metadata.name
                        && o.metadata.namespace == g.metadata.namespace
                })
            })
            .map(|g| (g.metadata.namespace.clone(), g.metadata.name.clone()))
            .collect()
    }

    fn dynamic(&self) -> bool {
        true
    }
}

/// The paths under `at` where `a` and `b` differ (`spec.sites[1].priority`), leaves first
/// named; a field only one side has is named once.
pub fn differences(a: &Value, b: &Value, at: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (l, r) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                differences(l, r, &format!("{at}.{k}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (l, r)) in x.iter().zip(y).enumerate() {
                differences(l, r, &format!("{at}[{i}]"), out);
            }
        }
        _ if a != b => out.push(at.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn differences_name_the_leaves_that_differ() {
        let a = json!({"failoverCooldown": "5s", "sites": [{"name": "iad", "priority": 1}, {"name": "pdx"}], "same": {"x": 1}});
        let b = json!({"failoverCooldown": "47s", "sites": [{"name": "iad", "priority": 2}, {"name": "pdx"}], "same": {"x": 1}, "extra": true});
        let mut out = Vec::new();
        differences(&a, &b, "spec", &mut out);
        assert_eq!(
            out,
            [
                "spec.extra",
                "spec.failoverCooldown",
                "spec.sites[0].priority"
            ]
        );
        let mut out = Vec::new();
        differences(
            &json!({"sites": [1]}),
            &json!({"sites": [1, 2]}),
            "spec",
            &mut out,
        );
        assert_eq!(out, ["spec.sites"]);
        let mut none = Vec::new();
        differences(&a, &a, "spec", &mut none);
        assert!(none.is_empty());
    }
}
