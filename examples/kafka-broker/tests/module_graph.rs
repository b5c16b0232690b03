//! The broker's modules use each other without a cycle: the server dispatches to the handlers, the
//! handlers use the shared state (`broker`, `store`, the coordinators' state) and what every handler
//! shares (`ctx`), never the other way round.
//!
//! The graph is read from the sources: module A uses module B when A's code (comments and string
//! literals left out) names a path `crate::B...` (also inside `use crate::{B, ...}`), or an item the
//! crate root re-exports from B. The nodes are the top-level modules of `src/` (a directory module
//! with everything under it); `super::` and `self::` stay within a top-level module.
//! `cargo test -p diskless-kafka-broker --test module_graph -- --nocapture` prints the graph.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.
#![allow(clippy::print_stdout)] // The graph, for --nocapture.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module name → the files that make it up.
type Modules = BTreeMap<String, Vec<PathBuf>>;
/// Module → the modules it uses.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level modules of `src` (`lib.rs` and `main.rs` are the crate roots, not modules).
fn modules(src: &Path) -> Modules {
    let mut out = Modules::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let mut files = Vec::new();
            rust_files(&path, &mut files);
            out.entry(name).or_default().extend(files);
        } else if let Some(stem) = name.strip_suffix(".rs")
            && stem != "lib"
            && stem != "main"
        {
            out.entry(stem.to_string()).or_default().push(path);
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` without comments, string literals and char literals (each literal left as `""` or `' '`),
/// so that only code remains.
fn code_only(text: &str) -> String {
    let s: Vec<char> = text.chars().collect();
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    let starts = |i: usize, p: &str| p.chars().enumerate().all(|(k, c)| at(i + k) == c);
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if starts(i, "//") {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if starts(i, "/*") {
            let mut depth = 0;
            while i < s.len() {
                if starts(i, "/*") {
                    depth += 1;
                    i += 2;
                } else if starts(i, "*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (i == 0 || !is_ident(s[i - 1]) || s[i - 1] == 'b') && {
            let mut j = i + 1;
            while at(j) == '#' {
                j += 1;
            }
            at(j) == '"'
        } {
            // A raw string: r"...", r#"..."#, br"...".
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            while j < s.len() && !(s[j] == '"' && (1..=hashes).all(|k| at(j + k) == '#')) {
                j += 1;
            }
            i = j + 1 + hashes;
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < s.len() && s[i] != '"' {
                i += if s[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && (at(i + 1) == '\\' || (at(i + 1) != '\'' && at(i + 2) == '\'')) {
            // A char literal ('a', '\n', '\'', '\u{1F600}'); anything else after a quote is a lifetime.
            let mut j = if at(i + 1) == '\\' { i + 3 } else { i + 2 };
            while j < s.len() && s[j] != '\'' {
                j += 1;
            }
            i = j + 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The first path segment of every item of a `use` group body (`a, b::c, d::{e, f}` → a, b, d).
fn group_heads(body: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item = String::new();
    for c in body.chars().chain([',']) {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                let head: String = item
                    .trim_start()
                    .chars()
                    .take_while(|&c| is_ident(c))
                    .collect();
                if !head.is_empty() {
                    heads.push(head);
                }
                item.clear();
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    heads
}

/// The names the code refers to right after `crate::` (`crate::a::f`, `use crate::{a, b::c}`).
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut from = 0;
    while let Some(pos) = text[from..].find("crate") {
        let start = from + pos;
        from = start + "crate".len();
        let before = text[..start].chars().next_back();
        if before.is_some_and(|c| is_ident(c) || c == '$') {
            continue;
        }
        let rest = text[from..].trim_start();
        let Some(rest) = rest.strip_prefix("::") else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(group.len(), |(i, _)| i);
            names.extend(group_heads(&group[..end]));
        } else {
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

/// What the crate root re-exports from a module (`pub use config::{Config, USAGE};`): item → module.
fn reexports(root: &str, modules: &Modules) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for statement in code_only(root).split(';') {
        let statement = statement.trim();
        let Some(path) = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("use "))
        else {
            continue;
        };
        let Some((module, rest)) = path.trim().split_once("::") else {
            continue;
        };
        if !modules.contains_key(module) {
            continue;
        }
        let rest = rest.trim();
        let items: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group.trim_end_matches('}').split(',').collect(),
            None => vec![rest],
        };
        for item in items {
            // `a::b::Item` or `Item as Alias`: the name the root exports.
            let item = item.rsplit("::").next().unwrap_or(item).trim();
            let name = item.rsplit(" as ").next().unwrap_or(item).trim();
            if !name.is_empty() {
                out.insert(name.to_string(), module.to_string());
            }
        }
    }
    out
}

fn graph(src: &Path) -> Graph {
    let modules = modules(src);
    let root = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    let reexports = reexports(&root, &modules);
    let mut graph = Graph::new();
    for (module, files) in &modules {
        let used = graph.entry(module.clone()).or_default();
        for file in files {
            let code = code_only(&std::fs::read_to_string(file).unwrap());
            for name in crate_paths(&code) {
                let target = if modules.contains_key(&name) {
                    Some(&name)
                } else {
                    reexports.get(&name)
                };
                if let Some(target) = target.filter(|t| *t != module) {
                    used.insert(target.clone());
                }
            }
        }
    }
    graph
}

/// A cycle of `graph` (its modules in order, the first repeated at the end), if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &Graph,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match marks.get(next) {
                Some(Mark::Open) => {
                    let from = path.iter().position(|n| n == next).unwrap_or(0);
                    let mut cycle = path[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(cycle) = visit(next, graph, marks, path) {
                        return Some(cycle);
                    }
                }
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if !marks.contains_key(node)
            && let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new())
        {
            return Some(cycle);
        }
    }
    None
}

fn render(graph: &Graph) -> String {
    graph
        .iter()
        .map(|(m, used)| {
            let used: Vec<&str> = used.iter().map(String::as_str).collect();
            format!("{m:20} -> {}\n", used.join(", "))
        })
        .collect()
}

#[test]
fn the_modules_use_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    println!("{}", render(&graph));
    // The reader sees the edges it must (else an empty graph would pass).
    for (from, to) in [("server", "broker"), ("server", "txn"), ("fetch", "ctx")] {
        assert!(
            graph.get(from).is_some_and(|used| used.contains(to)),
            "{from} -> {to} not seen:\n{}",
            render(&graph)
        );
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "the modules use each other in a cycle: {}\n\n{}",
            cycle.join(" -> "),
            render(&graph)
        );
    }
}

#[test]
fn the_reader_sees_paths_in_code_only_and_finds_cycles() {
    let code = code_only(
        r##"
        use crate::a::X; // crate::commented
        /* crate::block /* nested crate::deeper */ */
        use crate::{b, c::{D, E}, self as me};
        fn f<'x>(s: &'x str) -> char { let _ = "crate::string"; let _ = r#"crate::raw"#; '\'' }
        pub(crate) fn g() { crate::f::call(); $crate::macro_root(); let _ = 'y'; }
        "##,
    );
    let found: Vec<String> = crate_paths(&code).into_iter().collect();
    assert_eq!(found, ["a", "b", "c", "f", "self"]);

    let mut graph = Graph::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")] {
        graph.entry(from.into()).or_default().insert(to.into());
    }
    let cycle = find_cycle(&graph).unwrap();
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4, "{cycle:?}");
    graph.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&graph), None);

    let modules: Modules = ["config", "server"]
        .into_iter()
        .map(|m| (m.to_string(), Vec::new()))
        .collect();
    let map = reexports(
        "pub use config::{Config, Parsed as P};\npub use server::run;\nmod x;",
        &modules,
    );
    assert_eq!(map.get("Config").map(String::as_str), Some("config"));
    assert_eq!(map.get("P").map(String::as_str), Some("config"));
    assert_eq!(map.get("run").map(String::as_str), Some("server"));
}
