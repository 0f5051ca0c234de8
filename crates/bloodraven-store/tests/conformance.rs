//! The store contract on the embedded SQLite back-end.

use std::sync::Arc;

use bloodraven_store::{Durability, SqliteStore, Store, WriteOp};
use bloodraven_testkit::conformance_tests;
use bloodraven_testkit::store_conformance::{Backend, lease};

struct Sqlite {
    _dir: tempfile::TempDir,
    store: Arc<SqliteStore>,
}

fn sqlite() -> Sqlite {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("store.db"), Durability::Off).unwrap();
    Sqlite {
        _dir: dir,
        store: Arc::new(store),
    }
}

impl Backend for Sqlite {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// A change, then the change log compacted away.
    async fn force_relist(&self) {
        let op = WriteOp::Create(lease("compacted", "l", "x"));
        self.store.apply(vec![op]).await.unwrap();
        self.store.compact_change_log().await.unwrap();
    }

    fn namespace(&self, case: &str) -> String {
        case.to_string()
    }
}

conformance_tests!(async { sqlite() });
