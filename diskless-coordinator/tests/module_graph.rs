//! The modules of `src/postgres/` and of `src/sqlite/` use each other without a cycle: each uses
//! only modules below it, and the parent `mod.rs` (which defines the coordinator and dispatches
//! to them) uses them all.
//!
//! The graph is read from the sources (comments and string literals left out): a module uses a
//! sibling when its code names a path `super::sibling...` (`super::super::...` from a nested
//! module, `use super::{a, b::c}` included) or `crate::<dir>::sibling...`. A module that names
//! another item of `mod.rs` the same way uses `mod.rs`, which is a cycle, since `mod.rs` uses every
//! module: shared helpers belong in a module of their own. The one exception is the coordinator
//! type itself: its methods are `impl` blocks spread over the modules, which need the type, not
//! `mod.rs`'s helpers. `cargo test -p diskless-coordinator --test module_graph -- --nocapture`
//! prints the graphs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.
#![allow(clippy::print_stdout)] // The graphs, for --nocapture.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → the sibling modules it uses.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The node of the parent module.
const PARENT: &str = "mod.rs";

/// `text` without comments, and with string and char literals emptied.
fn code_only(text: &str) -> String {
    let s: Vec<char> = text.chars().collect();
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < s.len() {
        match (s[i], at(i + 1)) {
            ('/', '/') => {
                while i < s.len() && s[i] != '\n' {
                    i += 1;
                }
            }
            ('/', '*') => {
                let mut depth = 0;
                while i < s.len() {
                    match (s[i], at(i + 1)) {
                        ('/', '*') => (depth, i) = (depth + 1, i + 2),
                        ('*', '/') => (depth, i) = (depth - 1, i + 2),
                        _ => i += 1,
                    }
                    if depth == 0 {
                        break;
                    }
                }
            }
            ('"', _) => {
                // A raw string (`r#"..."#`) left its `r` and hashes in `out`: skip to the quote
                // followed by as many hashes.
                let raw = out.trim_end_matches('#').ends_with('r');
                let hashes = if raw {
                    out.chars().rev().take_while(|&c| c == '#').count()
                } else {
                    0
                };
                i += 1;
                while i < s.len() && !(s[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#')) {
                    i += if s[i] == '\\' && !raw { 2 } else { 1 };
                }
                i += 1 + hashes;
                out.push_str("\"\"");
            }
            ('\'', c) if c == '\\' || at(i + 2) == '\'' => {
                // A char literal; a quote not closed two characters on is a lifetime.
                i += if c == '\\' { 3 } else { 2 };
                while i < s.len() && s[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Identifiers, `::` and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut ident = c.to_string();
            while let Some(&n) = chars.peek().filter(|n| n.is_alphanumeric() || **n == '_') {
                ident.push(n);
                chars.next();
            }
            out.push(ident);
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.push("::".into());
        } else if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    out
}

/// The names a file of module `level` levels below the directory `dir` (`conn.rs`: 1,
/// `migrate/functions.rs`: 2) refers to right below the directory: `x` of every path
/// `super::x` (with as many `super` as it takes, inline `mod m { ... }` counted) or
/// `crate::<dir>::x`, and every head of a group `super::{x, y::z}`.
fn names_below(code: &str, dir: &str, level: usize) -> BTreeSet<String> {
    let t = tokens(code);
    let is = |i: usize, s: &str| t.get(i).is_some_and(|x| x == s);
    let mut names = BTreeSet::new();
    let (mut depth, mut inline) = (0usize, Vec::new());
    for i in 0..t.len() {
        match t[i].as_str() {
            "{" => {
                depth += 1;
                if i >= 2 && is(i - 2, "mod") {
                    inline.push(depth);
                }
            }
            "}" => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "super" | "crate"
                if is(i + 1, "::") && !(i > 0 && (is(i - 1, "::") || is(i - 1, "$"))) =>
            {
                // `j`: the first token below the directory.
                let j = if t[i] == "crate" {
                    if !is(i + 2, dir) || !is(i + 3, "::") {
                        continue;
                    }
                    i + 4
                } else {
                    let mut j = i;
                    while is(j, "super") && is(j + 1, "::") {
                        j += 2;
                    }
                    if (j - i) / 2 != level + inline.len() {
                        continue; // Within the module itself, or outside the directory.
                    }
                    j
                };
                if !is(j, "{") {
                    names.insert(t.get(j).cloned().unwrap_or_default());
                    continue;
                }
                let mut group_depth = 0;
                for k in j..t.len() {
                    let head = match t[k].as_str() {
                        "{" => {
                            group_depth += 1;
                            group_depth == 1
                        }
                        "," => group_depth == 1,
                        "}" => {
                            group_depth -= 1;
                            if group_depth == 0 {
                                break;
                            }
                            false
                        }
                        _ => false,
                    };
                    if head && !is(k + 1, "}") {
                        names.insert(t[k + 1].clone());
                    }
                }
            }
            _ => {}
        }
    }
    names
}

/// The module graph of `src/<dir>`, whose coordinator type is `coordinator`.
fn graph(dir: &str, coordinator: &str) -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    // (module, level, file) of every file below the directory but `mod.rs`.
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            for sub in std::fs::read_dir(&path).unwrap() {
                let sub = sub.unwrap().path();
                assert!(sub.is_file(), "{}: one level is read", sub.display());
                if sub.extension().is_some_and(|e| e == "rs") {
                    // `<dir>/m/mod.rs` is `m` itself, any other file a module in `m`.
                    let level = if sub.ends_with("mod.rs") { 1 } else { 2 };
                    files.push((name.clone(), level, sub));
                }
            }
        } else if let Some(stem) = name.strip_suffix(".rs")
            && stem != "mod"
        {
            files.push((stem.to_string(), 1, path));
        }
    }
    let modules: BTreeSet<String> = files.iter().map(|(m, ..)| m.clone()).collect();
    let mut graph = Graph::new();
    graph.insert(PARENT.into(), modules.clone());
    for (module, level, file) in &files {
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        let used = graph.entry(module.clone()).or_default();
        for name in names_below(&code, dir, *level) {
            if modules.contains(&name) {
                if name != *module {
                    used.insert(name);
                }
            } else if name != coordinator && name != "self" {
                // An item of mod.rs (or a `*` of all of them).
                used.insert(PARENT.into());
            }
        }
    }
    graph
}

/// A cycle of `graph` (its modules in order, the first repeated at the end), if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(from) = path.iter().position(|n| n == node) {
            let mut cycle = path[from..].to_vec();
            cycle.push(node.into());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.into());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.into());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

fn render(graph: &Graph) -> String {
    graph
        .iter()
        .map(|(m, used)| {
            let used: Vec<&str> = used.iter().map(String::as_str).collect();
            format!("{m:10} -> {}\n", used.join(", "))
        })
        .collect()
}

fn check(dir: &str, coordinator: &str, seen: &[(&str, &str)]) {
    let graph = graph(dir, coordinator);
    println!("{dir}:\n{}", render(&graph));
    // The reader sees the edges it must (else an empty graph would pass).
    for (from, to) in seen {
        assert!(
            graph.get(*from).is_some_and(|used| used.contains(*to)),
            "{dir}: {from} -> {to} not seen:\n{}",
            render(&graph)
        );
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "the modules of src/{dir} use each other in a cycle: {}\n\n{}",
            cycle.join(" -> "),
            render(&graph)
        );
    }
}

#[test]
fn postgres_modules_use_each_other_without_a_cycle() {
    check(
        "postgres",
        "PostgresCoordinator",
        &[
            ("txn", "commit"),
            ("tiering", "topics"),
            ("conn", "migrate"),
        ],
    );
}

#[test]
fn sqlite_modules_use_each_other_without_a_cycle() {
    check(
        "sqlite",
        "SqliteCoordinator",
        &[
            ("txn", "commit"),
            ("commit", "producer"),
            ("tests", "reads"),
        ],
    );
}

#[test]
fn the_reader_sees_paths_in_code_only() {
    let code = code_only(
        r##"
        use super::a::X; // super::commented
        /* super::block /* nested super::deeper */ */
        use super::{b, c::{D, E}, Coordinator, self};
        use crate::postgres::f;
        pub(super) fn g<'x>(s: &'x str) -> char { let _ = "super::string"; let _ = r#"super::"raw"#; '\'' }
        pub(in crate::postgres) fn h() { super::i::call(); crate::other::j(); }
        mod tests { use super::*; use super::super::k; }
        "##,
    );
    let found: Vec<String> = names_below(&code, "postgres", 1).into_iter().collect();
    assert_eq!(found, ["Coordinator", "a", "b", "c", "f", "i", "k", "self"]);
    let nested: Vec<String> = names_below("use super::x; use super::super::y;", "postgres", 2)
        .into_iter()
        .collect();
    assert_eq!(nested, ["y"]);

    let mut graph = Graph::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")] {
        graph.entry(from.into()).or_default().insert(to.into());
    }
    let cycle = find_cycle(&graph).unwrap();
    assert_eq!((cycle.first(), cycle.len()), (cycle.last(), 4), "{cycle:?}");
    graph.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&graph), None);
}
