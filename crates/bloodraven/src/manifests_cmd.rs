//! `bloodraven manifests`: the Helm chart's install as plain YAML, from the same values, for
//! `bloodraven manifests --namespace bloodraven -f values.yaml | kubectl apply -f -` where
//! Helm is not used.

use std::path::PathBuf;

use clap::Args;

use crate::cli::exit;

#[derive(Debug, Args)]
pub struct ManifestsArgs {
    /// The release name (`helm install NAME`): objects are named after it.
    #[arg(long, default_value = "bloodraven")]
    pub release_name: String,
    /// The namespace the operator runs in (`helm install -n NAMESPACE`).
    #[arg(long, short = 'n', default_value = "bloodraven")]
    pub namespace: String,
    /// A values file, merged over the chart's defaults as Helm merges it.
    #[arg(long = "values", short = 'f')]
    pub values: Option<PathBuf>,
    /// Leave out the custom resource definitions (apply them with `bloodraven crds`).
    #[arg(long)]
    pub skip_crds: bool,
}

pub fn run(args: &ManifestsArgs) -> i32 {
    let text = match &args.values {
        Some(p) => match std::fs::read_to_string(p) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("error: cannot read the values file {}: {e}", p.display());
                return exit::USAGE;
            }
        },
        None => None,
    };
    for (field, value) in [
        ("--release-name", &args.release_name),
        ("--namespace", &args.namespace),
    ] {
        if let Err(rule) = bloodraven_core::names::check_dns1123_label(value) {
            eprintln!("error: {field}: {rule}");
            return exit::USAGE;
        }
    }
    let values = match bloodraven_kube::manifests::values(text.as_deref()) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let release = bloodraven_kube::manifests::Release {
        name: args.release_name.clone(),
        namespace: args.namespace.clone(),
    };
    match bloodraven_kube::manifests::render(&values, &release, !args.skip_crds)
        .and_then(|o| bloodraven_kube::manifests::yaml(&o))
    {
        Ok(y) => {
            print!("{y}");
            exit::OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            exit::ERROR
        }
    }
}
