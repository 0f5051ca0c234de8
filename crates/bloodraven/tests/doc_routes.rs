//! Every HTTP route that the README, `docs/`, the chart's values and notes, or the examples
//! name exists: each is requested on a running playground (the operator's plain and TLS
//! listeners, a sidecar, the counter app, the dashboard) and must reach a handler on at least
//! one of them, not the listener's fallback. A page that names a route nobody serves fails
//! here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bloodraven_playground::playground::{Playground, PlaygroundOptions};
use regex::Regex;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The files whose text names routes.
fn sources() -> Vec<PathBuf> {
    let r = root();
    let mut out = vec![
        r.join("README.md"),
        r.join("charts/bloodraven/values.yaml"),
        r.join("charts/bloodraven/templates/NOTES.txt"),
    ];
    let mut dirs = vec![r.join("docs"), r.join("examples")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p
                .extension()
                .is_some_and(|x| x == "md" || x == "yaml" || x == "yml" || x == "txt")
            {
                out.push(p);
            }
        }
    }
    out
}

/// Paths that look like routes but are something else: files, and other programs' APIs named
/// for comparison.
fn not_ours(path: &str) -> bool {
    const FILES: [&str; 18] = [
        "/tmp",
        "/proc",
        "/var",
        "/etc",
        "/usr",
        "/run",
        "/root",
        "/home",
        "/records",
        "/migrations",
        "/dev",
        "/opt",
        "/srv",
        "/bin",
        "/sbin",
        "/lib",
        "/data",
        "/work",
    ];
    // etcd's JSON gateway (`/v3/kv/put`), the anchor the deploy API is measured against; and
    // keys in etcd under the default prefix (`/bloodraven/MysqlFailoverGroup/…`).
    path.starts_with("/v3/")
        || path.starts_with("/bloodraven/")
        || FILES
            .iter()
            .any(|f| path == *f || path.starts_with(&format!("{f}/")))
}

/// Routes named bare (`/active-site, /status`) in the comments of a values file or in plain
/// text notes, besides what [`routes_in`] finds.
fn bare_routes_in(text: &str, comments_only: bool) -> BTreeSet<String> {
    let re = Regex::new(r"(?:^|[\s,(])(/[a-z][A-Za-z0-9{}._/-]*)").unwrap();
    let mut out = routes_in(text);
    for line in text.lines() {
        let line = line.trim_start();
        if comments_only && !line.starts_with('#') {
            continue;
        }
        for c in re.captures_iter(line) {
            let p = c[1].trim_end_matches('.').to_string();
            if !not_ours(&p) {
                out.insert(p);
            }
        }
    }
    out
}

/// Every route named in `text`: backticked paths, `METHOD /path`, and local or in-cluster URLs.
fn routes_in(text: &str) -> BTreeSet<String> {
    let pieces = [
        // An opening backtick (not the closing one of `Set`/`Adopt`).
        Regex::new(r"(?:^|[^A-Za-z0-9_`])`(/[A-Za-z0-9{}._/-]*)").unwrap(),
        Regex::new(r"\b(?:GET|POST|PUT|DELETE)\s+(/[A-Za-z0-9{}._/-]*)").unwrap(),
        Regex::new(r"https?://(?:127\.0\.0\.1|localhost|bloodraven[a-z0-9.-]*)(?::[0-9]+)?(/[A-Za-z0-9{}._/-]*)")
            .unwrap(),
    ];
    let mut out = BTreeSet::new();
    for re in &pieces {
        for c in re.captures_iter(text) {
            let p = c[1].trim_end_matches('.').to_string();
            if p.len() > 1 && !not_ours(&p) {
                out.insert(p);
            }
        }
    }
    out
}

/// A concrete request path for a documented one (placeholders filled in).
fn concrete(path: &str) -> String {
    let fill = Regex::new(r"\{[^}]*\}").unwrap();
    let filled = fill.replace_all(path, |c: &regex::Captures| match &c[0] {
        "{group}" | "{g}" => "playground".to_string(),
        "{kind}" => "migration".to_string(),
        "{action}" => "increment".to_string(),
        _ => "x".to_string(),
    });
    let p = filled.trim_end_matches('/');
    if p.is_empty() {
        "/".into()
    } else {
        p.to_string()
    }
}

/// Whether an answer came from a handler rather than the listener's fallback.
fn reached_a_handler(status: u16, body: &str) -> bool {
    if status != 404 {
        return true;
    }
    let fallback = [
        "no such endpoint",
        "no such deploy API resource",
        "the deploy API is served only on the TLS listener",
    ];
    !body.is_empty() && !fallback.iter().any(|f| body.contains(f))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_the_docs_name_is_served() {
    let mut named: BTreeSet<(String, String)> = BTreeSet::new();
    for f in sources() {
        let text = std::fs::read_to_string(&f).unwrap();
        let found = match f.extension().and_then(|x| x.to_str()) {
            Some("md") => routes_in(&text),
            Some("txt") => bare_routes_in(&text, false),
            _ => bare_routes_in(&text, true),
        };
        for r in found {
            named.insert((
                r,
                f.strip_prefix(root()).unwrap_or(&f).display().to_string(),
            ));
        }
    }
    assert!(
        named.iter().any(|(r, _)| r == "/active-site"),
        "the extraction finds the documented routes: {named:?}"
    );
    let pg = Playground::start(
        PlaygroundOptions::on_free_ports(env!("CARGO_BIN_EXE_bloodraven").into()),
        &|_| {},
    )
    .await
    .expect("the playground starts");
    // The counter app and the dashboard, as `bloodraven playground` serves them.
    let serve = async |router: axum::Router| {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(l, router).await;
        });
        addr
    };
    let app = serve(pg.counter.clone().router()).await;
    let dashboard = serve(bloodraven_playground::dashboard::router(pg.clone())).await;
    // The deploy API's certificate comes from its own CA, the sidecars' from the component
    // CA; the peer endpoints need a site's certificate.
    let http =
        bloodraven_runtime::tls::http_client(Some(&pg.files.pki.ca_cert), Duration::from_secs(5))
            .unwrap();
    let pdx = pg.pki.files("pdx");
    let components = bloodraven_runtime::tls::http_client_with(
        Some(&pg.pki.ca.cert),
        Some(&bloodraven_runtime::tls::ClientIdentity {
            cert_file: pdx.cert,
            key_file: pdx.key,
        }),
        Some(Duration::from_secs(5)),
        Duration::from_secs(5),
    )
    .unwrap();
    let bases = [
        (format!("http://127.0.0.1:{}", pg.opts.operator_port), &http),
        (pg.deploy_url(), &http),
        (
            format!("https://127.0.0.1:{}", pg.sidecar_ports[0]),
            &components,
        ),
        (format!("http://{app}"), &http),
        (format!("http://{dashboard}"), &http),
    ];
    let mut served = BTreeSet::new();
    for (route, _) in &named {
        let path = concrete(route);
        for (base, http) in &bases {
            // GET only: a handler that takes another method answers 405, still not the
            // fallback.
            let Ok(r) = http.get(format!("{base}{path}")).send().await else {
                continue;
            };
            let status = r.status().as_u16();
            let body = r.text().await.unwrap_or_default();
            if reached_a_handler(status, &body) {
                served.insert(route.clone());
                break;
            }
        }
    }
    // A family's name (`/deploy/v1`, `/peer/`) is fine when routes under it are served.
    let missing: Vec<String> = named
        .iter()
        .filter(|(route, _)| {
            let family = format!("{}/", route.trim_end_matches('/'));
            !served.contains(route) && !served.iter().any(|s| s.starts_with(&family))
        })
        .map(|(route, file)| format!("{route} (named in {file})"))
        .collect();
    pg.shutdown().await;
    assert!(
        missing.is_empty(),
        "routes named in the docs that nothing serves: {missing:#?}"
    );
}

#[test]
fn the_extraction_finds_what_it_should_and_nothing_else() {
    let text = "`/active-site?namespace=N&group=G` GET /status and <http://127.0.0.1:8090/api/counter>, \
                `/var/lib/bloodraven`, `/v3/kv/put`, https://bloodraven.bloodraven.svc:8443/deploy/v1/groups/{group}/leases, `/`";
    let got = routes_in(text);
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        [
            "/active-site",
            "/api/counter",
            "/deploy/v1/groups/{group}/leases",
            "/status"
        ]
    );
    assert_eq!(
        concrete("/deploy/v1/groups/{group}/leases/{kind}/{operationId}"),
        "/deploy/v1/groups/playground/leases/migration/x"
    );
    assert!(!reached_a_handler(404, ""));
    assert!(!reached_a_handler(
        404,
        r#"{"error":"not_found","message":"no such endpoint"}"#
    ));
    assert!(reached_a_handler(
        404,
        r#"{"error":"not_found","message":"no such group"}"#
    ));
    assert!(reached_a_handler(401, ""));
    // The comment a values file once carried names a route that never existed.
    let values = "service:\n  # :8082, plain HTTP: /active-site, /sidecar/v1, /healthz.\n  httpPort: 8082 # /not-a-comment\n";
    assert_eq!(
        bare_routes_in(values, true).into_iter().collect::<Vec<_>>(),
        ["/active-site", "/healthz", "/sidecar/v1"]
    );
}
