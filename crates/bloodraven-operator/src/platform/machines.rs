//! What the platforms on plain machines share (the embedded one and etcd): deploy tokens the
//! operator issues itself, and a site's workload as its configured MySQL endpoint. Neither
//! platform borrows the other's parts: both take them from here.

use std::sync::Arc;

use bloodraven_core::config::{GroupConfig, SiteConfig};
use bloodraven_runtime::clock::SharedClock;

use super::{
    PlatformError, PlatformFuture, RoleLabel, SiteWorkloads, UpdateNeed, Workload, WorkloadError,
};
use crate::auth::{Authenticator, HmacTokens, SigningKey};
use crate::config::DeployApiSettings;

/// Deploy tokens the operator issues itself (`bloodraven token issue`), checked with
/// `tokenSigningKeyFile`: the embedded and the etcd platforms'.
pub fn hmac_tokens(
    deploy: &DeployApiSettings,
    clock: &SharedClock,
) -> Result<Arc<dyn Authenticator>, PlatformError> {
    let key = deploy
        .token_key_file
        .as_ref()
        .ok_or(PlatformError::NoTokenKey)?;
    Ok(Arc::new(HmacTokens {
        key: Arc::new(SigningKey::load(key)?),
        audience: deploy.audience.clone(),
        clock: clock.clone(),
    }))
}

/// A site's workload outside Kubernetes: its configured MySQL endpoint. Nothing to label; its
/// update is its own update command ([`super::command`]).
#[derive(Debug)]
pub struct Endpoints;

impl SiteWorkloads for Endpoints {
    fn find<'a>(
        &'a self,
        _group: &'a GroupConfig,
        site: &'a SiteConfig,
    ) -> PlatformFuture<'a, Result<Vec<Workload>, WorkloadError>> {
        let endpoint = Workload {
            site: site.name.clone(),
            name: format!("{}:{}", site.mysql_host, site.mysql_port),
            role: None,
        };
        Box::pin(async move { Ok(vec![endpoint]) })
    }

    fn label_role<'a>(
        &'a self,
        _group: &'a GroupConfig,
        _site: &'a SiteConfig,
        _what: &'a str,
        _role: RoleLabel,
    ) -> PlatformFuture<'a, Result<bool, WorkloadError>> {
        Box::pin(async { Ok(false) })
    }

    fn update_need<'a>(
        &'a self,
        _group: &'a GroupConfig,
        site: &'a SiteConfig,
    ) -> PlatformFuture<'a, Result<UpdateNeed, WorkloadError>> {
        let need = if site.update_command().is_some() {
            UpdateNeed::Always
        } else {
            UpdateNeed::NotUpdatable
        };
        Box::pin(async move { Ok(need) })
    }

    fn update<'a>(
        &'a self,
        group: &'a GroupConfig,
        site: &'a SiteConfig,
    ) -> PlatformFuture<'a, Result<(), WorkloadError>> {
        Box::pin(async move {
            super::command::run_command(&group.name, site)
                .await
                .map_err(|e| WorkloadError::Update {
                    site: site.name.clone(),
                    detail: e.to_string(),
                })
        })
    }
}
