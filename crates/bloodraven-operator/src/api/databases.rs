//! The deploy API's copy of the `MysqlDatabase` objects, kept in memory from the store's
//! watch while this operator leads (as a Kubernetes informer keeps its cache): authorizing a
//! request reads no store. Only the leader answers the deploy API, and each leadership term
//! loads the copy after subscribing to the watch, so no change between the load and the
//! first event is missed; a watcher that fell behind re-lists. Until it is loaded (or after
//! the term ends) [`Databases::authorized`] says so, and the caller reads the store.
//!
//! A change reaches the copy when the watch delivers it: a database created, or a client
//! removed from one, is seen by requests a moment after the write, never before it.

use std::collections::BTreeMap;
use std::sync::{PoisonError, RwLock};

use bloodraven_core::resources::{DatabaseBody, DatabaseSpec, KIND_DATABASE};
use bloodraven_store::RawObject;

/// (namespace, name) → spec of every readable `MysqlDatabase`; `None` while not loaded.
#[derive(Debug, Default)]
pub struct Databases(RwLock<Option<BTreeMap<(String, String), DatabaseSpec>>>);

fn key(o: &RawObject) -> (String, String) {
    (o.metadata.namespace.clone(), o.metadata.name.clone())
}

impl Databases {
    /// Replaces the copy with `objects` (a fresh list).
    pub fn load(&self, objects: &[RawObject]) {
        let map = objects
            .iter()
            .filter(|o| o.kind == KIND_DATABASE)
            .filter_map(|o| Some((key(o), o.decode::<DatabaseBody>().ok()?.spec)))
            .collect();
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(map);
    }

    /// A created or replaced object (ignored unless it is a database and the copy is loaded;
    /// one that no longer decodes authorizes nobody, as when read from the store).
    pub fn put(&self, o: &RawObject) {
        self.change(o, o.decode::<DatabaseBody>().ok().map(|b| b.spec));
    }

    /// A deleted object.
    pub fn delete(&self, o: &RawObject) {
        self.change(o, None);
    }

    /// Sets (or, with `None`, removes) `o`'s entry when it is a database and the copy is
    /// loaded.
    fn change(&self, o: &RawObject, spec: Option<DatabaseSpec>) {
        if o.kind != KIND_DATABASE {
            return;
        }
        let mut guard = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let Some(map) = guard.as_mut() else {
            return;
        };
        match spec {
            Some(spec) => {
                map.insert(key(o), spec);
            }
            None => {
                map.remove(&key(o));
            }
        }
    }

    /// Forgets the copy (the term ended): requests read the store again.
    pub fn clear(&self) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The databases in `namespace` that let `client_namespace/service_account` act on
    /// `group`, by name; `None` while the copy is not loaded.
    pub fn authorized(
        &self,
        namespace: &str,
        group: &str,
        client_namespace: &str,
        service_account: &str,
    ) -> Option<Vec<String>> {
        let guard = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let map = guard.as_ref()?;
        Some(
            map.iter()
                .filter(|((ns, _), spec)| {
                    ns == namespace && spec.authorizes(group, client_namespace, service_account)
                })
                .map(|((_, name), _)| name.clone())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloodraven_core::resources::{API_VERSION, ObjectMeta};

    fn db(ns: &str, name: &str, group: &str, sa: &str) -> RawObject {
        RawObject::from_body(
            API_VERSION,
            KIND_DATABASE,
            ObjectMeta::named(ns, name),
            &serde_json::json!({"spec": {
                "failoverGroupRef": {"name": group},
                "deploymentClients": [{"namespace": "ci", "serviceAccount": sa}],
            }}),
        )
        .unwrap()
    }

    #[test]
    fn follows_puts_and_deletes_once_loaded_and_says_when_it_is_not() {
        let d = Databases::default();
        assert_eq!(d.authorized("default", "g", "ci", "deployer"), None);
        d.put(&db("default", "early", "g", "deployer"));
        d.load(&[
            db("default", "db1", "g", "deployer"),
            db("other", "db2", "g", "deployer"),
        ]);
        let mine = |d: &Databases| d.authorized("default", "g", "ci", "deployer").unwrap();
        assert_eq!(mine(&d), vec!["db1".to_string()]);
        d.put(&db("default", "db3", "g", "deployer"));
        d.put(&db("default", "db4", "g", "someone-else"));
        d.put(&db("default", "db5", "h", "deployer"));
        assert_eq!(mine(&d), vec!["db1".to_string(), "db3".to_string()]);
        // A client removed from a database loses it.
        d.put(&db("default", "db1", "g", "someone-else"));
        assert_eq!(mine(&d), vec!["db3".to_string()]);
        d.delete(&db("default", "db3", "g", "deployer"));
        assert!(mine(&d).is_empty());
        // One that no longer decodes authorizes nobody.
        d.put(&db("default", "db6", "g", "deployer"));
        let broken = RawObject::from_body(
            API_VERSION,
            KIND_DATABASE,
            ObjectMeta::named("default", "db6"),
            &serde_json::json!({"spec": {"nothing": true}}),
        )
        .unwrap();
        d.put(&broken);
        assert!(mine(&d).is_empty());
        d.clear();
        assert_eq!(d.authorized("default", "g", "ci", "deployer"), None);
    }
}
