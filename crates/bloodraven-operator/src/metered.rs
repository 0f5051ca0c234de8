//! The store as the operator's metrics see it: every call passes through, and a call that got
//! no answer (the backend or the API server failed, or a write's answer was lost) is counted in
//! `bloodraven_store_errors_total`, so "the operator cannot reach its store" is an alert, not a
//! log line somebody has to find. Answers (a conflict, a missing object, a refused object) are
//! not failures of the store and are not counted.

use std::sync::Arc;

use bloodraven_store::{ObjectKey, RawObject, Store, StoreError, StoreFuture, WatchEvent, WriteOp};

use crate::metrics::Metrics;

/// `inner`, counted.
#[derive(Debug)]
pub struct Metered {
    inner: Arc<dyn Store>,
    metrics: Metrics,
}

impl Metered {
    pub fn new(inner: Arc<dyn Store>, metrics: Metrics) -> Self {
        Metered { inner, metrics }
    }

    fn count<T>(&self, operation: &'static str, r: &Result<T, StoreError>) {
        if let Err(StoreError::Backend { .. } | StoreError::Unconfirmed { .. }) = r {
            self.metrics.store_error(operation);
        }
    }
}

impl Store for Metered {
    fn get<'a>(&'a self, key: &'a ObjectKey) -> StoreFuture<'a, Option<RawObject>> {
        Box::pin(async move {
            let r = self.inner.get(key).await;
            self.count("get", &r);
            r
        })
    }

    fn list<'a>(
        &'a self,
        kind: &'a str,
        namespace: Option<&'a str>,
    ) -> StoreFuture<'a, Vec<RawObject>> {
        Box::pin(async move {
            let r = self.inner.list(kind, namespace).await;
            self.count("list", &r);
            r
        })
    }

    fn apply(&self, ops: Vec<WriteOp>) -> StoreFuture<'_, Vec<Option<RawObject>>> {
        Box::pin(async move {
            let r = self.inner.apply(ops).await;
            self.count("apply", &r);
            r
        })
    }

    fn transactional(&self) -> bool {
        self.inner.transactional()
    }

    fn watch(&self) -> tokio::sync::broadcast::Receiver<WatchEvent> {
        self.inner.watch()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloodraven_core::contract::metrics as names;

    /// A store whose every call fails as `error` says.
    #[derive(Debug)]
    struct Failing(StoreError);

    impl Store for Failing {
        fn get<'a>(&'a self, _: &'a ObjectKey) -> StoreFuture<'a, Option<RawObject>> {
            let e = self.0.clone();
            Box::pin(async move { Err(e) })
        }
        fn list<'a>(&'a self, _: &'a str, _: Option<&'a str>) -> StoreFuture<'a, Vec<RawObject>> {
            let e = self.0.clone();
            Box::pin(async move { Err(e) })
        }
        fn apply(&self, _: Vec<WriteOp>) -> StoreFuture<'_, Vec<Option<RawObject>>> {
            let e = self.0.clone();
            Box::pin(async move { Err(e) })
        }
        fn watch(&self) -> tokio::sync::broadcast::Receiver<WatchEvent> {
            tokio::sync::broadcast::channel(1).1
        }
    }

    fn errors(m: &Metrics, operation: &str) -> String {
        let text = m.render();
        let line = format!(
            "{}{{operation=\"{operation}\"}} ",
            names::STORE_ERRORS_TOTAL
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {line} in {text}"))
            .to_string()
    }

    #[tokio::test]
    async fn failures_without_an_answer_are_counted_and_answers_are_not() {
        let key = ObjectKey::new("MysqlFailoverGroup", "ns", "g");
        let m = Metrics::new();
        let lost = Metered::new(
            Arc::new(Failing(StoreError::Unconfirmed {
                operation: "write",
                detail: "timed out".into(),
            })),
            m.clone(),
        );
        assert!(lost.apply(Vec::new()).await.is_err());
        let down = Metered::new(
            Arc::new(Failing(StoreError::Backend {
                operation: "read",
                detail: "connection refused".into(),
            })),
            m.clone(),
        );
        assert!(down.get(&key).await.is_err());
        assert!(down.list("MysqlFailoverGroup", None).await.is_err());
        assert!(down.apply(Vec::new()).await.is_err());
        let conflict = Metered::new(
            Arc::new(Failing(StoreError::Conflict {
                key: key.clone(),
                expected: "1".into(),
                actual: "2".into(),
            })),
            m.clone(),
        );
        assert!(conflict.apply(Vec::new()).await.is_err());
        assert!(conflict.get(&key).await.is_err());
        assert_eq!(errors(&m, "apply"), "2");
        assert_eq!(errors(&m, "get"), "1");
        assert_eq!(errors(&m, "list"), "1");
    }
}
