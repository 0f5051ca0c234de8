//! `bloodraven alerts`: Bloodraven's alerting rules as a Prometheus rules file, for a
//! Prometheus without the operator (the chart's `prometheusRule` renders the same rules as a
//! `PrometheusRule`). Each alert can be tuned by name, as the chart's values tune it.

use std::collections::BTreeMap;

use bloodraven_core::alerts::{self, Tuning};
use clap::Args;

use crate::cli::exit;

#[derive(Debug, Args)]
pub struct AlertsArgs {
    /// Tune one alert: `NAME.for=DURATION`, `NAME.threshold=NUMBER`, `NAME.window=DURATION`
    /// or `NAME.disabled=true` (repeatable; the names are in docs/runbook.md).
    #[arg(long = "set", value_name = "NAME.FIELD=VALUE")]
    pub set: Vec<String>,
    /// Where each alert's `runbook_url` points; `#<alert name, lower case>` is appended.
    #[arg(long, default_value = alerts::RUNBOOK_URL)]
    pub runbook_url: String,
}

/// The tunings `--set` names, or the field and rule of the first one that is off.
fn tunings(set: &[String]) -> Result<BTreeMap<String, Tuning>, alerts::TuningError> {
    let mut out: BTreeMap<String, Tuning> = BTreeMap::new();
    for s in set {
        let off = |rule: &str| alerts::TuningError {
            field: format!("--set {s}"),
            rule: rule.to_string(),
        };
        let (path, value) = s
            .split_once('=')
            .ok_or_else(|| off("must be NAME.FIELD=VALUE"))?;
        let (name, field) = path
            .split_once('.')
            .ok_or_else(|| off("must be NAME.FIELD=VALUE"))?;
        let t = out.entry(name.to_string()).or_default();
        match field {
            "for" => t.for_ = Some(value.to_string()),
            "threshold" => t.threshold = Some(value.to_string()),
            "window" => t.window = Some(value.to_string()),
            "disabled" => {
                t.disabled = value
                    .parse()
                    .map_err(|_| off("disabled must be true or false"))?;
            }
            _ => return Err(off("FIELD must be for, threshold, window or disabled")),
        }
    }
    alerts::check(&out, "--set")?;
    Ok(out)
}

pub fn run(args: &AlertsArgs) -> i32 {
    let tuning = match tunings(&args.set) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    if !args.runbook_url.starts_with("https://") && !args.runbook_url.starts_with("http://") {
        eprintln!("error: --runbook-url: must be an http:// or https:// URL");
        return exit::USAGE;
    }
    let file = alerts::rules_file(&tuning, &args.runbook_url);
    match serde_saphyr::to_string(&file) {
        Ok(y) => {
            println!(
                "# Bloodraven's alerts (`bloodraven alerts`); what each means and what to do: docs/runbook.md"
            );
            print!("{y}");
            exit::OK
        }
        Err(e) => {
            eprintln!("error: cannot encode the rules: {e}");
            exit::ERROR
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_parses_and_names_what_is_off() {
        let t = tunings(&[
            "BloodravenNoPrimary.for=0s".into(),
            "BloodravenEmergencyFailover.window=1m".into(),
            "BloodravenSidecarsAbsent.disabled=true".into(),
        ])
        .unwrap();
        assert_eq!(t["BloodravenNoPrimary"].for_.as_deref(), Some("0s"));
        assert_eq!(
            t["BloodravenEmergencyFailover"].window.as_deref(),
            Some("1m")
        );
        assert!(t["BloodravenSidecarsAbsent"].disabled);
        for (bad, says) in [
            ("BloodravenNoPrimary", "NAME.FIELD=VALUE"),
            ("BloodravenNoPrimary=1m", "NAME.FIELD=VALUE"),
            ("BloodravenNoPrimary.color=red", "FIELD must be"),
            ("BloodravenNoPrimary.disabled=maybe", "true or false"),
            ("BloodravenNoPrimary.for=later", "Prometheus duration"),
            ("Nope.for=1m", "no such alert"),
        ] {
            let e = tunings(&[bad.into()]).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
