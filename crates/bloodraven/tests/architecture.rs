//! The crate table of `docs/architecture.md` is a rule, not a description: every crate's
//! `[dependencies]` may name only the Bloodraven crates its row allows, and neither it nor the
//! Bloodraven crates it uses may pull in what its row forbids (so the light lease client stays
//! free of kube, and nothing shipped depends on the test kit).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("the workspace root")
        .to_path_buf()
}

/// One row of the table: the crates it may use, the dependencies it must not pull in.
struct Rule {
    may_use: BTreeSet<String>,
    must_not: BTreeSet<String>,
}

fn cell_list(cell: &str) -> BTreeSet<String> {
    cell.split(',')
        .map(|s| s.trim().trim_matches('`').to_string())
        .filter(|s| !s.is_empty() && s != "—")
        .collect()
}

fn rules(doc: &str) -> BTreeMap<String, Rule> {
    let section = doc
        .split("## Crates")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a Crates section");
    let mut out = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `bloodraven")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_string();
        let may_use = cell_list(cells[2])
            .into_iter()
            .map(|short| format!("bloodraven-{short}"))
            .collect();
        out.insert(
            name,
            Rule {
                may_use,
                must_not: cell_list(cells[3]),
            },
        );
    }
    out
}

/// The names under `[dependencies]` of a manifest (not dev- or build-dependencies).
fn dependencies(manifest: &str) -> BTreeSet<String> {
    let mut in_deps = false;
    let mut out = BTreeSet::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps && let Some((name, _)) = line.split_once(['=', '.']) {
            let name = name.trim();
            if !name.is_empty() && !name.starts_with('#') {
                out.insert(name.to_string());
            }
        }
    }
    out
}

#[test]
fn every_crate_uses_only_what_its_row_allows() {
    let root = workspace();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let rules = rules(&doc);
    let mut deps = BTreeMap::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        deps.insert(name, dependencies(&manifest));
    }
    assert_eq!(
        rules.keys().collect::<Vec<_>>(),
        deps.keys().collect::<Vec<_>>(),
        "every crate has a row, every row a crate"
    );
    let mut broken = Vec::new();
    for (name, direct) in &deps {
        let rule = &rules[name];
        for d in direct.iter().filter(|d| d.starts_with("bloodraven")) {
            if !rule.may_use.contains(d) {
                broken.push(format!("{name} uses {d}, which its row does not allow"));
            }
        }
        // What it pulls in: its own dependencies and those of the Bloodraven crates it uses.
        let mut pulled = BTreeSet::new();
        let mut todo = vec![name.clone()];
        while let Some(c) = todo.pop() {
            for d in deps.get(&c).into_iter().flatten() {
                if pulled.insert(d.clone()) && d.starts_with("bloodraven") {
                    todo.push(d.clone());
                }
            }
        }
        for bad in rule.must_not.intersection(&pulled) {
            broken.push(format!("{name} pulls in {bad}, which its row forbids"));
        }
        if name != "bloodraven-testkit" && pulled.contains("bloodraven-testkit") {
            broken.push(format!("{name} depends on the test kit"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_rule_reader_sees_a_violation() {
    let doc = "## Crates\n\n| crate | may use | must not pull in | holds |\n|---|---|---|---|\n| `bloodraven-deploy` | core | kube | x |\n";
    let r = rules(doc);
    assert!(r["bloodraven-deploy"].may_use.contains("bloodraven-core"));
    assert!(r["bloodraven-deploy"].must_not.contains("kube"));
    let d = dependencies(
        "[package]\nname = \"x\"\n[dependencies]\nkube.workspace = true\nbloodraven-core = { path = \"../c\" }\n[dev-dependencies]\nproptest = \"1\"\n",
    );
    assert_eq!(
        d,
        BTreeSet::from(["kube".to_string(), "bloodraven-core".to_string()])
    );
}
