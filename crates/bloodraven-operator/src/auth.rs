//! Deploy API authentication in embedded mode: bearer tokens of the projected
//! ServiceAccount shape (`aud`, `sub = system:serviceaccount:NS:SA`, `exp`), signed with
//! HMAC-SHA256 by the operator's key. In Kubernetes mode the same [`Identity`] comes from a
//! TokenReview instead.
//!
//! A token is `base64url(header).base64url(claims).base64url(signature)` (the JWT compact
//! form, `alg: HS256`). Verification checks the signature in constant time before reading the
//! claims, then the audience, the not-before and expiry times (with a small leeway) and the
//! subject's shape. Errors say which check failed, never the token.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bloodraven_core::names::{check_dns1123_label, check_dns1123_subdomain};
use bloodraven_core::time::Timestamp;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Clock skew tolerated on `exp` and `nbf`.
pub const LEEWAY: Duration = Duration::from_secs(5);
/// Shortest accepted signing key.
pub const MIN_KEY_BYTES: usize = 32;
/// Longest lifetime `bloodraven token issue` grants.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The key tokens are signed with. Never printed.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningKey(<redacted>)")
    }
}

/// A key file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read token signing key {path}: {reason}")]
    Read { path: String, reason: String },
    #[error(
        "token signing key {path} is too short: at least {MIN_KEY_BYTES} bytes are needed (create one with `bloodraven token keygen`)"
    )]
    TooShort { path: String },
}

impl SigningKey {
    /// Uses `bytes` as the key (at least 32 bytes).
    pub fn from_bytes(bytes: Vec<u8>) -> Option<Self> {
        (bytes.len() >= MIN_KEY_BYTES).then_some(SigningKey(bytes))
    }

    /// Reads a key file: its contents (surrounding whitespace trimmed) are the key.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let raw = std::fs::read(path).map_err(|e| KeyError::Read {
            path: path.display().to_string(),
            reason: e.kind().to_string(),
        })?;
        let trimmed = raw.trim_ascii().to_vec();
        SigningKey::from_bytes(trimmed).ok_or_else(|| KeyError::TooShort {
            path: path.display().to_string(),
        })
    }

    /// A new random key as text for a key file (64 hex characters).
    pub fn generate_text() -> Result<String, getrandom::Error> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b)?;
        Ok(hex::encode(b))
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length; the constructor cannot fail.
        HmacSha256::new_from_slice(&self.0).unwrap_or_else(|_| unreachable_mac())
    }
}

#[cold]
fn unreachable_mac() -> HmacSha256 {
    // Only reachable if HMAC refused a key, which it never does; keep a deterministic value
    // rather than panicking.
    HmacSha256::new_from_slice(&[0u8; 32]).unwrap_or_else(|_| unreachable_mac())
}

/// Who is asking: a Kubernetes service account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub namespace: String,
    pub service_account: String,
}

impl Identity {
    pub fn new(namespace: &str, service_account: &str) -> Identity {
        Identity {
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
        }
    }

    pub fn subject(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace, self.service_account
        )
    }

    /// Parses `system:serviceaccount:NS:SA`.
    pub fn from_subject(sub: &str) -> Option<Identity> {
        let rest = sub.strip_prefix("system:serviceaccount:")?;
        let (ns, sa) = rest.split_once(':')?;
        check_dns1123_label(ns).ok()?;
        check_dns1123_subdomain(sa).ok()?;
        Some(Identity {
            namespace: ns.to_string(),
            service_account: sa.to_string(),
        })
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    typ: String,
}

#[derive(Serialize, Deserialize)]
struct Claims {
    iss: String,
    aud: String,
    sub: String,
    iat: i64,
    nbf: i64,
    exp: i64,
}

/// Why a token was refused (all answer `401`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no bearer token")]
    Missing,
    #[error("the token is not a signed token of the expected form")]
    Malformed,
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token's audience is not {expected}")]
    WrongAudience { expected: String },
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token's subject is not a service account (system:serviceaccount:NS:SA)")]
    BadSubject,
    /// The API server's TokenReview did not authenticate the token (its reason, which never
    /// contains the token).
    #[error("the API server did not authenticate the token: {0}")]
    NotAuthenticated(String),
    /// The token could not be checked now (the TokenReview request failed): answered `503`.
    #[error("the token could not be checked: {0}")]
    Unavailable(String),
}

/// A boxed future, so [`Authenticator`] can be a trait object.
pub type AuthFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Identity, AuthError>> + Send + 'a>>;

/// Who a bearer token names: the operator's own HMAC tokens (embedded mode) or a Kubernetes
/// TokenReview (`crate::tokenreview`).
pub trait Authenticator: Send + Sync + std::fmt::Debug {
    fn authenticate<'a>(&'a self, token: &'a str) -> AuthFuture<'a>;
}

/// Embedded mode: tokens issued by `bloodraven token issue`, signed with the operator's key.
#[derive(Debug)]
pub struct HmacTokens {
    pub key: std::sync::Arc<SigningKey>,
    pub audience: String,
    pub clock: bloodraven_runtime::clock::SharedClock,
}

impl Authenticator for HmacTokens {
    fn authenticate<'a>(&'a self, token: &'a str) -> AuthFuture<'a> {
        let result = verify(&self.key, &self.audience, token, self.clock.now());
        Box::pin(async move { result })
    }
}

/// Bad input to [`issue`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    #[error("--namespace: {0}")]
    Namespace(&'static str),
    #[error("--service-account: {0}")]
    ServiceAccount(&'static str),
    #[error("--ttl: must be between 1s and 30 days")]
    Ttl,
}

/// Issues a token for `who`, valid from `now` for `ttl`.
pub fn issue(
    key: &SigningKey,
    audience: &str,
    who: &Identity,
    ttl: Duration,
    now: Timestamp,
) -> Result<String, IssueError> {
    check_dns1123_label(&who.namespace).map_err(IssueError::Namespace)?;
    check_dns1123_subdomain(&who.service_account).map_err(IssueError::ServiceAccount)?;
    if ttl < Duration::from_secs(1) || ttl > MAX_TTL {
        return Err(IssueError::Ttl);
    }
    let header = Header {
        alg: "HS256".into(),
        typ: "JWT".into(),
    };
    let iat = now.unix_seconds();
    let claims = Claims {
        iss: "bloodraven".into(),
        aud: audience.to_string(),
        sub: who.subject(),
        iat,
        nbf: iat,
        exp: now.plus(ttl).unix_seconds(),
    };
    // Serialising these plain structs cannot fail.
    let h = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).unwrap_or_default());
    let c = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap_or_default());
    let signing_input = format!("{h}.{c}");
    let mut mac = key.mac();
    mac.update(signing_input.as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    Ok(format!("{signing_input}.{sig}"))
}

/// Verifies a token and returns who it names.
pub fn verify(
    key: &SigningKey,
    audience: &str,
    token: &str,
    now: Timestamp,
) -> Result<Identity, AuthError> {
    if token.is_empty() {
        return Err(AuthError::Missing);
    }
    if token.len() > 8192 {
        return Err(AuthError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(AuthError::Malformed);
    };
    let sig = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| AuthError::Malformed)?;
    let mut mac = key.mac();
    mac.update(h.as_bytes());
    mac.update(b".");
    mac.update(c.as_bytes());
    mac.verify_slice(&sig)
        .map_err(|_| AuthError::BadSignature)?;
    let header: Header = URL_SAFE_NO_PAD
        .decode(h)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or(AuthError::Malformed)?;
    if header.alg != "HS256" {
        return Err(AuthError::Malformed);
    }
    let claims: Claims = URL_SAFE_NO_PAD
        .decode(c)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or(AuthError::Malformed)?;
    if claims.aud != audience {
        return Err(AuthError::WrongAudience {
            expected: audience.to_string(),
        });
    }
    let leeway = i64::try_from(LEEWAY.as_secs()).unwrap_or(0);
    let t = now.unix_seconds();
    if t >= claims.exp.saturating_add(leeway) {
        return Err(AuthError::Expired);
    }
    if t < claims.nbf.saturating_sub(leeway) {
        return Err(AuthError::NotYetValid);
    }
    Identity::from_subject(&claims.sub).ok_or(AuthError::BadSubject)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SigningKey {
        SigningKey::from_bytes(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap()
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_unix_seconds(1_796_000_000 + s)
    }

    #[test]
    fn round_trip() {
        let tok = issue(
            &key(),
            "bloodraven-deploy",
            &Identity::new("ci", "deployer"),
            Duration::from_secs(3600),
            t(0),
        )
        .unwrap();
        let id = verify(&key(), "bloodraven-deploy", &tok, t(10)).unwrap();
        assert_eq!(id.subject(), "system:serviceaccount:ci:deployer");
    }

    #[test]
    fn refusals() {
        let tok = issue(
            &key(),
            "bloodraven-deploy",
            &Identity::new("ci", "deployer"),
            Duration::from_secs(60),
            t(0),
        )
        .unwrap();
        assert_eq!(
            verify(&key(), "other", &tok, t(1)),
            Err(AuthError::WrongAudience {
                expected: "other".into()
            })
        );
        assert_eq!(
            verify(&key(), "bloodraven-deploy", &tok, t(66)),
            Err(AuthError::Expired)
        );
        assert!(
            verify(&key(), "bloodraven-deploy", &tok, t(64)).is_ok(),
            "within leeway"
        );
        assert_eq!(
            verify(&key(), "bloodraven-deploy", &tok, t(-10)),
            Err(AuthError::NotYetValid)
        );
        let other = SigningKey::from_bytes(vec![7u8; 32]).unwrap();
        assert_eq!(
            verify(&other, "bloodraven-deploy", &tok, t(1)),
            Err(AuthError::BadSignature)
        );
        // Tampered claims fail the signature.
        let mut parts: Vec<String> = tok.split('.').map(str::to_string).collect();
        parts[1] = URL_SAFE_NO_PAD.encode(br#"{"iss":"x","aud":"bloodraven-deploy","sub":"system:serviceaccount:ci:admin","iat":0,"nbf":0,"exp":9999999999}"#);
        assert_eq!(
            verify(&key(), "bloodraven-deploy", &parts.join("."), t(1)),
            Err(AuthError::BadSignature)
        );
        for junk in ["", "a.b", "a.b.c.d", "!!.??.**"] {
            assert!(
                verify(&key(), "bloodraven-deploy", junk, t(1)).is_err(),
                "{junk}"
            );
        }
    }

    #[test]
    fn issue_validates_input_and_key_never_prints() {
        assert!(matches!(
            issue(
                &key(),
                "a",
                &Identity::new("Bad_NS", "sa"),
                Duration::from_secs(60),
                t(0)
            ),
            Err(IssueError::Namespace(_))
        ));
        assert!(matches!(
            issue(
                &key(),
                "a",
                &Identity::new("ns", ""),
                Duration::from_secs(60),
                t(0)
            ),
            Err(IssueError::ServiceAccount(_))
        ));
        assert_eq!(
            issue(
                &key(),
                "a",
                &Identity::new("ns", "sa"),
                Duration::ZERO,
                t(0)
            ),
            Err(IssueError::Ttl)
        );
        assert!(SigningKey::from_bytes(vec![1; 31]).is_none());
        assert!(!format!("{:?}", key()).contains("0123"));
        assert_eq!(SigningKey::generate_text().unwrap().len(), 64);
        assert!(Identity::from_subject("system:serviceaccount:ns").is_none());
        assert!(Identity::from_subject("user:alice").is_none());
    }
}
