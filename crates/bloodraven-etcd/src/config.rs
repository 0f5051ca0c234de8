//! `store.etcd` of the operator's configuration: the names of the specification
//! (`endpoints`, `prefix`, `caFile`, `certFile`, `keyFile`, `username`, `passwordFile`,
//! `leaseTTL`), their defaults and their checks, resolved into what the client, the store and
//! the election take.

use std::path::PathBuf;
use std::time::Duration;

use bloodraven_runtime::tls::ClientIdentity;
use serde::Deserialize;

use crate::client::ClientOptions;
use crate::election::DEFAULT_TTL;

/// The key prefix when the configuration gives none.
pub const DEFAULT_PREFIX: &str = "/bloodraven/";

/// The shortest lease TTL accepted: etcd's own minimum with its default timings (1.5 election
/// timeouts of 1 s, rounded up).
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// `store.etcd` as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs of the members.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Default `/bloodraven/`.
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// A duration (`10s`, the default): whole seconds, at least 2 s.
    #[serde(default, rename = "leaseTTL")]
    pub lease_ttl: Option<String>,
}

/// `store.etcd`, checked and with its defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdSettings {
    pub client: ClientOptions,
    pub prefix: String,
    pub lease_ttl: Duration,
}

impl EtcdSettings {
    /// `<prefix>leader`.
    pub fn leader_key(&self) -> String {
        format!("{}leader", self.prefix)
    }
}

/// A rule of `store.etcd` that the configuration breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("store.etcd.{field}: {rule}")]
pub struct EtcdConfigError {
    pub field: &'static str,
    pub rule: String,
}

impl EtcdConfig {
    /// Checks the configuration; the error names the field (`store.etcd.…`).
    pub fn resolve(&self) -> Result<EtcdSettings, EtcdConfigError> {
        let field = |field: &'static str, rule: &str| EtcdConfigError {
            field,
            rule: rule.to_string(),
        };
        if self.endpoints.iter().all(|e| e.trim().is_empty()) {
            return Err(field("endpoints", "name at least one member's client URL"));
        }
        let prefix = self.prefix.clone().unwrap_or_else(|| DEFAULT_PREFIX.into());
        if prefix.is_empty() || !prefix.ends_with('/') {
            return Err(field("prefix", "must end with '/' (as /bloodraven/ does)"));
        }
        let identity = match (&self.cert_file, &self.key_file) {
            (None, None) => None,
            (Some(cert_file), Some(key_file)) => Some(ClientIdentity {
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
            }),
            _ => return Err(field("certFile", "certFile and keyFile go together")),
        };
        if identity.is_some() && self.ca_file.is_none() {
            return Err(field(
                "caFile",
                "a client certificate needs TLS: give caFile",
            ));
        }
        if self.username.is_some() != self.password_file.is_some() {
            return Err(field("username", "username and passwordFile go together"));
        }
        let lease_ttl = match &self.lease_ttl {
            None => DEFAULT_TTL,
            Some(text) => bloodraven_core::duration::parse_duration(text)
                .map_err(|e| field("leaseTTL", &e.to_string()))?,
        };
        if lease_ttl.subsec_nanos() != 0 || lease_ttl < MIN_LEASE_TTL {
            return Err(field(
                "leaseTTL",
                "must be whole seconds, at least 2s (etcd grants leases in seconds)",
            ));
        }
        let mut client = ClientOptions::new(
            self.endpoints
                .iter()
                .filter(|e| !e.trim().is_empty())
                .cloned(),
        );
        client.ca_file.clone_from(&self.ca_file);
        client.identity = identity;
        client.username.clone_from(&self.username);
        client.password_file.clone_from(&self.password_file);
        Ok(EtcdSettings {
            client,
            prefix,
            lease_ttl,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<EtcdSettings, Box<dyn std::error::Error>> {
        Ok(serde_json::from_str::<EtcdConfig>(json)?.resolve()?)
    }

    #[test]
    fn defaults_and_names_of_the_specification() {
        let s = parse(r#"{"endpoints": ["https://etcd-0:2379", "https://etcd-1:2379"], "caFile": "/etc/ca.crt",
                          "certFile": "/etc/c.crt", "keyFile": "/etc/c.key", "username": "bloodraven",
                          "passwordFile": "/etc/pw", "leaseTTL": "15s"}"#)
        .unwrap();
        assert_eq!(s.prefix, "/bloodraven/");
        assert_eq!(s.leader_key(), "/bloodraven/leader");
        assert_eq!(s.lease_ttl, Duration::from_secs(15));
        assert_eq!(s.client.endpoints.len(), 2);
        assert!(s.client.identity.is_some());
        let d = parse(r#"{"endpoints": ["127.0.0.1:2379"]}"#).unwrap();
        assert_eq!(d.lease_ttl, Duration::from_secs(10));
        assert!(d.client.username.is_none());
    }

    #[test]
    fn each_mistake_names_its_field() {
        for (json, field) in [
            (r#"{"endpoints": []}"#, "endpoints"),
            (r#"{"endpoints": ["a:1"], "prefix": "/x"}"#, "prefix"),
            (r#"{"endpoints": ["a:1"], "certFile": "c"}"#, "certFile"),
            (
                r#"{"endpoints": ["a:1"], "certFile": "c", "keyFile": "k"}"#,
                "caFile",
            ),
            (r#"{"endpoints": ["a:1"], "username": "u"}"#, "username"),
            (
                r#"{"endpoints": ["a:1"], "leaseTTL": "1500ms"}"#,
                "leaseTTL",
            ),
            (r#"{"endpoints": ["a:1"], "leaseTTL": "1s"}"#, "leaseTTL"),
            (r#"{"endpoints": ["a:1"], "leaseTTL": "soon"}"#, "leaseTTL"),
        ] {
            let err = parse(json).unwrap_err().to_string();
            assert!(
                err.contains(&format!("store.etcd.{field}")),
                "{json}: {err}"
            );
        }
        let unknown = parse(r#"{"endpoints": ["a:1"], "leaseTtl": "10s"}"#)
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("unknown field"), "{unknown}");
    }
}
