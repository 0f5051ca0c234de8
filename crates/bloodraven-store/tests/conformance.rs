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

    /// More changes than a watcher's queue holds, while it does not read.
    async fn force_relist(&self) {
        for batch in 0..6 {
            let ops = (0..1000)
                .map(|i| WriteOp::Create(lease("flood", &format!("l-{batch}-{i}"), "x")))
                .collect();
            self.store.apply(ops).await.unwrap();
        }
    }

    fn atomic_batches(&self) -> bool {
        true
    }

    fn namespace(&self, case: &str) -> String {
        case.to_string()
    }
}

conformance_tests!(async { sqlite() });
