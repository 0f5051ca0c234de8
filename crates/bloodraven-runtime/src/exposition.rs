//! Which text format `/metrics` answers in. Both the operator and the sidecar encode their
//! registries as OpenMetrics; most scrapers (and `promtool check metrics`) read the classic
//! Prometheus text format, where a counter's `# HELP` and `# TYPE` name the sample
//! (`x_total`), not the family (`x`). So: OpenMetrics only to a client whose `Accept` asks for
//! it, the classic format to everyone else.

/// The content type of the classic Prometheus text format.
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether an `Accept` header asks for OpenMetrics (a `q=0` entry does not).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|entry| {
            let mut parts = entry.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default();
            media.eq_ignore_ascii_case("application/openmetrics-text")
                && !parts.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.parse::<f32>().ok())
                        .is_some_and(|q| q <= 0.0)
                })
        })
    })
}

/// The content type and body to answer with, from an OpenMetrics encoding.
pub fn negotiate(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
    if wants_openmetrics(accept) {
        (OPENMETRICS, openmetrics)
    } else {
        (CLASSIC, to_classic(&openmetrics))
    }
}

/// Rewrites OpenMetrics text in the classic format: counters' `# HELP` and `# TYPE` lines
/// name the `_total` sample, `# UNIT` and `# EOF` go. Samples are unchanged (the encoder
/// writes neither exemplars nor `_created` samples for these registries).
pub fn to_classic(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some(name) = rest.strip_suffix(" counter")
        {
            counters.insert(name.to_string());
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            (counters.contains(name) && !name.ends_with("_total"))
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(rewritten.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OM: &str = "# HELP x_failovers Failovers.\n# TYPE x_failovers counter\nx_failovers_total{group=\"g\"} 0\n# HELP x_lag Lag.\n# TYPE x_lag gauge\n# UNIT x_lag seconds\nx_lag{site=\"a\"} 1\n# EOF\n";

    #[test]
    fn counters_are_named_by_their_sample_and_openmetrics_markers_go() {
        let c = to_classic(OM);
        assert_eq!(
            c,
            "# HELP x_failovers_total Failovers.\n# TYPE x_failovers_total counter\nx_failovers_total{group=\"g\"} 0\n# HELP x_lag Lag.\n# TYPE x_lag gauge\nx_lag{site=\"a\"} 1\n"
        );
    }

    #[test]
    fn openmetrics_only_when_asked_for() {
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4")));
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
        )));
        assert!(!wants_openmetrics(Some(
            "application/openmetrics-text; q=0"
        )));
        assert_eq!(negotiate(None, OM.into()).0, CLASSIC);
        let (ct, body) = negotiate(Some("application/openmetrics-text"), OM.into());
        assert_eq!((ct, body.as_str()), (OPENMETRICS, OM));
    }
}
