//! The playground: a whole failover group on one machine.
//!
//! | module | owns |
//! |---|---|
//! | [`playground`] | starting and stopping everything: MariaDB servers, operator, sidecars, links; chaos actions |
//! | [`proxy`] | loopback TCP proxies standing for network links (cut, heal) |
//! | [`counter`] | the counter app (writes through the router, never retries a write) |
//! | [`measure`] | a planned switchover's write gap as an application behind the router sees it |
//! | [`router`] | HAProxy in front of the servers, checking each sidecar's `/primary` |
//! | [`dashboard`] | the live dashboard page, its event stream and the chaos API |
//! | [`scenario`] | the seeds' scenarios as scripts that fail when the outcome does not happen |

pub mod control;
pub mod counter;
pub mod dashboard;
pub mod errors;
pub mod measure;
pub mod playground;
pub mod proxy;
pub mod router;
pub mod scenario;

use std::sync::Arc;

use playground::{GROUP, Playground, PlaygroundError, PlaygroundOptions};
use tokio::time::Instant;

/// Starts the playground, prints where everything runs, serves the app and the dashboard,
/// and stops everything on SIGINT/SIGTERM. Returns the process's exit code.
pub async fn run(opts: PlaygroundOptions) -> i32 {
    let started = Instant::now();
    let step = std::sync::atomic::AtomicUsize::new(0);
    let progress = |msg: &str| {
        let n = step.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        eprintln!("[{n}] {msg}… ({:.1} s)", started.elapsed().as_secs_f64());
    };
    // The app's and the dashboard's ports are taken first and held while everything else
    // starts: checked and released, another process could take them in the meantime.
    let mut held = Vec::new();
    for (port, what, flag) in [
        (opts.app_port, "counter app", "--app-port"),
        (opts.dashboard_port, "dashboard", "--dashboard-port"),
    ] {
        let Ok(l) = tokio::net::TcpListener::bind(pg_addr(port)).await else {
            eprintln!("error: {}", PlaygroundError::PortInUse { port, what, flag });
            return 2;
        };
        held.push(l);
    }
    let (Some(dash_l), Some(app_l)) = (held.pop(), held.pop()) else {
        return 1;
    };
    let pg = match Playground::start(opts, &progress).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return if matches!(e, PlaygroundError::PortInUse { .. }) {
                2
            } else {
                1
            };
        }
    };
    let app = match serve(app_l, pg.counter.clone().router()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            pg.shutdown().await;
            return 1;
        }
    };
    let dash = match serve(dash_l, dashboard::router(pg.clone())) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            pg.shutdown().await;
            return 1;
        }
    };
    progress("ready");
    print_summary(&pg, app, dash);
    bloodraven_runtime::shutdown::signal().await;
    eprintln!("stopping everything the playground started…");
    pg.shutdown().await;
    eprintln!("stopped.");
    0
}

fn pg_addr(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

fn serve(
    l: tokio::net::TcpListener,
    router: axum::Router,
) -> Result<std::net::SocketAddr, std::io::Error> {
    let bound = l.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(l, router).await;
    });
    Ok(bound)
}

fn print_summary(pg: &Arc<Playground>, app: std::net::SocketAddr, dash: std::net::SocketAddr) {
    let ca = pg.files.pki.ca_cert.display();
    let deploy = pg.deploy_url();
    println!();
    println!("Bloodraven playground is running (Ctrl-C stops everything it started).");
    println!();
    println!("  dashboard         http://{dash}/");
    println!("  counter app       http://{app}/api/counter   (POST /api/increment)");
    println!(
        "  operator          http://127.0.0.1:{}/status  (/active-site, /metrics)",
        pg.opts.operator_port
    );
    println!("  deploy API (TLS)  {deploy}   CA: {ca}");
    if let Some(etcd) = pg.etcd_endpoints() {
        println!(
            "  control plane     etcd {}  (store.etcd, leaseTTL {})",
            etcd.join(","),
            control::ETCD_LEASE_TTL
        );
        for (name, http) in pg.operator_addresses() {
            let name = name.as_str();
            println!("    {name:<15} http://{http}/readyz");
        }
        println!(
            "                    the operator and deploy API addresses above follow whichever operator leads"
        );
    }
    println!(
        "  router (HAProxy)  mysql://127.0.0.1:{} (the primary)  mysql://127.0.0.1:{} (replicas)",
        pg.opts.router_port, pg.opts.router_replica_port
    );
    for (i, name) in playground::SITES.iter().enumerate() {
        println!(
            "  site {name:<7}      sidecar https://127.0.0.1:{}/status",
            pg.sidecar_ports[i]
        );
    }
    println!(
        "  component CA      {}  (curl --cacert it; /peer/* also needs a site's certificate from pki/)",
        pg.pki.ca.cert.display()
    );
    println!("  state and logs    {}", pg.dir.display());
    println!();
    // The binary that runs the playground: someone who started it with scripts/playground does
    // not have `bloodraven` on PATH.
    let exe = pg.opts.exe.display();
    let dashboard_flag = if dash.port() == 8091 {
        String::new()
    } else {
        format!(" --dashboard http://{dash}")
    };
    println!("A deploy token for ci/deployer (authorized on MysqlDatabase counter-app):");
    println!(
        "  TOKEN=$({exe} token issue --config {} --namespace ci --service-account deployer)",
        pg.files.config.display()
    );
    println!();
    println!("The deploy API, as in the lease docs:");
    println!(
        "  curl -s --cacert {ca} -H \"Authorization: Bearer $TOKEN\" {deploy}/deploy/v1/groups/{GROUP}"
    );
    println!(
        "  curl -s --cacert {ca} -H \"Authorization: Bearer $TOKEN\" -X POST {deploy}/deploy/v1/groups/{GROUP}/leases \\"
    );
    println!(
        "       -d '{{\"kind\":\"migration\",\"operationId\":\"a1c3f0e2\",\"instance\":\"counter-app\",\"ttlSeconds\":30}}' -w ' %{{http_code}}\\n'"
    );
    println!(
        "  curl -s --cacert {ca} -H \"Authorization: Bearer $TOKEN\" -X POST {deploy}/deploy/v1/groups/{GROUP}/leases \\"
    );
    println!(
        "       -d '{{\"kind\":\"failover-hold\",\"operationId\":\"a1c3f0e2\",\"instance\":\"counter-app\",\"ttlSeconds\":30}}' -w ' %{{http_code}}\\n'"
    );
    println!();
    println!("Chaos from the command line (same as the dashboard's buttons):");
    println!("  {exe} playground chaos kill-site iad{dashboard_flag}");
    println!("      (also restart-site [--writable], isolate-site, isolate-site-from-operator,");
    println!(
        "       isolate-site-from-peers, heal-site, isolate-operator, heal-operator, failover pdx,"
    );
    println!(
        "       stop-operator, start-operator, take-lease, release-lease, revoke-all, increment)"
    );
    if pg.etcd.is_some() {
        println!(
            "      (etcd: kill-leading-operator, stop-etcd-member [m0|m1|m2], stop-etcd-leader, start-etcd)"
        );
    }
    println!("  {exe} playground scenario kill-primary{dashboard_flag}");
    println!("      (also operator-down, deferred-failover, isolate-primary)");
    println!(
        "  {exe} failover --config {} --group {GROUP} --to pdx",
        pg.files.config.display()
    );
    println!();
}
