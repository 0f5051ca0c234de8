//! Kubernetes mode: deploy API callers authenticate with a projected ServiceAccount token whose
//! audience is `bloodraven-deploy`, checked by a TokenReview.
//!
//! The review asks for exactly that audience: a token minted for the API server's default
//! audience (or any other) is not authenticated. Positive answers are cached, keyed by the
//! token's SHA-256 (never the token), for at most [`CACHE_TTL`] — a TokenReview answer carries
//! no expiry, and a deleted pod's token must stop working soon — and at most
//! [`CACHE_ENTRIES`] of them, the oldest dropped first. Refusals are never cached. A review
//! that cannot be made (the API server does not answer) is `AuthError::Unavailable`, which the
//! deploy API answers `503`, not `401`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::auth::{AuthError, AuthFuture, Authenticator, Identity};

/// How long a positive answer is trusted without asking again.
pub const CACHE_TTL: Duration = Duration::from_secs(60);
/// How many positive answers are kept.
pub const CACHE_ENTRIES: usize = 4096;

/// Positive answers by token hash, bounded in size and age.
#[derive(Debug)]
pub struct ReviewCache {
    ttl: Duration,
    max: usize,
    entries: HashMap<[u8; 32], (Identity, Instant)>,
}

fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl ReviewCache {
    pub fn new(ttl: Duration, max: usize) -> Self {
        ReviewCache {
            ttl,
            max: max.max(1),
            entries: HashMap::new(),
        }
    }

    /// The cached identity of `token`, if it was authenticated less than the TTL ago.
    pub fn get(&mut self, token: &str, now: Instant) -> Option<Identity> {
        let h = hash(token);
        match self.entries.get(&h) {
            Some((id, at)) if now.saturating_duration_since(*at) < self.ttl => Some(id.clone()),
            Some(_) => {
                self.entries.remove(&h);
                None
            }
            None => None,
        }
    }

    /// Remembers a positive answer; at capacity, the expired answers go, then the oldest.
    pub fn insert(&mut self, token: &str, id: Identity, now: Instant) {
        let h = hash(token);
        if !self.entries.contains_key(&h) && self.entries.len() >= self.max {
            let ttl = self.ttl;
            self.entries
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < ttl);
            if self.entries.len() >= self.max
                && let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(h, (id, now));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Authenticates by TokenReview against the API server.
#[derive(Debug)]
pub struct TokenReviewer {
    api: Api<TokenReview>,
    audience: String,
    cache: Mutex<ReviewCache>,
}

impl TokenReviewer {
    pub fn new(client: kube::Client, audience: &str) -> Self {
        TokenReviewer {
            api: Api::all(client),
            audience: audience.to_string(),
            cache: Mutex::new(ReviewCache::new(CACHE_TTL, CACHE_ENTRIES)),
        }
    }

    fn cached(&self, token: &str) -> Option<Identity> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(token, Instant::now())
    }

    async fn review(&self, token: &str) -> Result<Identity, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let answer = self
            .api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Unavailable(format!("TokenReview failed: {e}")))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let why = status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "not authenticated".into());
            return Err(AuthError::NotAuthenticated(why));
        }
        // The API server answers with the audiences the token and the request share.
        if !status
            .audiences
            .unwrap_or_default()
            .contains(&self.audience)
        {
            return Err(AuthError::WrongAudience {
                expected: self.audience.clone(),
            });
        }
        let username = status.user.and_then(|u| u.username).unwrap_or_default();
        Identity::from_subject(&username).ok_or(AuthError::BadSubject)
    }
}

impl Authenticator for TokenReviewer {
    fn authenticate<'a>(&'a self, token: &'a str) -> AuthFuture<'a> {
        Box::pin(async move {
            if token.is_empty() {
                return Err(AuthError::Missing);
            }
            if let Some(id) = self.cached(token) {
                return Ok(id);
            }
            let id = self.review(token).await?;
            self.cache
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(token, id.clone(), Instant::now());
            Ok(id)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(sa: &str) -> Identity {
        Identity::new("ci", sa)
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_kept_at_most_the_ttl() {
        let mut c = ReviewCache::new(Duration::from_secs(60), 16);
        c.insert("t1", id("a"), Instant::now());
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(c.get("t1", Instant::now()), Some(id("a")));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(c.get("t1", Instant::now()), None, "60 s old: asked again");
        assert!(c.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_cache_is_bounded_oldest_out_first() {
        let mut c = ReviewCache::new(Duration::from_secs(60), 3);
        for (i, t) in ["t1", "t2", "t3", "t4"].iter().enumerate() {
            c.insert(t, id(&format!("sa{i}")), Instant::now());
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.get("t1", Instant::now()), None);
        assert_eq!(c.get("t4", Instant::now()), Some(id("sa3")));
        // Re-inserting refreshes an entry: it is no longer the oldest.
        c.insert("t2", id("sa1"), Instant::now());
        c.insert("t5", id("sa5"), Instant::now());
        assert_eq!(c.get("t2", Instant::now()), Some(id("sa1")));
        assert_eq!(c.get("t3", Instant::now()), None);
        // Many refreshes of one token take one place.
        for _ in 0..100 {
            c.insert("t5", id("sa5"), Instant::now());
        }
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn the_key_is_the_hash_never_the_token() {
        let mut c = ReviewCache::new(Duration::from_secs(60), 4);
        c.insert("secret-token", id("a"), Instant::now());
        let dump = format!("{c:?}");
        assert!(!dump.contains("secret-token"));
    }
}
