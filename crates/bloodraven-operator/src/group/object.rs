//! The stored group object: compare-and-swap writes of its metadata and spec
//! ([`GroupRuntime::update`]) and of its status ([`GroupRuntime::update_status`]), re-read and
//! retried on conflicts; the authoritative change of active site (the announcement); and
//! taking in what the watch saw.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use bloodraven_core::contract::annotations::REVOKE_DEPLOYMENT_LEASES;
use bloodraven_core::resources::{FailoverGroupBody, KIND_GROUP};
use bloodraven_core::status::GroupStatus;
use bloodraven_store::{ObjectKey, RawObject, StoreError, WriteOp};

use super::{GroupRuntime, GroupSnapshot, snapshot_of};

impl GroupRuntime {
    /// Applies `change` to the stored group object's metadata and spec with compare-and-swap,
    /// re-reading and retrying on conflicts. `change` returns whether it changed anything. The
    /// status is not written (see [`GroupRuntime::update_status`]).
    pub async fn update(
        &self,
        change: impl FnMut(&mut RawObject) -> bool,
    ) -> Result<Arc<GroupSnapshot>, StoreError> {
        self.write(WriteOp::Replace, change).await
    }

    /// One compare-and-swap write of the group object (`op` builds it), re-read and retried
    /// on conflicts.
    async fn write(
        &self,
        op: fn(RawObject) -> WriteOp,
        mut change: impl FnMut(&mut RawObject) -> bool,
    ) -> Result<Arc<GroupSnapshot>, StoreError> {
        let mut current = self.group.lock().await;
        for _ in 0..5 {
            let mut next = current.clone();
            if !change(&mut next) {
                return Ok(self.snapshot());
            }
            match self.store.apply(vec![op(next)]).await {
                Ok(mut written) => {
                    let obj = written.pop().flatten().ok_or_else(|| StoreError::Backend {
                        operation: "replace the group",
                        detail: "no object returned".into(),
                    })?;
                    self.install(&mut current, obj)?;
                    return Ok(self.snapshot());
                }
                Err(StoreError::Conflict { .. }) => {
                    let fresh = self.read_stored().await?;
                    self.install(&mut current, fresh)?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict {
            key: ObjectKey::new(KIND_GROUP, &self.namespace, &self.name),
            expected: current.metadata.resource_version.clone(),
            actual: "changing concurrently".into(),
        })
    }

    /// Sets annotation `name` to `value` on the stored group object (a request to the
    /// controller, as `bloodraven failover` makes it).
    pub async fn annotate(
        &self,
        name: &str,
        value: &str,
    ) -> Result<Arc<GroupSnapshot>, StoreError> {
        self.update(|o| {
            o.metadata
                .annotations
                .insert(name.to_string(), value.to_string())
                .as_deref()
                != Some(value)
        })
        .await
    }

    /// The group object as stored now.
    pub(super) async fn read_stored(&self) -> Result<RawObject, StoreError> {
        let key = ObjectKey::new(KIND_GROUP, &self.namespace, &self.name);
        match self.store.get(&key).await? {
            Some(obj) => Ok(obj),
            None => Err(StoreError::NotFound { key }),
        }
    }

    pub(super) fn install(
        &self,
        current: &mut RawObject,
        obj: RawObject,
    ) -> Result<(), StoreError> {
        let snap = snapshot_of(&obj)?;
        self.metrics
            .topology_generation
            .get_or_create(&crate::metrics::GroupLabel {
                group: self.name.clone(),
            })
            .set(i64::try_from(snap.body.status.topology_generation).unwrap_or(i64::MAX));
        let sites = snap.site_names();
        self.metrics
            .set_active_site(&self.name, &sites, &snap.body.status.active_site);
        let generation = snap.body.status.topology_generation;
        *self
            .snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(snap);
        *current = obj;
        // After the snapshot: a watcher woken by this reads the new view, never the old one.
        self.views.send_if_modified(|g| {
            let changed = *g != generation;
            *g = generation;
            changed
        });
        Ok(())
    }

    /// Updates the status (the controller's write path): a write of the status subresource,
    /// which changes nothing else.
    pub async fn update_status(
        &self,
        mut change: impl FnMut(&mut GroupStatus),
    ) -> Result<Arc<GroupSnapshot>, StoreError> {
        self.write(WriteOp::ReplaceStatus, |obj| {
            let Ok(mut body) = obj.decode::<FailoverGroupBody>() else {
                return false;
            };
            let before = body.status.clone();
            change(&mut body.status);
            if body.status == before {
                return false;
            }
            let Ok(status) = serde_json::to_value(&body.status) else {
                return false;
            };
            obj.body.insert("status".into(), status);
            true
        })
        .await
    }

    /// An authoritative change of active site: raises the topology-change flag (grants and
    /// renewals answer `423`), persists the status with `topologyGeneration + 1` (and whatever
    /// `change` adds), then revokes every live lease in a background task. Returns the new
    /// generation once it is persisted — before the revocation, which the caller never waits on.
    ///
    /// This is the announcement of every promotion: from the moment it returns, `/active-site`
    /// serves the new view. The caller makes the new primary writable only afterwards.
    pub async fn change_active_site(
        self: &Arc<Self>,
        new_active_site: &str,
        mut change: impl FnMut(&mut GroupStatus),
    ) -> Result<u64, StoreError> {
        self.flags
            .topology_change_pending
            .store(true, Ordering::SeqCst);
        let mut generation = 0;
        // The announcement is a new view: a newer observedAt, so sidecars adopt it when a peer
        // relays it (they take only strictly newer views).
        // Newer than anything served before too (the last poll's time, which is served but
        // not always persisted).
        let now = self.now();
        let served = self.served_status(&self.snapshot()).observed_at;
        let result = self
            .update_status(|s| {
                s.topology_generation += 1;
                generation = s.topology_generation;
                s.active_site = new_active_site.to_string();
                s.observed_at = [s.observed_at, served, Some(now)]
                    .into_iter()
                    .flatten()
                    .max();
                change(s);
            })
            .await;
        if let Err(e) = result {
            // Nothing changed: lift the flag again.
            self.flags
                .topology_change_pending
                .store(false, Ordering::SeqCst);
            return Err(e);
        }
        tracing::info!(group = %self.name, activeSite = new_active_site, topologyGeneration = generation, "topology generation persisted");
        let me = self.clone();
        tokio::spawn(async move {
            // Retry until the revocation is persisted: the flag keeps renewals at 423 meanwhile.
            let mut delay = std::time::Duration::from_millis(50);
            loop {
                match me.sync_leases_to_status().await {
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(group = %me.name, error = %e, "revoking deploy leases after a topology change failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(std::time::Duration::from_secs(5));
                    }
                }
            }
        });
        Ok(generation)
    }

    /// Takes in a change of the group object seen by the watch (an annotation written by
    /// the CLI, a spec change), then acts on what the object asks for ([`Self::react`]).
    ///
    /// Resource versions are opaque: they are compared for equality, never ordered. A watch
    /// event carrying the version this runtime already holds is its own write (or one it has
    /// already re-read) and changes nothing. Any other version triggers a fresh read under
    /// the group lock — no write of this runtime is in flight then, so what comes back is at
    /// least as new as what it holds, and the event's own object (which may be older, when a
    /// conflict re-read got there first) is never installed over a newer one.
    pub async fn adopt(self: &Arc<Self>, seen: &RawObject) -> Result<(), StoreError> {
        {
            let mut current = self.group.lock().await;
            if seen.metadata.resource_version != current.metadata.resource_version {
                let fresh = self.read_stored().await?;
                if fresh.metadata.resource_version != current.metadata.resource_version {
                    self.install(&mut current, fresh)?;
                }
            }
        }
        self.react().await
    }

    /// Acts on what the stored object asks for: a newer generation, a revoke annotation.
    pub async fn react(self: &Arc<Self>) -> Result<(), StoreError> {
        let _one_at_a_time = self.reacting.lock().await;
        // Read after the lock: a reaction that just finished has removed the annotation.
        let snap = self.snapshot();
        let lease_generation = self.leases.lock().await.engine.topology_generation();
        if snap.status().topology_generation > lease_generation {
            self.sync_leases_to_status().await?;
        }
        if snap.annotations.contains_key(REVOKE_DEPLOYMENT_LEASES) {
            self.revoke_all().await?;
        }
        Ok(())
    }

    /// The stored group object, as it is now.
    pub async fn object(&self) -> RawObject {
        self.group.lock().await.clone()
    }
}
