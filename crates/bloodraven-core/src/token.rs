//! Lease tokens: minted from injected randomness, stored only as SHA-256 hashes.
//!
//! A [`LeaseToken`] exists exactly once: in the grant response handed to the client. Everything
//! the operator keeps (live leases, tombstones, persisted objects) holds a [`TokenHash`]. Hashes
//! are compared in constant time. Neither type prints its value through `Debug` or `Display`, so a
//! token cannot leak into a log line by accident.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Number of random bytes in a lease token (SPEC §3.4: at least 32).
pub const TOKEN_BYTES: usize = 32;

/// A source of cryptographically secure random bytes. The runtime passes the operating
/// system's CSPRNG; tests pass a deterministic source.
pub trait TokenSource {
    /// Fills `buf` with random bytes.
    fn fill(&mut self, buf: &mut [u8; TOKEN_BYTES]);
}

/// A freshly minted lease token. Only the grant response ever carries its text.
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// Mints a new token from `source` (32 random bytes, base64url without padding: 43 chars).
    pub fn mint(source: &mut dyn TokenSource) -> Self {
        let mut buf = [0u8; TOKEN_BYTES];
        source.fill(&mut buf);
        LeaseToken(URL_SAFE_NO_PAD.encode(buf))
    }

    /// The token text, for the one response that hands it to the client.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn hash(&self) -> TokenHash {
        TokenHash::of(&self.0)
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseToken(<redacted>)")
    }
}

/// SHA-256 of a token's text. What the operator stores instead of the token.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    /// Hashes a presented token.
    pub fn of(token: &str) -> Self {
        TokenHash(Sha256::digest(token.as_bytes()).into())
    }

    /// Whether `presented` hashes to this value, compared in constant time.
    pub fn matches(&self, presented: &str) -> bool {
        let other = TokenHash::of(presented);
        self.0.ct_eq(&other.0).into()
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Even a hash stays out of logs: it is the verifier of a bearer secret.
        f.write_str("TokenHash(<redacted>)")
    }
}

impl Serialize for TokenHash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&hex::encode(self.0))
    }
}

impl<'de> Deserialize<'de> for TokenHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.as_bytes(), &mut out)
            .map_err(|_| serde::de::Error::custom("token hash must be 64 hex characters"))?;
        Ok(TokenHash(out))
    }
}

/// A deterministic [`TokenSource`] for tests and simulations: a counter fed through SHA-256.
#[derive(Debug, Clone, Default)]
pub struct SeededTokenSource {
    seed: u64,
    counter: u64,
}

impl SeededTokenSource {
    pub fn new(seed: u64) -> Self {
        SeededTokenSource { seed, counter: 0 }
    }
}

impl TokenSource for SeededTokenSource {
    fn fill(&mut self, buf: &mut [u8; TOKEN_BYTES]) {
        self.counter += 1;
        let mut h = Sha256::new();
        h.update(self.seed.to_le_bytes());
        h.update(self.counter.to_le_bytes());
        buf.copy_from_slice(&h.finalize());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_43_chars_and_hash_matches_only_itself() {
        let mut src = SeededTokenSource::new(7);
        let a = LeaseToken::mint(&mut src);
        let b = LeaseToken::mint(&mut src);
        assert_eq!(a.expose().len(), 43);
        assert_ne!(a, b);
        assert!(a.hash().matches(a.expose()));
        assert!(!a.hash().matches(b.expose()));
        assert!(!a.hash().matches(""));
    }

    #[test]
    fn debug_never_shows_secrets() {
        let mut src = SeededTokenSource::new(1);
        let t = LeaseToken::mint(&mut src);
        let dbg = format!("{t:?} {:?}", t.hash());
        assert!(!dbg.contains(t.expose()));
        assert!(!dbg.contains(&hex::encode(t.hash().as_bytes())));
    }

    #[test]
    fn hash_serde_round_trip_and_rejects_bad_hex() {
        let h = TokenHash::of("x");
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(json.len(), 66);
        let back: TokenHash = serde_json::from_str(&json).unwrap();
        assert_eq!(back, h);
        assert!(serde_json::from_str::<TokenHash>("\"zz\"").is_err());
    }
}
