//! Whether the group's database links are as secure as its spec says: the verdict behind the
//! informational condition `TransportSecure`.
//!
//! The product checks; the user decides: it never sets `require_secure_transport` on a
//! server, it only says which servers accept clear-text logins (`InsecureTransport`). A
//! replica that does not replicate over TLS as `spec.replication.tls` asks, or that cannot
//! verify its source, is `ReplicationInsecure` (first: it is what the spec asked for).

use crate::config::{ReplicationTls, TlsMode};
use crate::reason::ConditionReason;

/// One site's transport, as its last probe showed it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransportView {
    pub site: String,
    /// The probe answered this poll.
    pub answered: bool,
    /// `require_secure_transport` (`None`: unknown).
    pub require_secure_transport: Option<bool>,
    /// As a replica: the link to its source.
    pub replica: Option<ReplicaTransport>,
}

/// A replica's link to its source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaTransport {
    /// `Master_SSL_Allowed`.
    pub ssl: bool,
    /// `Master_SSL_Verify_Server_Cert`.
    pub verifies: bool,
    /// The IO thread's last error when it is a TLS failure (the certificate not verified).
    pub tls_error: Option<String>,
}

/// What is insecure: the reason and a message naming the sites; `None` when nothing is.
pub fn verdict(
    sites: &[TransportView],
    want: &ReplicationTls,
) -> Option<(ConditionReason, String)> {
    let answered = || sites.iter().filter(|s| s.answered);
    let mut replication = Vec::new();
    for s in answered() {
        let Some(r) = &s.replica else { continue };
        if let Some(e) = &r.tls_error {
            replication.push(format!("{} cannot verify its source ({e})", s.site));
        } else if want.mode.encrypts() && !r.ssl {
            replication.push(format!("{} replicates in clear text", s.site));
        } else if want.mode == TlsMode::VerifyIdentity && !r.verifies {
            replication.push(format!(
                "{} does not verify its source's certificate",
                s.site
            ));
        }
    }
    if !replication.is_empty() {
        return Some((
            ConditionReason::ReplicationInsecure,
            format!(
                "{} (spec.replication.tls.mode {})",
                replication.join("; "),
                want.mode.as_str()
            ),
        ));
    }
    let clear: Vec<&str> = answered()
        .filter(|s| s.require_secure_transport == Some(false))
        .map(|s| s.site.as_str())
        .collect();
    if clear.is_empty() {
        return None;
    }
    Some((
        ConditionReason::InsecureTransport,
        format!(
            "{} accept clear-text logins (require_secure_transport=OFF); Bloodraven does not change that: set it on the servers once every client uses TLS",
            clear.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(name: &str, secure: Option<bool>, replica: Option<ReplicaTransport>) -> TransportView {
        TransportView {
            site: name.into(),
            answered: true,
            require_secure_transport: secure,
            replica,
        }
    }

    fn verified() -> ReplicaTransport {
        ReplicaTransport {
            ssl: true,
            verifies: true,
            tls_error: None,
        }
    }

    #[test]
    fn replication_first_then_clear_text_logins_then_nothing() {
        let want = ReplicationTls {
            mode: TlsMode::VerifyIdentity,
            ca_file: Some("/ca.crt".into()),
        };
        let good = vec![
            site("iad", Some(true), None),
            site("pdx", Some(true), Some(verified())),
        ];
        assert_eq!(verdict(&good, &want), None);
        let mut open = good.clone();
        open[0].require_secure_transport = Some(false);
        let (r, m) = verdict(&open, &want).unwrap();
        assert_eq!(r, ConditionReason::InsecureTransport);
        assert!(m.starts_with("iad accept"), "{m}");
        let mut unverified = open.clone();
        unverified[1].replica = Some(ReplicaTransport {
            verifies: false,
            ..verified()
        });
        let (r, m) = verdict(&unverified, &want).unwrap();
        assert_eq!(r, ConditionReason::ReplicationInsecure);
        assert!(m.contains("pdx does not verify"), "{m}");
        let mut refused = good.clone();
        refused[1].replica = Some(ReplicaTransport {
            tls_error: Some("SSL certificate validation failure".into()),
            ..verified()
        });
        let (r, m) = verdict(&refused, &want).unwrap();
        assert_eq!(r, ConditionReason::ReplicationInsecure);
        assert!(
            m.contains("pdx cannot verify its source (SSL certificate"),
            "{m}"
        );
        // Clear-text replication is what a group without spec.replication.tls asked for.
        let plain = vec![site("pdx", None, Some(ReplicaTransport::default()))];
        assert_eq!(verdict(&plain, &ReplicationTls::default()), None);
        let required = ReplicationTls {
            mode: TlsMode::Required,
            ca_file: None,
        };
        assert_eq!(
            verdict(&plain, &required).map(|v| v.0),
            Some(ConditionReason::ReplicationInsecure)
        );
        // A site that did not answer says nothing.
        let mut silent = refused;
        silent[1].answered = false;
        assert_eq!(verdict(&silent, &want), None);
    }
}
