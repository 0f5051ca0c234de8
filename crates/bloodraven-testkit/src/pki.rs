//! A component PKI for tests: one CA (in a temporary directory kept for the process), the
//! certificates of group `playground` in namespace `default` issued as a test asks for them,
//! and the hostile ones a test needs (another CA's, an expired one, another group's).
//!
//! [`TestPki::fake`] is one certificate that names both the group's operator and a site
//! called `fake`, so one fake server stands in for the operator or for a peer sidecar.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bloodraven_core::identity::ComponentId;
use bloodraven_core::time::{Clock as _, Timestamp};
use bloodraven_runtime::mtls::local::GroupPki;
use bloodraven_runtime::mtls::{ComponentTls, TlsFiles};
use bloodraven_runtime::pki::{self, IssueRequest, Subject};

/// The group every test certificate belongs to.
pub const GROUP: &str = "playground";
pub const NAMESPACE: &str = "default";

/// The tests' component PKI.
#[derive(Debug)]
pub struct TestPki {
    pub pki: GroupPki,
    issued: Mutex<BTreeSet<String>>,
}

/// The process's one test PKI.
pub fn pki() -> &'static TestPki {
    static PKI: OnceLock<TestPki> = OnceLock::new();
    PKI.get_or_init(|| TestPki::create(&temp_dir("bloodraven-test-pki")))
}

fn temp_dir(prefix: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn now() -> Timestamp {
    bloodraven_runtime::clock::SystemClock.now()
}

impl TestPki {
    /// A new CA in `dir` with the operator's certificate and the fake's.
    pub fn create(dir: &std::path::Path) -> TestPki {
        let pki = GroupPki::create(dir, NAMESPACE, GROUP, &[], now()).expect("a test CA");
        let issued = pki::issue(
            &pki.ca,
            &IssueRequest {
                subject: Subject::Component(vec![
                    ComponentId::operator(NAMESPACE, GROUP),
                    ComponentId::site(NAMESPACE, GROUP, "fake"),
                ]),
                ips: vec![std::net::IpAddr::from([127, 0, 0, 1])],
                dns: vec!["localhost".into()],
                not_before: now(),
                valid_for: pki::DEFAULT_VALIDITY,
            },
        )
        .expect("the fake's certificate");
        pki::write_issued(&issued, dir, "fake").expect("write the fake's certificate");
        TestPki {
            pki,
            issued: Mutex::new(["operator".to_string(), "fake".to_string()].into()),
        }
    }

    /// The CA bundle.
    pub fn ca(&self) -> PathBuf {
        self.pki.ca.cert.clone()
    }

    /// A database server certificate of this CA (naming 127.0.0.1), for a launcher's servers:
    /// issued once per process.
    pub fn server_tls(&self) -> bloodraven_launch::mysql::ServerTls {
        let mut issued = self
            .issued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if issued.insert("mariadb".to_string()) {
            self.pki
                .issue_server("mariadb", now())
                .expect("a server certificate");
        }
        let f = self.pki.files("mariadb");
        bloodraven_launch::mysql::ServerTls {
            ca: f.ca,
            cert: f.cert,
            key: f.key,
        }
    }

    /// `site`'s files (a site of `playground`), issued the first time they are asked for.
    pub fn site(&self, site: &str) -> TlsFiles {
        let mut issued = self.issued.lock().unwrap_or_else(PoisonError::into_inner);
        if !issued.contains(site) {
            self.pki
                .issue(&ComponentId::site(NAMESPACE, GROUP, site), site, now())
                .expect("a site's certificate");
            issued.insert(site.to_string());
        }
        self.pki.files(site)
    }

    /// `site`'s identity, loaded.
    pub fn site_tls(&self, site: &str) -> Arc<ComponentTls> {
        ComponentTls::load(self.site(site)).expect("a site's TLS identity")
    }

    /// The operator's files.
    pub fn operator(&self) -> TlsFiles {
        self.pki.files("operator")
    }

    /// The fake's identity (the operator and site `fake` in one certificate).
    pub fn fake_tls(&self) -> Arc<ComponentTls> {
        ComponentTls::load(self.pki.files("fake")).expect("the fake's TLS identity")
    }

    /// A certificate of `id` issued by this CA, valid from `not_before` for `valid_for`
    /// (an expired one: a `not_before` far enough back), as `<stem>.crt`/`.key`.
    pub fn issue(
        &self,
        id: &ComponentId,
        stem: &str,
        not_before: Timestamp,
        valid_for: Duration,
    ) -> TlsFiles {
        self.pki
            .issue_for(id, stem, not_before, valid_for)
            .expect("a test certificate")
    }

    /// An HTTP client that trusts this CA (host names checked: every test certificate names
    /// 127.0.0.1 and localhost) and presents no certificate.
    pub fn client(&self) -> reqwest::Client {
        bloodraven_runtime::tls::http_client(Some(&self.ca()), Duration::from_secs(10))
            .expect("an HTTP client")
    }

    /// An HTTP client that trusts this CA and presents `files`' certificate.
    pub fn client_as(&self, files: &TlsFiles) -> reqwest::Client {
        bloodraven_runtime::tls::http_client_with(
            Some(&self.ca()),
            Some(&bloodraven_runtime::tls::ClientIdentity {
                cert_file: files.cert.clone(),
                key_file: files.key.clone(),
            }),
            Some(Duration::from_secs(10)),
            Duration::from_secs(5),
        )
        .expect("an HTTP client with a certificate")
    }
}

/// Another installation's CA, with a certificate for `site` of `playground` (the right name,
/// the wrong issuer).
pub fn foreign(site: &str) -> (TestPki, TlsFiles) {
    let other = TestPki::create(&temp_dir(&format!("bloodraven-foreign-pki-{site}")));
    let files = other.site(site);
    (other, files)
}
