//! The crate's top-level module graph has no cycle, and only the front end depends on `cli`.
//!
//! A module is the first path segment under `src/` (`src/conform/report/mod.rs` belongs to
//! `conform`). Its dependencies are read from the source text: every `crate::X` path (in `use`
//! lines and in code, grouped `crate::{X, Y::z}` included), every `super::` path that climbs to
//! the crate root, and `callid::X` in `src/main.rs`, the binary. Comments (doc links too), string
//! and character literals are left out, so only code counts; `#[cfg(test)]` code counts like any
//! other, because a test module that reaches into a higher layer is a cycle for whoever reads it.
//!
//! The rules:
//! - No cycle: a lower module never imports a higher one, so each can be read, changed and
//!   tested knowing only what is below it. A failure names the cycle (`matrix -> measure ->
//!   matrix`) and the files that make each edge.
//! - The front end is `main` (the binary), `app` (runs a command, maps errors to exit codes) and
//!   `cli` (the clap types). Only `main` and `app` may depend on `cli`, and no module depends on
//!   `app` or `main`: library modules never import clap (the `--format` value enums convert into
//!   each module's own `Format` inside `cli`).

use crate::common::rust_source::{code_only, rust_files};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Who may depend on a front-end module.
const FRONT_END: &[(&str, &[&str])] =
    &[("cli", &["app", "main"]), ("app", &["main"]), ("main", &[])];

/// Edges `from -> to` with the files (relative to `src/`) that make each one.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

#[test]
fn the_module_graph_has_no_cycle() {
    let graph = crate_graph();
    assert!(graph.len() > 10, "too few modules read: {:?}", graph.keys());
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "module cycle: {}\n{}",
            cycle.join(" -> "),
            explain(&graph, &cycle)
        );
    }
}

#[test]
fn only_the_front_end_depends_on_cli_and_app() {
    let graph = crate_graph();
    let mut wrong = Vec::new();
    for (from, edges) in &graph {
        for (to, files) in edges {
            if let Some((_, allowed)) = FRONT_END.iter().find(|(m, _)| m == to)
                && !allowed.contains(&from.as_str())
            {
                wrong.push(format!("{from} -> {to} (in {})", join(files)));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "library modules must not depend on the front end (convert clap types in `cli`):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_cycle_finder_finds_a_cycle_and_only_a_cycle() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry(a.to_string())
                .or_default()
                .entry(b.to_string())
                .or_default()
                .insert(format!("{a}.rs"));
            g.entry(b.to_string()).or_default();
        }
        g
    };
    let cyclic = graph(&[
        ("app", "matrix"),
        ("matrix", "measure"),
        ("measure", "matrix"),
    ]);
    let cycle = find_cycle(&cyclic).expect("a cycle");
    assert_eq!(cycle.join(" -> "), "matrix -> measure -> matrix");
    assert_eq!(
        explain(&cyclic, &cycle),
        "  matrix -> measure: matrix.rs\n  measure -> matrix: measure.rs\n"
    );
    let long = graph(&[("a", "b"), ("b", "c"), ("c", "d"), ("d", "b")]);
    assert_eq!(find_cycle(&long).unwrap().join(" -> "), "b -> c -> d -> b");
    // A diamond shares a node but has no cycle.
    let diamond = graph(&[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]);
    assert_eq!(find_cycle(&diamond), None);
}

#[test]
fn dependencies_come_from_code_not_from_comments_or_strings() {
    let src = r####"
//! Links to [`crate::doc_only`] do not count.
use crate::identity::{self, Identity};
use crate::{canonical, shape::Shape as S};
use super::sibling; // inside src/probe/x.rs: `super` is `probe`
/* crate::block_comment /* nested crate::nested */ */
fn f() -> &'static str {
    let _ = crate::keys::PublicHandle::new;
    let _ = 'c';
    let _ = '\'';
    let _ = "crate::in_a_string";
    let _ = r#"crate::in_a_raw_string"#;
    "done"
}
#[cfg(test)]
mod tests {
    use super::*;
    use super::super::super::router::Router;
}
"####;
    let known: BTreeSet<String> = [
        "identity",
        "canonical",
        "shape",
        "keys",
        "router",
        "doc_only",
        "block_comment",
        "nested",
        "in_a_string",
        "in_a_raw_string",
        "sibling",
        "probe",
    ]
    .map(String::from)
    .into();
    let deps = dependencies(&["probe".into(), "x".into()], src, &known);
    assert_eq!(
        deps.into_iter().collect::<Vec<_>>(),
        ["canonical", "identity", "keys", "router", "shape"]
    );
    // In a top-level file, `super::X` is the crate root's `X`.
    let deps = dependencies(&["matrix".into()], "use super::measure::Run;", &known);
    assert!(
        deps.is_empty(),
        "`measure` is not a known module here: {deps:?}"
    );
    let known: BTreeSet<String> = ["measure".to_string()].into();
    let deps = dependencies(&["matrix".into()], "use super::{measure};", &known);
    assert_eq!(deps.into_iter().collect::<Vec<_>>(), ["measure"]);
    // The binary names the library by its crate name.
    let deps = dependencies(
        &["main".into()],
        "callid::app::run(cli)",
        &["app".into()].into(),
    );
    assert_eq!(deps.into_iter().collect::<Vec<_>>(), ["app"]);
}

fn join(files: &BTreeSet<String>) -> String {
    files.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// One line per edge of `cycle`, naming the files that make it.
fn explain(graph: &Graph, cycle: &[String]) -> String {
    cycle
        .windows(2)
        .map(|w| format!("  {} -> {}: {}\n", w[0], w[1], join(&graph[&w[0]][&w[1]])))
        .collect()
}

/// The first cycle found (depth-first, modules in name order), as `[a, b, ..., a]`.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        graph: &Graph,
        node: &str,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path
                    .iter()
                    .position(|n| n == node)
                    .expect("open nodes are on the path");
                let mut cycle = path[start..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|edges| edges.keys()) {
            if let Some(cycle) = visit(graph, next, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|node| visit(graph, node, &mut marks, &mut Vec::new()))
}

/// The graph of `src/`: every `.rs` file's dependencies on other top-level modules.
fn crate_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_files(&src);
    let path_of = |file: &Path| -> Vec<String> {
        let rel = file.strip_prefix(&src).expect("under src");
        let mut segments: Vec<String> = rel
            .with_extension("")
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        if segments.last().is_some_and(|s| s == "mod") {
            segments.pop();
        }
        segments
    };
    let known: BTreeSet<String> = files
        .iter()
        .map(|f| path_of(f))
        .filter(|p| p[0] != "lib")
        .map(|p| p[0].clone())
        .collect();
    let mut graph = Graph::new();
    for file in &files {
        let module = path_of(file);
        if module[0] == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("readable source");
        let rel = file.strip_prefix(&src).unwrap().display().to_string();
        let edges = graph.entry(module[0].clone()).or_default();
        for dep in dependencies(&module, &text, &known) {
            edges.entry(dep).or_default().insert(rel.clone());
        }
    }
    graph
}

/// The top-level modules (of `known`, other than its own) that the file of module path `module`
/// refers to.
fn dependencies(module: &[String], source: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let tokens = tokens(&code_only(source));
    let own = &module[0];
    let mut path: Vec<String> = module.to_vec();
    // (brace depth at which an inline module opened, so its `}` closes it)
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut pending_mod = false;
    let mut found = BTreeSet::new();
    let is = |i: usize, s: &str| tokens.get(i).is_some_and(|t| t == s);
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        match t {
            "mod" if is(i + 2, "{") => {
                pending_mod = true;
                path.push(tokens[i + 1].clone());
            }
            "{" => {
                depth += 1;
                if pending_mod {
                    inline.push(depth);
                    pending_mod = false;
                }
            }
            "}" => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                    path.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "crate" | "super" | "callid" if is(i + 1, "::") && !(i > 0 && is(i - 1, "::")) => {
                let at_root = match t {
                    "crate" => own != "main",
                    "callid" => own == "main",
                    _ => {
                        let mut base = path.len() - 1;
                        let mut j = i + 2;
                        while is(j, "super") && is(j + 1, "::") {
                            base = base.saturating_sub(1);
                            j += 2;
                        }
                        i = j - 2;
                        base == 0
                    }
                };
                if at_root {
                    for name in first_segments(&tokens, i + 2) {
                        if name != *own && known.contains(&name) {
                            found.insert(name);
                        }
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The first segment of the path at `tokens[at]`, or of each item of a `{...}` group there.
fn first_segments(tokens: &[String], at: usize) -> Vec<String> {
    if tokens.get(at).map(String::as_str) != Some("{") {
        return tokens.get(at).cloned().into_iter().collect();
    }
    let mut names = Vec::new();
    let mut depth = 0;
    let mut item_start = true;
    for t in &tokens[at..] {
        match t.as_str() {
            "{" => {
                depth += 1;
                item_start = depth == 1;
            }
            "}" => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            "," if depth == 1 => item_start = true,
            word if item_start && depth == 1 => {
                names.push(word.to_string());
                item_start = false;
            }
            _ => {}
        }
    }
    names
}

/// Identifiers, `::`, and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_string());
            i += 2;
            continue;
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
        i += 1;
    }
    out
}
