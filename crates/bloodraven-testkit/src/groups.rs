//! Operator configurations of many groups, for scale and deploy-API stories: each group has
//! one site whose server and sidecar never answer (port 1, port 9), and one `MysqlDatabase`.

use std::fmt::Write as _;

/// `n` groups `<group>0…` in namespace `default`, each with a database `<database>i` that
/// lists the `ci/deployer` service account as a deployment client when `deployer` is set.
/// The site's credentials are the file `site.cred` next to the configuration.
pub fn silent_groups(n: usize, group: &str, database: &str, deployer: bool) -> String {
    let clients = if deployer {
        "  deploymentClients: [{namespace: ci, serviceAccount: deployer}]\n"
    } else {
        ""
    };
    let mut text = String::new();
    for i in 0..n {
        let _ = write!(
            text,
            "---\napiVersion: bloodraven.shipstream.io/v1alpha1\nkind: MysqlFailoverGroup\n\
             metadata: {{name: {group}{i}, namespace: default}}\nspec:\n  sites:\n    - name: a\n      \
             mysql: {{host: 127.0.0.1, port: 1, credentials: {{file: site.cred}}}}\n      \
             sidecar: {{url: \"http://127.0.0.1:9\"}}\n\
             ---\napiVersion: bloodraven.shipstream.io/v1alpha1\nkind: MysqlDatabase\n\
             metadata: {{name: {database}{i}, namespace: default}}\nspec:\n  \
             failoverGroupRef: {{name: {group}{i}}}\n{clients}"
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_group_and_database_is_named_and_linked() {
        let text = silent_groups(2, "g", "db", true);
        assert_eq!(text.matches("kind: MysqlFailoverGroup").count(), 2);
        assert!(text.contains("metadata: {name: g1, namespace: default}"));
        assert!(text.contains("metadata: {name: db1, namespace: default}"));
        assert!(text.contains("failoverGroupRef: {name: g1}\n  deploymentClients:"));
        assert!(!silent_groups(1, "g", "db", false).contains("deploymentClients"));
    }
}
