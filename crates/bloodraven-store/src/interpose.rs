//! A store in front of another ([`Interposed`]): reads and the watch pass through, and an
//! [`Interposer`] sees every list and every batch of writes before it is sent (and may hold or
//! refuse it) and every batch's result after, and how each call to the inner store ended. The
//! operator's leader gate and its store metrics are interposers; the test kit's fault injection
//! is another. None re-implements the delegation.

use std::fmt;
use std::sync::Arc;

use crate::{ObjectKey, RawObject, Store, StoreError, StoreFuture, WatchEvent, WriteOp};

/// What an [`Interposed`] store runs around the inner store's calls.
pub trait Interposer: Send + Sync + fmt::Debug {
    /// Runs before a list of `kind` is sent; an error is the list's answer.
    fn before_list<'a>(&'a self, kind: &'a str) -> StoreFuture<'a, ()> {
        let _ = kind;
        Box::pin(async { Ok(()) })
    }

    /// Runs before `ops` are applied to `inner`; an error is the batch's answer and nothing
    /// of it is sent.
    fn before_apply<'a>(&'a self, inner: &'a dyn Store, ops: &'a [WriteOp]) -> StoreFuture<'a, ()>;

    /// Sees every object a successful batch wrote.
    fn after_apply(&self, written: &[Option<RawObject>]) {
        let _ = written;
    }

    /// Sees how every call to the inner store ended (`get`, `list` or `apply`; not the calls
    /// this interposer refused itself).
    fn observe(&self, operation: &'static str, outcome: Result<(), &StoreError>) {
        let _ = (operation, outcome);
    }
}

/// Reports `r`'s outcome to `i` and hands `r` back.
fn observed<I: Interposer + ?Sized, T>(
    i: &I,
    operation: &'static str,
    r: Result<T, StoreError>,
) -> Result<T, StoreError> {
    i.observe(operation, r.as_ref().map(|_| ()));
    r
}

impl<T: Interposer + ?Sized> Interposer for Arc<T> {
    fn before_list<'a>(&'a self, kind: &'a str) -> StoreFuture<'a, ()> {
        (**self).before_list(kind)
    }

    fn before_apply<'a>(&'a self, inner: &'a dyn Store, ops: &'a [WriteOp]) -> StoreFuture<'a, ()> {
        (**self).before_apply(inner, ops)
    }

    fn after_apply(&self, written: &[Option<RawObject>]) {
        (**self).after_apply(written);
    }

    fn observe(&self, operation: &'static str, outcome: Result<(), &StoreError>) {
        (**self).observe(operation, outcome);
    }
}

/// `inner`, with `interposer` around its lists and writes.
#[derive(Debug)]
pub struct Interposed<I> {
    inner: Arc<dyn Store>,
    interposer: I,
}

impl<I: Interposer> Interposed<I> {
    pub fn new(inner: Arc<dyn Store>, interposer: I) -> Self {
        Interposed { inner, interposer }
    }

    pub fn interposer(&self) -> &I {
        &self.interposer
    }
}

impl<I: Interposer> Store for Interposed<I> {
    fn get<'a>(&'a self, key: &'a ObjectKey) -> StoreFuture<'a, Option<RawObject>> {
        Box::pin(async move { observed(&self.interposer, "get", self.inner.get(key).await) })
    }

    fn list<'a>(
        &'a self,
        kind: &'a str,
        namespace: Option<&'a str>,
    ) -> StoreFuture<'a, Vec<RawObject>> {
        Box::pin(async move {
            self.interposer.before_list(kind).await?;
            observed(
                &self.interposer,
                "list",
                self.inner.list(kind, namespace).await,
            )
        })
    }

    fn apply(&self, ops: Vec<WriteOp>) -> StoreFuture<'_, Vec<Option<RawObject>>> {
        Box::pin(async move {
            self.interposer.before_apply(&*self.inner, &ops).await?;
            let written = observed(&self.interposer, "apply", self.inner.apply(ops).await)?;
            self.interposer.after_apply(&written);
            Ok(written)
        })
    }

    fn transactional(&self) -> bool {
        self.inner.transactional()
    }

    fn watch(&self) -> tokio::sync::broadcast::Receiver<WatchEvent> {
        self.inner.watch()
    }
}
