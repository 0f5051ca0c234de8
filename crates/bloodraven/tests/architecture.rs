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

/// The modules of a crate (`src/<module>.rs` or `src/<module>/…`) and which of its other
/// modules each one's code names (`crate::<module>`). Doc comments are not code (a page may
/// point at a higher layer), nor are tests.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.to_path_buf()];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                files.push(e.path());
            }
            continue;
        }
        let rel = p.strip_prefix(src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        let name = p.file_name().unwrap().to_string_lossy();
        if p.extension().is_none_or(|x| x != "rs")
            || top == "lib"
            || top == "main"
            || name == "tests.rs"
        {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        // Everything from an inline test module on is a test.
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let deps = graph.entry(top.clone()).or_default();
        for line in code.lines() {
            let l = line.trim_start();
            if l.starts_with("//") {
                continue;
            }
            for piece in l.split("crate::").skip(1) {
                let m: String = piece
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if !m.is_empty() && m != top {
                    deps.insert(m);
                }
            }
        }
    }
    graph
}

/// The files of a crate as modules (`a::b` for `src/a/b.rs` or `src/a/b/mod.rs`), and which of
/// its other files each one's code names: `crate::a::b::…` and `super::…` paths, each taken to
/// the longest module that exists. `tests.rs` files, inline test modules and comments are not
/// code here; `lib.rs` and `main.rs` (the crate's root) are left out.
fn file_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    fn module_of(src: &Path, p: &Path) -> Vec<String> {
        let rel = p.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().to_string())
            .collect();
        if parts.last().is_some_and(|l| l == "mod") {
            parts.pop();
        }
        if parts == ["lib"] || parts == ["main"] {
            parts.clear();
        }
        parts
    }
    let mut files = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                stack.push(e.path());
            }
        } else if p.extension().is_some_and(|x| x == "rs")
            && p.file_name().is_some_and(|n| n != "tests.rs")
        {
            files.push(p);
        }
    }
    let modules: BTreeSet<Vec<String>> = files.iter().map(|p| module_of(src, p)).collect();
    let resolve = |parts: &[String]| -> Option<Vec<String>> {
        (1..=parts.len())
            .rev()
            .map(|n| parts[..n].to_vec())
            .find(|m| modules.contains(m))
    };
    let ident = |t: &str| -> Vec<String> {
        t.split("::")
            .map(|seg| {
                seg.chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|seg| !seg.is_empty())
            .collect()
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in &files {
        let m = module_of(src, p);
        if m.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(p).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let deps = graph.entry(m.join("::")).or_default();
        for line in code.lines() {
            let l = line.trim_start();
            if l.starts_with("//") {
                continue;
            }
            for piece in l.split("crate::").skip(1) {
                if let Some(t) = resolve(&ident(piece)).filter(|t| *t != m && !t.is_empty()) {
                    deps.insert(t.join("::"));
                }
            }
            for (i, _) in l.match_indices("super::") {
                // Only the first `super::` of a run: `super::super::x` climbs twice.
                if l[..i].ends_with("super::") {
                    continue;
                }
                let mut rest = &l[i..];
                let mut ups = 0;
                while let Some(r) = rest.strip_prefix("super::") {
                    ups += 1;
                    rest = r;
                }
                if ups > m.len() {
                    continue;
                }
                let mut parts = m[..m.len() - ups].to_vec();
                parts.extend(ident(rest));
                if let Some(t) = resolve(&parts).filter(|t| *t != m && !t.is_empty()) {
                    deps.insert(t.join("::"));
                }
            }
        }
    }
    graph
}

/// A circle among `graph`'s modules, if there is one (as the path that closes it).
fn a_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, bool>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), false);
        path.push(m.to_string());
        for d in graph.get(m).into_iter().flatten() {
            if !graph.contains_key(d) {
                continue;
            }
            match state.get(d) {
                Some(false) => {
                    let start = path.iter().position(|p| p == d).unwrap();
                    let mut c = path[start..].to_vec();
                    c.push(d.clone());
                    return Some(c);
                }
                Some(true) => {}
                None => {
                    if let Some(c) = visit(d, graph, state, path) {
                        return Some(c);
                    }
                }
            }
        }
        path.pop();
        state.insert(m.to_string(), true);
        None
    }
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        if !state.contains_key(m)
            && let Some(c) = visit(m, graph, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

/// No crate's files import each other in a circle (`crate::…` and `super::…` paths between
/// files, tests left out). The core's modules are layered besides: vocabulary (names,
/// reasons, time, config), the persisted shapes (`status`), the views of the gathered world
/// (`view`), then decisions that depend on those and never on each other in a circle.
#[test]
fn no_crate_imports_its_files_in_a_circle() {
    let crates: Vec<PathBuf> = std::fs::read_dir(workspace().join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    assert!(crates.len() >= 12, "read the crates: {crates:?}");
    for src in crates {
        let graph = file_graph(&src);
        if let Some(c) = a_circle(&graph) {
            panic!(
                "{}: files import each other in a circle: {}",
                src.display(),
                c.join(" → ")
            );
        }
    }
    // A circle is seen (the reader would otherwise pass anything).
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.rs"), "use crate::b::X;\n").unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    std::fs::write(dir.path().join("b/mod.rs"), "mod c;\n").unwrap();
    std::fs::write(dir.path().join("b/c.rs"), "use super::super::a::Y;\n").unwrap();
    assert!(
        a_circle(&file_graph(dir.path())).is_none(),
        "b → b::c only through `mod`, which is not an import"
    );
    std::fs::write(dir.path().join("b/mod.rs"), "mod c;\nuse crate::b::c::Z;\n").unwrap();
    let c = a_circle(&file_graph(dir.path())).expect("a → b → b::c → a");
    assert!(c.contains(&"b::c".to_string()), "{c:?}");
    // The layers, named.
    let core = module_graph(&workspace().join("crates/bloodraven-core/src"));
    for shape in ["status", "view", "reason", "config"] {
        for decision in ["controller", "planned", "health", "lease"] {
            assert!(
                !core[shape].contains(decision),
                "{shape} (a shape) depends on {decision} (a decision)"
            );
        }
    }
}

#[test]
fn the_circle_finder_finds_one() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a", "d"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
    .collect();
    assert_eq!(a_circle(&g).unwrap(), ["a", "b", "c", "a"]);
    let mut acyclic = g.clone();
    acyclic.get_mut("c").unwrap().remove("a");
    assert_eq!(a_circle(&acyclic), None);
}

/// Inside the operator crate only the Kubernetes platform (`src/platform/kubernetes/`) uses the
/// Kubernetes client: everything else asks the platform for a part.
#[test]
fn only_the_kubernetes_platform_uses_the_kubernetes_client() {
    let src = workspace().join("crates/bloodraven-operator/src");
    let confined = src.join("platform/kubernetes");
    let mut files = vec![src.clone()];
    let mut offenders = Vec::new();
    let mut read = 0;
    while let Some(p) = files.pop() {
        if p.is_dir() {
            if p != confined {
                for e in std::fs::read_dir(&p).unwrap().flatten() {
                    files.push(e.path());
                }
            }
            continue;
        }
        if p.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        read += 1;
        let text = std::fs::read_to_string(&p).unwrap();
        for (n, line) in text.lines().enumerate() {
            let l = line.trim_start();
            if l.starts_with("//") {
                continue;
            }
            if ["kube::", "k8s_openapi", "bloodraven_kube", "use kube"]
                .iter()
                .any(|needle| l.contains(needle))
            {
                offenders.push(format!("{}:{}: {l}", p.display(), n + 1));
            }
        }
    }
    assert!(read > 20, "read the operator's sources ({read} files)");
    assert!(
        offenders.is_empty(),
        "the Kubernetes client used outside src/platform/kubernetes: {offenders:#?}"
    );
}

/// Every file and folder `docs/architecture.md` names (`crates/…` in backticks) exists: the
/// concept → file table is kept true when code moves.
#[test]
fn every_path_the_architecture_page_names_exists() {
    let root = workspace();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut named = 0;
    let mut missing = Vec::new();
    for piece in doc.split('`').skip(1).step_by(2) {
        if !piece.starts_with("crates/") || piece.contains(' ') {
            continue;
        }
        named += 1;
        // `crates/x/src/*_cmd.rs` names a family of files: its folder must exist.
        let path = if piece.contains('*') {
            piece.rsplit_once('/').map_or(piece, |(dir, _)| dir)
        } else {
            piece
        };
        if !root.join(path).exists() {
            missing.push(piece.to_string());
        }
    }
    assert!(named > 50, "read the page's paths: {named}");
    assert!(
        missing.is_empty(),
        "docs/architecture.md names paths that do not exist: {missing:?}"
    );
}

/// The operator's poll writes the store and records events only through its writer
/// (`controller/writer.rs`): every other file of the controller asks it.
#[test]
fn the_poll_writes_only_through_its_writer() {
    let dir = workspace().join("crates/bloodraven-operator/src/controller");
    // The group runtime's writes and the event recorder, as a call reads with its spaces
    // and line breaks taken out (`self\n    .rt\n    .update(` is `self.rt.update(`).
    let writes = [
        "rt.update(",
        "rt.update_status(",
        "rt.change_active_site(",
        "rt.annotate(",
        "events::record(",
        ".store()",
    ];
    let squeeze = |text: &str| -> String {
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        code.lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
            .collect()
    };
    let mut offenders = Vec::new();
    let mut read = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let p = e.path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.extension().is_none_or(|x| x != "rs") || name == "tests.rs" {
            continue;
        }
        read += 1;
        let code = squeeze(&std::fs::read_to_string(&p).unwrap());
        for w in writes {
            let n = code.matches(w).count();
            if name == "writer.rs" {
                assert!(n <= 1, "writer.rs: {w} more than once");
            } else if n > 0 {
                offenders.push(format!("{name}: {w} ({n}×)"));
            }
        }
    }
    assert!(read >= 9, "read the controller's files ({read})");
    assert!(
        offenders.is_empty(),
        "store writes or events outside the writer: {offenders:#?}"
    );
    // The reader sees a write spread over lines.
    assert!(squeeze("self\n    .rt\n    .update_status(|s| {})").contains("rt.update_status("));
}

/// Every product source file (`crates/*/src`, the test kit and `tests.rs` files left out):
/// its path under `crates/` and its text up to its `#[cfg(test)]` module.
fn product_sources() -> Vec<(String, String)> {
    let crates = workspace().join("crates");
    let mut out = Vec::new();
    for krate in std::fs::read_dir(&crates).unwrap().flatten() {
        if krate.file_name() == "bloodraven-testkit" {
            continue;
        }
        let mut stack = vec![krate.path().join("src")];
        while let Some(p) = stack.pop() {
            if p.is_dir() {
                for e in std::fs::read_dir(&p).unwrap().flatten() {
                    stack.push(e.path());
                }
            } else if p.extension().is_some_and(|x| x == "rs")
                && p.file_name().is_some_and(|f| f != "tests.rs")
            {
                let text = std::fs::read_to_string(&p).unwrap();
                let product = match text.find("\n#[cfg(test)]") {
                    Some(at) => text[..at].to_string(),
                    None => text,
                };
                out.push((
                    p.strip_prefix(&crates).unwrap().display().to_string(),
                    product,
                ));
            }
        }
    }
    out
}

/// Whether `line` names a `Result<T, String>`: the error type, the last argument at the
/// `Result`'s own level, is `String`.
fn string_error(line: &str) -> bool {
    line.match_indices("Result<").any(|(at, _)| {
        let inner = &line[at + "Result<".len()..];
        let (mut depth, mut last_comma) = (0i32, None);
        for (i, c) in inner.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' if depth == 0 => {
                    return last_comma.is_some_and(|k: usize| inner[k + 1..i].trim() == "String");
                }
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => last_comma = Some(i),
                _ => {}
            }
        }
        false
    })
}

#[test]
fn the_string_error_finder_reads_the_results_own_arguments() {
    assert!(string_error("fn f() -> Result<(), String> {"));
    assert!(string_error("fn f() -> Result<Vec<(u8, String)>, String>"));
    assert!(!string_error(
        "fn check(l: &BTreeMap<String, String>) -> Result<(), LabelMismatch> {"
    ));
    assert!(!string_error("fn f() -> Result<(String, String), E>"));
    assert!(!string_error("type R = std::io::Result<String>;"));
}

/// Errors are typed at every boundary: no product code returns `Result<_, String>`.
#[test]
fn no_product_code_returns_a_string_error() {
    let found: Vec<String> = product_sources()
        .iter()
        .flat_map(|(path, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, l)| !l.trim_start().starts_with("//") && string_error(l))
                .map(move |(n, l)| format!("{path}:{}: {}", n + 1, l.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        found.is_empty(),
        "Result<_, String> in product code: {found:#?}"
    );
}

/// A function of `text` longer than 100 lines: its name, first line (1-based), length and
/// doc comment. Lines from a `#[cfg(test)]` at the start of a line on are left out (the test
/// module), as are braces inside strings, characters and `//` comments.
#[derive(Debug)]
struct LongFn {
    name: String,
    line: usize,
    lines: usize,
    doc: String,
}

fn long_functions(text: &str) -> Vec<LongFn> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .iter()
        .position(|l| l.starts_with("#[cfg(test)]"))
        .unwrap_or(lines.len());
    // Braces counted outside strings, character literals and line comments.
    let braces = |l: &str| -> (i64, bool) {
        let (mut depth, mut seen) = (0, false);
        let (mut in_str, mut prev) = (false, ' ');
        let chars: Vec<char> = l.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if in_str {
                if c == '\\' {
                    i += 1;
                } else if c == '"' {
                    in_str = false;
                }
            } else if c == '/' && prev == '/' {
                break;
            } else if c == '"' {
                in_str = true;
            } else if c == '\'' && i + 2 < chars.len() && chars[i + 2] == '\'' {
                i += 2;
            } else if c == '\''
                && i + 3 < chars.len()
                && chars[i + 1] == '\\'
                && chars[i + 3] == '\''
            {
                i += 3;
            } else if c == '{' {
                depth += 1;
                seen = true;
            } else if c == '}' {
                depth -= 1;
            }
            prev = c;
            i += 1;
        }
        (depth, seen)
    };
    let fn_name = |l: &str| -> Option<String> {
        let t = l.trim_start();
        if t.starts_with("//") {
            return None;
        }
        let at = t.find("fn ")?;
        let before = &t[..at];
        let words_ok = before
            .split_whitespace()
            .all(|w| w.starts_with("pub") || matches!(w, "async" | "const" | "unsafe" | "extern"));
        if !words_ok {
            return None;
        }
        let name: String = t[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        (!name.is_empty()).then_some(name)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < end {
        let Some(name) = fn_name(lines[i]) else {
            i += 1;
            continue;
        };
        let (mut depth, mut started, mut j) = (0i64, false, i);
        while j < end {
            let (d, seen) = braces(lines[j]);
            depth += d;
            started |= seen;
            if started && depth <= 0 {
                break;
            }
            if !started && lines[j].trim_end().ends_with(';') {
                break;
            }
            j += 1;
        }
        if started && j - i + 1 > 100 {
            let mut doc = Vec::new();
            let mut k = i;
            while k > 0 {
                k -= 1;
                let t = lines[k].trim_start();
                if let Some(d) = t.strip_prefix("///") {
                    doc.push(d.trim().to_string());
                } else if !t.starts_with("#[") {
                    break;
                }
            }
            doc.reverse();
            out.push(LongFn {
                name,
                line: i + 1,
                lines: j - i + 1,
                doc: doc.join(" "),
            });
        }
        i = if started { j + 1 } else { i + 1 };
    }
    out
}

/// At most 8 product functions are over 100 lines, and each says why in its doc comment
/// ("Over 100 lines: …"). The test kit is not product code.
#[test]
fn no_product_function_is_over_100_lines_but_eight_that_say_why() {
    let mut long = Vec::new();
    for (path, text) in product_sources() {
        for f in long_functions(&text) {
            long.push((path.clone(), f));
        }
    }
    let named: Vec<String> = long
        .iter()
        .map(|(p, f)| format!("{p}:{} {} ({} lines)", f.line, f.name, f.lines))
        .collect();
    assert!(
        long.len() <= 8,
        "{} functions over 100 lines: {named:#?}",
        long.len()
    );
    for (p, f) in &long {
        assert!(
            f.doc.contains("Over 100 lines:"),
            "{p}:{} {} ({} lines) does not say why it is over 100 lines",
            f.line,
            f.name,
            f.lines
        );
    }
}

#[test]
fn the_length_counter_sees_a_long_function_and_skips_strings_and_tests() {
    let body = "    let s = \"}}}\"; // }\n".repeat(101);
    let text = format!(
        "/// Over 100 lines: a test.\npub async fn long_one() {{\n{body}}}\nfn short() {{\n    let c = '}}';\n}}\n#[cfg(test)]\nmod tests {{\n    fn also_long() {{\n{body}    }}\n}}\n"
    );
    let found = long_functions(&text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].name, "long_one");
    assert_eq!(found[0].lines, 103);
    assert_eq!(found[0].doc, "Over 100 lines: a test.");
}
