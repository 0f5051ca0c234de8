//! Who a sidecar is: its site, group and namespace. Read by the configuration, the trust
//! checks, the contacts and the monitor; depends on nothing.

/// Who this sidecar is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// This site's name (DNS-1123 label).
    pub site: String,
    pub group: String,
    pub namespace: String,
}
