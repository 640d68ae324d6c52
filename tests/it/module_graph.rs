//! The crate's top-level module graph has no cycle, only the front end depends on `cli`, no
//! module has a cycle among its own files, and the spend core, its two users and storage stay
//! apart ([`APART`]).
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
//! - No cycle inside a module either. Each folder module `m` (`src/m/`, at any depth) has a graph
//!   of its own: a node is one of its children (a file `m/x.rs`, or a folder `m/x/` with all the
//!   files under it), and a `crate::m::x`, `super::x` or `self::x` path in a child's code that
//!   resolves into `m` is an edge to child `x`. A path to an item that `m/mod.rs` re-exports
//!   (`pub use x::Item;`) is an edge to the child that holds it. `m/mod.rs` itself is no node: it
//!   is the module's face (its docs, its re-exports and the entry points built on its children),
//!   so a child naming an item the face defines makes no edge. A failure names the module, the
//!   cycle and the `file:line` of each edge.

use crate::common::rust_source::{Piece, code_only, rust_files, scan};
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
fn no_module_has_a_cycle_among_its_files() {
    let graphs = inner_graphs(&source_files());
    assert!(
        graphs.len() > 10,
        "too few folder modules read: {:?}",
        graphs.keys()
    );
    let cycles: Vec<String> = graphs
        .iter()
        .filter_map(|(module, graph)| {
            let cycle = find_cycle(graph)?;
            Some(format!(
                "in `{}`: {}\n{}",
                module.join("::"),
                cycle.join(" -> "),
                explain(graph, &cycle)
            ))
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "cycles among a module's files (move what both sides use into a lower file):\n{}",
        cycles.join("")
    );
}

#[test]
fn inner_edges_come_from_crate_super_and_self_paths_and_re_exports() {
    let file = |path: &str, source: &str| SourceFile {
        module: path.split('/').map(String::from).collect(),
        label: format!("{path}.rs"),
        source: source.to_string(),
    };
    let files = [
        // The face: re-exports `Plan` from `b`, and defines `Shared` itself.
        file(
            "m",
            "mod a;\nmod b;\nmod c;\nmod d;\npub use b::{Plan, Other as Renamed};\npub struct Shared;",
        ),
        file(
            "m/a",
            "use super::Plan;\nuse super::Shared;\n// super::c in a comment\nfn f() { let _ = \"super::c\"; }\nmod tests {\n    use super::*;\n    use super::super::d::Thing;\n}",
        ),
        file(
            "m/b",
            "use crate::m::{c::{self, X}, Renamed};\nuse self::inner::Y;",
        ),
        file("m/c", "\n\nfn g() -> crate::m::d::Z { todo!() }"),
        // A folder child: its files' paths count for `m`, and make `m::d`'s own graph.
        file("m/d", "mod e;\nmod f;\npub use e::Z;"),
        file("m/d/e", "use super::f::W;\nuse super::super::Shared;"),
        file("m/d/f", "use super::super::c::G;\nuse crate::m::d::Z;"),
    ];
    let graphs = inner_graphs(&files);
    let edges = |module: &str| -> Vec<String> {
        graphs[&module.split("::").map(String::from).collect::<Vec<_>>()]
            .iter()
            .flat_map(|(from, to)| {
                to.iter()
                    .map(move |(to, at)| format!("{from} -> {to} ({})", join(at)))
            })
            .collect()
    };
    assert_eq!(
        edges("m"),
        [
            "a -> b (m/a.rs:1)",
            "a -> d (m/a.rs:7)",
            "b -> c (m/b.rs:1)",
            "c -> d (m/c.rs:3)",
            "d -> c (m/d/f.rs:1)",
        ]
    );
    assert_eq!(
        edges("m::d"),
        ["e -> f (m/d/e.rs:1)", "f -> e (m/d/f.rs:2)"]
    );
    assert_eq!(
        find_cycle(&graphs[&vec!["m".to_string()]])
            .unwrap()
            .join(" -> "),
        "c -> d -> c"
    );
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

/// Rooms that must not reach into each other: the spend core knows neither of its users nor what
/// the router spends on (the image backend and provider), its two users stand side by side, and
/// storage serves everyone above it without knowing them.
const APART: &[(&str, &[&str])] = &[
    ("spend", &["router", "gateway", "backend", "provider"]),
    ("router", &["gateway"]),
    ("gateway", &["router"]),
    (
        "storage",
        &["spend", "router", "gateway", "backend", "provider"],
    ),
];

#[test]
fn the_spend_core_its_users_and_storage_stay_apart() {
    let graph = crate_graph();
    let mut wrong = Vec::new();
    for (from, forbidden) in APART {
        assert!(graph.contains_key(*from), "no module `{from}` read");
        for to in *forbidden {
            if let Some(files) = graph.get(*from).and_then(|edges| edges.get(*to)) {
                wrong.push(format!("{from} -> {to} (in {})", join(files)));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "these rooms must stay apart (move the shared piece below both):\n{}",
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

/// A source file of `src/`: its module path (`conform/target/mod.rs` is `[conform, target]`), its
/// name for messages, and its text.
struct SourceFile {
    module: Vec<String>,
    label: String,
    source: String,
}

/// Every `.rs` file under `src/` but `lib.rs` and `main.rs` (the crate root has the graph above).
fn source_files() -> Vec<SourceFile> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    rust_files(&src)
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(&src).expect("under src");
            let mut module: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|s| s == "mod") {
                module.pop();
            }
            SourceFile {
                module,
                label: rel.display().to_string(),
                source: std::fs::read_to_string(&file).expect("readable source"),
            }
        })
        .filter(|f| !(f.module.len() == 1 && ["lib", "main"].contains(&f.module[0].as_str())))
        .collect()
}

/// The graph of each folder module's children (see the module doc), keyed by the module's path.
fn inner_graphs(files: &[SourceFile]) -> BTreeMap<Vec<String>, Graph> {
    let mut children: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        for depth in 1..f.module.len() {
            children
                .entry(f.module[..depth].to_vec())
                .or_default()
                .insert(f.module[depth].clone());
        }
    }
    // What each folder module's face re-exports: item name -> the child that holds it.
    let mut re_exports: BTreeMap<Vec<String>, BTreeMap<String, String>> = BTreeMap::new();
    for f in files.iter().filter(|f| children.contains_key(&f.module)) {
        let names = re_exports.entry(f.module.clone()).or_default();
        for (path, alias, _) in re_exported_paths(&f.module, &f.source) {
            let depth = f.module.len();
            if path.len() > depth + 1
                && path[..depth] == f.module[..]
                && children[&f.module].contains(&path[depth])
            {
                let name = alias.unwrap_or_else(|| path.last().unwrap().clone());
                names.insert(name, path[depth].clone());
            }
        }
    }
    let mut graphs: BTreeMap<Vec<String>, Graph> = children
        .iter()
        .map(|(module, kids)| {
            let graph = kids.iter().map(|k| (k.clone(), BTreeMap::new())).collect();
            (module.clone(), graph)
        })
        .collect();
    for f in files {
        for (path, _, line) in paths_named(&f.module, &f.source) {
            for depth in 1..f.module.len() {
                let module = &f.module[..depth];
                if path.len() <= depth || path[..depth] != module[..] {
                    continue;
                }
                let from = &f.module[depth];
                let to = if children[module].contains(&path[depth]) {
                    Some(&path[depth])
                } else {
                    re_exports.get(module).and_then(|r| r.get(&path[depth]))
                };
                if let Some(to) = to.filter(|to| *to != from) {
                    graphs
                        .get_mut(module)
                        .unwrap()
                        .get_mut(from)
                        .unwrap()
                        .entry(to.clone())
                        .or_default()
                        .insert(format!("{}:{line}", f.label));
                }
            }
        }
    }
    graphs
}

/// A path as the crate root sees it, the name a `use ... as` gives it, and its line.
type NamedPath = (Vec<String>, Option<String>, usize);

/// Every `crate::`, `super::` and `self::` path in the code of the file of module path `module`,
/// resolved to a path from the crate root (inline `mod x { ... }` blocks counted), a `{...}`
/// group giving one path per item.
fn paths_named(module: &[String], source: &str) -> Vec<NamedPath> {
    let tokens = line_tokens(source);
    let mut path: Vec<String> = module.to_vec();
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut pending_mod = false;
    let mut found = Vec::new();
    let is = |i: usize, s: &str| tokens.get(i).is_some_and(|t| t.0 == s);
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i].0.as_str() {
            "mod" if is(i + 2, "{") => {
                pending_mod = true;
                path.push(tokens[i + 1].0.clone());
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
            t @ ("crate" | "super" | "self") if is(i + 1, "::") && !(i > 0 && is(i - 1, "::")) => {
                let mut base = match t {
                    "crate" => Vec::new(),
                    "self" => path.clone(),
                    _ => path[..path.len().saturating_sub(1)].to_vec(),
                };
                let mut j = i + 2;
                while t == "super" && is(j, "super") && is(j + 1, "::") {
                    base.pop();
                    j += 2;
                }
                let (paths, next) = use_tree(&tokens, j, base);
                found.extend(paths);
                i = next.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The paths of the `pub use` (or `pub(...) use`) items of a module's face, bare paths read as
/// its own children's.
fn re_exported_paths(module: &[String], source: &str) -> Vec<NamedPath> {
    let tokens = line_tokens(source);
    let mut found = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let public = i > 0 && (tokens[i - 1].0 == "pub" || tokens[i - 1].0 == ")");
        if t.0 != "use" || !public {
            continue;
        }
        let at = i + 1;
        let (base, at) = match tokens.get(at).map(|t| t.0.as_str()) {
            Some("crate") => (Vec::new(), at + 2),
            Some("self") => (module.to_vec(), at + 2),
            Some("super") => (module[..module.len() - 1].to_vec(), at + 2),
            _ => (module.to_vec(), at),
        };
        found.extend(use_tree(&tokens, at, base).0);
    }
    found
}

/// The paths of the use tree (or code path) at `tokens[at]` under `prefix`, and the index after
/// it.
fn use_tree(tokens: &[(String, usize)], at: usize, prefix: Vec<String>) -> (Vec<NamedPath>, usize) {
    let Some((t, line)) = tokens.get(at) else {
        return (Vec::new(), at);
    };
    let ident = |s: &str| s.chars().all(|c| c.is_alphanumeric() || c == '_');
    match t.as_str() {
        "{" => {
            let mut paths = Vec::new();
            let mut i = at + 1;
            while i < tokens.len() && tokens[i].0 != "}" {
                if tokens[i].0 == "," {
                    i += 1;
                    continue;
                }
                let (more, next) = use_tree(tokens, i, prefix.clone());
                paths.extend(more);
                i = next.max(i + 1);
            }
            (paths, i + 1)
        }
        "self" => (vec![(prefix, None, *line)], at + 1),
        "*" => {
            let mut path = prefix;
            path.push("*".into());
            (vec![(path, None, *line)], at + 1)
        }
        word if ident(word) => {
            let mut path = prefix;
            path.push(word.to_string());
            match tokens.get(at + 1).map(|t| t.0.as_str()) {
                Some("::") if tokens.get(at + 2).is_some_and(|t| t.0 != "<") => {
                    use_tree(tokens, at + 2, path)
                }
                Some("as") => {
                    let alias = tokens.get(at + 2).map(|t| t.0.clone());
                    (vec![(path, alias, *line)], at + 3)
                }
                _ => (vec![(path, None, *line)], at + 1),
            }
        }
        _ => (vec![(prefix, None, *line)], at),
    }
}

/// [`tokens`] of the code of `source`, each with its line (comments and literals left out).
fn line_tokens(source: &str) -> Vec<(String, usize)> {
    let mut code = String::with_capacity(source.len());
    for piece in scan(source) {
        match piece {
            Piece::Code(c) => code.push(c),
            Piece::Comment { .. } => code.push(' '),
            Piece::Char => code.push_str("' '"),
            Piece::Str(literal) => {
                code.push_str("\"\"");
                code.extend(literal.body.chars().filter(|c| *c == '\n'));
            }
        }
    }
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        out.extend(tokens(line).into_iter().map(|t| (t, n + 1)));
    }
    out
}
