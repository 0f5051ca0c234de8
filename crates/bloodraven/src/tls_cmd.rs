//! `bloodraven tls ca|issue`: the installation's component CA and the certificates every
//! component proves itself with (docs/security.md). Both run offline.
//!
//! Exit codes: 0 written, 1 could not write, 2 bad input (nothing written).

use std::net::IpAddr;
use std::path::PathBuf;

use bloodraven_core::identity::ComponentId;
use bloodraven_core::time::Clock as _;
use bloodraven_runtime::pki::{self, CaFiles, IssueRequest, PkiError, Subject};
use clap::{Args, Subcommand};

use crate::cli::exit;

#[derive(Debug, Args)]
pub struct TlsArgs {
    #[command(subcommand)]
    command: TlsCommand,
}

#[derive(Debug, Subcommand)]
enum TlsCommand {
    /// Make a component CA: DIR/ca.crt and DIR/ca.key (owner-only). Never overwrites one.
    Ca {
        /// The directory to write into (created when missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = "Bloodraven component CA")]
        name: String,
    },
    /// Issue a certificate from the CA in --ca: a site's sidecar, the operator, a router, or
    /// (--server) a database server. Writes OUT/<name>.crt and OUT/<name>.key (owner-only).
    Issue(IssueArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("party").required(true).args(["site", "operator", "router", "server"])))]
struct IssueArgs {
    /// The CA directory (`tls ca --out`): its ca.crt (a bundle during a rotation; the issuer is
    /// the certificate that matches ca.key) and ca.key.
    #[arg(long, value_name = "DIR")]
    ca: PathBuf,
    /// The group the party belongs to; repeat for an operator that runs several groups.
    #[arg(long, value_name = "NAME")]
    group: Vec<String>,
    /// The group's namespace.
    #[arg(long, value_name = "NAME", default_value = "default")]
    namespace: String,
    /// A site's sidecar: `spiffe://bloodraven/<namespace>/<group>/<site>`.
    #[arg(long, value_name = "SITE")]
    site: Option<String>,
    /// The operator: `spiffe://bloodraven/<namespace>/<group>/operator` for each --group.
    #[arg(long)]
    operator: bool,
    /// A router: `spiffe://bloodraven/<namespace>/<group>/router/<name>`.
    #[arg(long, value_name = "NAME")]
    router: Option<String>,
    /// A database server (no component identity; name it with --ip and --dns).
    #[arg(long)]
    server: bool,
    /// An IP address SAN (for clients that check host names: curl, HAProxy, MariaDB).
    #[arg(long, value_name = "IP")]
    ip: Vec<String>,
    /// A DNS name SAN.
    #[arg(long, value_name = "NAME")]
    dns: Vec<String>,
    /// How long the certificate is valid: whole days (90d) or a duration (2160h).
    #[arg(long, value_name = "DURATION", default_value = "365d")]
    valid_for: String,
    /// The file names' stem (default: the site, `operator`, `router-<name>` or `server`).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Where to write (created when missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

pub fn run(args: TlsArgs) -> i32 {
    match args.command {
        TlsCommand::Ca { out, name } => {
            let now = bloodraven_runtime::clock::SystemClock.now();
            match pki::create_ca(&out, &name, now) {
                Ok(files) => {
                    eprintln!(
                        "wrote the component CA {} and its key {} (owner-only; keep it off the components' hosts)",
                        files.cert.display(),
                        files.key.display()
                    );
                    exit::OK
                }
                Err(e @ PkiError::Exists { .. }) => {
                    eprintln!("error: {e}");
                    exit::USAGE
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    exit::ERROR
                }
            }
        }
        TlsCommand::Issue(a) => issue(&a),
    }
}

/// The request, or every problem with the arguments (each naming its flag).
fn request(a: &IssueArgs) -> Result<(IssueRequest, String), Vec<String>> {
    let mut errs = Vec::new();
    // Whole days (`90d`) as well as a duration (`2160h`).
    let parsed = match a.valid_for.trim().strip_suffix('d').map(str::parse::<u64>) {
        Some(Ok(days)) => days
            .checked_mul(24 * 3600)
            .map(std::time::Duration::from_secs)
            .ok_or_else(|| "too large".to_string()),
        _ => bloodraven_core::duration::parse_duration(&a.valid_for).map_err(|e| e.to_string()),
    };
    let valid_for = match parsed {
        Ok(d) if d.as_secs() >= 60 => Some(d),
        Ok(_) => {
            errs.push("--valid-for: must be at least 1m".to_string());
            None
        }
        Err(e) => {
            errs.push(format!("--valid-for: {e}"));
            None
        }
    };
    let mut ips = Vec::new();
    for ip in &a.ip {
        match ip.parse::<IpAddr>() {
            Ok(v) => ips.push(v),
            Err(_) => errs.push(format!("--ip {ip:?}: must be an IPv4 or IPv6 address")),
        }
    }
    let ids = |role: &dyn Fn(&str) -> ComponentId| -> Vec<ComponentId> {
        a.group.iter().map(|g| role(g)).collect()
    };
    let (subject, stem) = if a.server {
        if !a.group.is_empty() {
            errs.push("--group: a server certificate names no group (give --ip or --dns)".into());
        }
        (Subject::Server, "server".to_string())
    } else {
        if a.group.is_empty() {
            errs.push("--group: is required for --site, --operator and --router".into());
        }
        if a.group.len() > 1 && !a.operator {
            errs.push("--group: only the operator runs several groups (give it once)".into());
        }
        let (list, stem) = if let Some(site) = &a.site {
            (
                ids(&|g| ComponentId::site(&a.namespace, g, site)),
                site.clone(),
            )
        } else if let Some(r) = &a.router {
            (
                ids(&|g| ComponentId::router(&a.namespace, g, r)),
                format!("router-{r}"),
            )
        } else {
            (
                ids(&|g| ComponentId::operator(&a.namespace, g)),
                "operator".to_string(),
            )
        };
        for id in &list {
            if let Err(e) = id.check() {
                errs.push(e.to_string());
            }
        }
        (Subject::Component(list), stem)
    };
    let stem = a.name.clone().unwrap_or(stem);
    if bloodraven_core::names::check_dns1123_subdomain(&stem).is_err() {
        errs.push(format!(
            "--name {stem:?}: must be a lowercase name (letters, digits, '-', '.')"
        ));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok((
        IssueRequest {
            subject,
            ips,
            dns: a.dns.clone(),
            not_before: bloodraven_runtime::clock::SystemClock.now(),
            valid_for: valid_for.unwrap_or(pki::DEFAULT_VALIDITY),
        },
        stem,
    ))
}

fn issue(a: &IssueArgs) -> i32 {
    let (req, stem) = match request(a) {
        Ok(r) => r,
        Err(errs) => {
            for e in errs {
                eprintln!("error: {e}");
            }
            return exit::USAGE;
        }
    };
    let ca = CaFiles::of(&a.ca);
    let issued = match pki::issue(&ca, &req) {
        Ok(i) => i,
        Err(e @ (PkiError::BadRequest(_) | PkiError::BadCa { .. })) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
        Err(e @ PkiError::Read { .. }) => {
            eprintln!("error: --ca: {e}");
            return exit::USAGE;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ERROR;
        }
    };
    match pki::write_issued(&issued, &a.out, &stem) {
        Ok((cert, key)) => {
            let names = match &req.subject {
                Subject::Component(ids) => ids
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                Subject::Server => "a database server".into(),
            };
            eprintln!(
                "wrote {} ({names}, valid until {}) and its key {} (owner-only)",
                cert.display(),
                req.not_before.plus(req.valid_for),
                key.display()
            );
            exit::OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            exit::ERROR
        }
    }
}
