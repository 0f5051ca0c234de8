//! The operator's watch on the active site (`GET /active-site?after=N`, long-polled): when it
//! announces a view newer than the last one it announced, the monitor is woken to tick at once
//! ([`crate::state::Shared::announced`]). The view itself is not adopted here: the tick reads
//! it again and decides with everything else it gathers (and checks its signature), so the
//! watch only makes rule #1 prompt — it can never fence on its own, and losing it costs only
//! that promptness (the tick still runs every `peerCheckInterval`).

use std::future::Future;
use std::sync::Arc;

use tracing::debug;

use crate::contacts::Contacts;
use crate::state::Shared;

/// Follows the operator's announcements until `shutdown` resolves. After an error it waits
/// one `peerCheckInterval` before asking again.
pub async fn follow<C: Contacts>(
    contacts: Arc<C>,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut after = 0;
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => return,
            r = contacts.operator_view_after(after) => match r {
                Ok(Some(v)) if v.topology_generation > after => {
                    debug!(site = %shared.identity.site, active_site = %v.active_site, topology_generation = v.topology_generation, "the operator announced a newer view; ticking at once");
                    after = v.topology_generation;
                    shared.announced.notify_one();
                }
                Ok(_) => {}
                Err(e) => {
                    debug!(site = %shared.identity.site, error = %e, "the operator's watch did not answer; asking again after one peer-check interval");
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(shared.timing().peer_check_interval) => {}
                    }
                }
            },
        }
    }
}
