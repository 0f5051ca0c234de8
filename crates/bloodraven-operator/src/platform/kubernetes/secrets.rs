//! Kubernetes Secrets as the platform's [`SecretStore`], read through the API server.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use crate::secrets::{SecretError, SecretFuture, SecretStore};

/// Reads Secrets through the API server.
#[derive(Clone)]
pub struct SecretReader {
    client: kube::Client,
}

impl std::fmt::Debug for SecretReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretReader").finish_non_exhaustive()
    }
}

impl SecretReader {
    pub fn new(client: kube::Client) -> Self {
        SecretReader { client }
    }
}

impl SecretStore for SecretReader {
    fn read<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> SecretFuture<'a, BTreeMap<String, Vec<u8>>> {
        Box::pin(async move {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
            let s = api.get(name).await.map_err(|e| SecretError::Read {
                namespace: namespace.into(),
                name: name.into(),
                detail: e.to_string(),
            })?;
            Ok(s.data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect())
        })
    }
}
