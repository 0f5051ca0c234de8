//! The store as the operator's metrics see it (an interposer): every call passes through, and a
//! call that got no answer (the backend or the API server failed, or a write's answer was lost)
//! is counted in `bloodraven_store_errors_total`, so "the operator cannot reach its store" is an
//! alert, not a log line somebody has to find. Answers (a conflict, a missing object, a refused
//! object) are not failures of the store and are not counted.

use bloodraven_store::{Interposer, Store, StoreError, StoreFuture, WriteOp};

use crate::metrics::Metrics;

/// Counts the store calls that got no answer; put in front of the platform's store with
/// [`bloodraven_store::Interposed`].
#[derive(Debug)]
pub struct Metered(pub Metrics);

impl Interposer for Metered {
    fn before_apply<'a>(
        &'a self,
        _inner: &'a dyn Store,
        _ops: &'a [WriteOp],
    ) -> StoreFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }

    fn observe(&self, operation: &'static str, outcome: Result<(), &StoreError>) {
        if let Err(StoreError::Backend { .. } | StoreError::Unconfirmed { .. }) = outcome {
            self.0.store_error(operation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloodraven_core::contract::metrics as names;
    use bloodraven_store::{Interposed, ObjectKey, RawObject, WatchEvent};
    use std::sync::Arc;

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
        let lost = Interposed::new(
            Arc::new(Failing(StoreError::Unconfirmed {
                operation: "write",
                detail: "timed out".into(),
            })),
            Metered(m.clone()),
        );
        assert!(lost.apply(Vec::new()).await.is_err());
        let down = Interposed::new(
            Arc::new(Failing(StoreError::Backend {
                operation: "read",
                detail: "connection refused".into(),
            })),
            Metered(m.clone()),
        );
        assert!(down.get(&key).await.is_err());
        assert!(down.list("MysqlFailoverGroup", None).await.is_err());
        assert!(down.apply(Vec::new()).await.is_err());
        let conflict = Interposed::new(
            Arc::new(Failing(StoreError::Conflict {
                key: key.clone(),
                expected: "1".into(),
                actual: "2".into(),
            })),
            Metered(m.clone()),
        );
        assert!(conflict.apply(Vec::new()).await.is_err());
        assert!(conflict.get(&key).await.is_err());
        assert_eq!(errors(&m, "apply"), "2");
        assert_eq!(errors(&m, "get"), "1");
        assert_eq!(errors(&m, "list"), "1");
    }
}
