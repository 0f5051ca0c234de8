//! Label selectors in Kubernetes' string syntax, for the application a release is for
//! (`--app-selector`, or an application's `selector` in the applications file).
//!
//! Terms are separated by commas: equality (`app=web`, `app==web`, `tier!=backend`), set-based
//! (`env in (prod, staging)`, `env notin (dev)`), existence (`release`) and absence (`!canary`).
//! Every term must hold. Keys follow the label-key rule (an optional DNS-subdomain prefix and
//! `/`, then a name of at most 63 characters), values the label-value rule. Parsing collects no
//! more than the first problem, named by term.

use std::collections::BTreeMap;
use std::fmt;

use super::is_label_value;
use crate::names::check_dns1123_subdomain;

/// How a term compares a label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// One term of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

/// A parsed selector: every requirement must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    pub requirements: Vec<Requirement>,
    /// The text it was parsed from, as typed (for plans and records).
    pub text: String,
}

/// Why a selector did not parse: the term and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

/// Labels a selector does not select: which requirement, and what the labels have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LabelMismatch(pub String);

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.key;
        match self.operator {
            Operator::Equals => write!(f, "{k}={}", self.values[0]),
            Operator::NotEquals => write!(f, "{k}!={}", self.values[0]),
            Operator::In => write!(f, "{k} in ({})", self.values.join(",")),
            Operator::NotIn => write!(f, "{k} notin ({})", self.values.join(",")),
            Operator::Exists => write!(f, "{k}"),
            Operator::DoesNotExist => write!(f, "!{k}"),
        }
    }
}

/// Checks a label key: `[prefix/]name`, the prefix a DNS subdomain, the name 1–63 characters
/// of alphanumerics, `-`, `_`, `.`, starting and ending with an alphanumeric.
pub fn check_label_key(key: &str) -> Result<(), SelectorError> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        check_dns1123_subdomain(p)
            .map_err(|rule| SelectorError(format!("key {key:?}: prefix {rule}")))?;
    }
    if name.is_empty() || !is_label_value(name) {
        return Err(SelectorError(format!(
            "key {key:?}: the name must be 1-63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        )));
    }
    Ok(())
}

fn check_value(key: &str, value: &str) -> Result<(), SelectorError> {
    if is_label_value(value) {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "value {value:?} of {key}: must be at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit (or empty)"
        )))
    }
}

/// Splits on commas outside parentheses.
fn terms(s: &str) -> Result<Vec<&str>, SelectorError> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(SelectorError("a ')' without its '('".into()));
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(SelectorError("a '(' without its ')'".into()));
    }
    out.push(&s[start..]);
    Ok(out)
}

fn requirement(term: &str) -> Result<Requirement, SelectorError> {
    let t = term.trim();
    if t.is_empty() {
        return Err(SelectorError("is empty".into()));
    }
    // Set-based: `key in (…)` / `key notin (…)`.
    let words: Vec<&str> = t.splitn(2, char::is_whitespace).collect();
    if let [key, rest] = words[..] {
        let rest = rest.trim_start();
        for (word, operator) in [("notin", Operator::NotIn), ("in", Operator::In)] {
            if let Some(list) = rest.strip_prefix(word).map(str::trim_start) {
                let inner = list
                    .strip_prefix('(')
                    .and_then(|l| l.strip_suffix(')'))
                    .ok_or_else(|| {
                        SelectorError(format!(
                            "{word} needs a parenthesised list, e.g. {key} {word} (a, b)"
                        ))
                    })?;
                check_label_key(key)?;
                let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
                if values.iter().all(String::is_empty) {
                    return Err(SelectorError(format!(
                        "{key} {word} (): the list must name at least one value"
                    )));
                }
                for v in &values {
                    check_value(key, v)?;
                }
                return Ok(Requirement {
                    key: key.to_string(),
                    operator,
                    values,
                });
            }
        }
    }
    if let Some(key) = t.strip_prefix('!') {
        let key = key.trim();
        check_label_key(key)?;
        return Ok(Requirement {
            key: key.to_string(),
            operator: Operator::DoesNotExist,
            values: Vec::new(),
        });
    }
    for (sep, operator) in [
        ("!=", Operator::NotEquals),
        ("==", Operator::Equals),
        ("=", Operator::Equals),
    ] {
        if let Some((key, value)) = t.split_once(sep) {
            let (key, value) = (key.trim(), value.trim());
            check_label_key(key)?;
            check_value(key, value)?;
            return Ok(Requirement {
                key: key.to_string(),
                operator,
                values: vec![value.to_string()],
            });
        }
    }
    check_label_key(t)?;
    Ok(Requirement {
        key: t.to_string(),
        operator: Operator::Exists,
        values: Vec::new(),
    })
}

impl Selector {
    /// Parses `text`. An empty selector is refused: it would select every Pod.
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        if text.trim().is_empty() {
            return Err(SelectorError(
                "must not be empty: an empty selector matches every Deployment".into(),
            ));
        }
        let parts = terms(text)?;
        let mut requirements = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            requirements.push(requirement(part).map_err(|rule| {
                SelectorError(format!("term {} ({:?}): {rule}", i + 1, part.trim()))
            })?);
        }
        Ok(Selector {
            requirements,
            text: text.trim().to_string(),
        })
    }

    /// Whether `labels` satisfy every requirement; `Err` names the first label that differs.
    pub fn check(&self, labels: &BTreeMap<String, String>) -> Result<(), LabelMismatch> {
        for r in &self.requirements {
            let have = labels.get(&r.key);
            let shown = have.map_or_else(
                || format!("has no label {}", r.key),
                |v| format!("has {}={v}", r.key),
            );
            let ok = match r.operator {
                Operator::Equals => have == Some(&r.values[0]),
                Operator::NotEquals => have != Some(&r.values[0]),
                Operator::In => have.is_some_and(|v| r.values.contains(v)),
                Operator::NotIn => have.is_none_or(|v| !r.values.contains(v)),
                Operator::Exists => have.is_some(),
                Operator::DoesNotExist => have.is_none(),
            };
            if !ok {
                return Err(LabelMismatch(format!(
                    "the selector wants {r}, the Pod template {shown}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn parses_every_kind_of_term() {
        let s = Selector::parse(
            "app=web, tier==frontend,track!=canary,env in (prod, staging),zone notin (x),release,!legacy,example.com/team=payments",
        )
        .unwrap();
        let shown: Vec<String> = s.requirements.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "app=web",
                "tier=frontend",
                "track!=canary",
                "env in (prod,staging)",
                "zone notin (x)",
                "release",
                "!legacy",
                "example.com/team=payments"
            ]
        );
    }

    #[test]
    fn bad_selectors_name_the_term_and_the_rule() {
        for (text, want) in [
            ("", "must not be empty"),
            ("   ", "must not be empty"),
            ("app=web,", "term 2 (\"\"): is empty"),
            ("env in prod", "needs a parenthesised list"),
            ("env in ()", "at least one value"),
            ("env in (a", "'(' without its ')'"),
            ("app=web)", "')' without its '('"),
            ("App Name=web", "key \"App Name\""),
            ("app=-web", "value \"-web\" of app"),
            ("Bad_Prefix!/x=1", "prefix"),
            (&"k".repeat(64), "1-63 characters"),
        ] {
            let e = Selector::parse(text).unwrap_err().0;
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn checks_labels_and_names_the_first_that_differs() {
        let s = Selector::parse("app=web,tier in (frontend,edge),!legacy").unwrap();
        assert!(
            s.check(&labels(&[("app", "web"), ("tier", "edge")]))
                .is_ok()
        );
        assert_eq!(
            s.check(&labels(&[("app", "api"), ("tier", "edge")]))
                .unwrap_err()
                .to_string(),
            "the selector wants app=web, the Pod template has app=api"
        );
        assert_eq!(
            s.check(&labels(&[("app", "web")])).unwrap_err().to_string(),
            "the selector wants tier in (frontend,edge), the Pod template has no label tier"
        );
        assert!(
            s.check(&labels(&[
                ("app", "web"),
                ("tier", "edge"),
                ("legacy", "1")
            ]))
            .unwrap_err()
            .to_string()
            .starts_with("the selector wants !legacy")
        );
        let s = Selector::parse("env notin (dev),track!=canary,release").unwrap();
        assert!(s.check(&labels(&[("release", "3")])).is_ok());
        assert!(
            s.check(&labels(&[("release", "3"), ("env", "dev")]))
                .is_err()
        );
        assert!(
            s.check(&labels(&[("release", "3"), ("track", "canary")]))
                .is_err()
        );
        assert!(s.check(&labels(&[])).is_err());
    }
}
