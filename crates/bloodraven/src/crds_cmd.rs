//! `bloodraven crds`: prints the `CustomResourceDefinitions` of `MysqlFailoverGroup` and
//! `MysqlDatabase` as one YAML stream, for `bloodraven crds | kubectl apply -f -`.

use clap::Args;

use crate::cli::exit;

#[derive(Debug, Args)]
pub struct CrdsArgs {}

pub fn run(_: &CrdsArgs) -> i32 {
    match bloodraven_kube::crd::yaml() {
        Ok(text) => {
            print!("{text}");
            exit::OK
        }
        Err(e) => {
            eprintln!("error: cannot render the CRDs: {e}");
            exit::ERROR
        }
    }
}
