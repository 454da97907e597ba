//! A crate's module graph, read from its sources, and the cycle finder the "no import
//! cycles" tests use: every `crate::`, `super::` or `self::` path outside comments and test
//! modules is an edge, at the level of files ([`file_graph`]: `agent::error`) and of the
//! crate's top-level modules ([`top_level`]: `agent`). [`assert_no_import_cycles`] checks both.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`agent::error`; a folder's `mod.rs` is the folder's module) → the modules its
/// code names, for every file of a crate's `src` folder but `lib.rs`/`main.rs` and test files
/// (`tests.rs`, `tests/`). A path names the longest module it starts with; a module naming
/// one of its ancestors (`super::Thing` in a child) is not an edge: parent and child are
/// read together.
pub fn file_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    collect_files(src, src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = BTreeMap::new();
    for (module, path) in &files {
        let text = std::fs::read_to_string(path).expect("read module");
        let here: Vec<&str> = module.split("::").collect();
        let mut used = BTreeSet::new();
        for target in paths(&text, &here) {
            // The longest module the path starts with.
            let found = (1..=target.len())
                .rev()
                .map(|n| target[..n].join("::"))
                .find(|m| modules.contains(m));
            if let Some(m) = found {
                let ancestor = module == &m || module.starts_with(&format!("{m}::"));
                if !ancestor {
                    used.insert(m);
                }
            }
        }
        graph.insert(module.clone(), used);
    }
    graph
}

/// The graph of the crate's top-level modules: `agent::error → policy` becomes
/// `agent → policy`; a module naming itself is not an edge.
pub fn top_level(files: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_owned();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in files {
        let entry = graph.entry(top(from)).or_default();
        entry.extend(to.iter().map(|t| top(t)).filter(|t| *t != top(from)));
    }
    graph
}

/// Panics naming the cycle if the files of the crate at `crate_dir` (its `src`), or its
/// top-level modules, import each other in a loop.
pub fn assert_no_import_cycles(crate_dir: &str) {
    let files = file_graph(&Path::new(crate_dir).join("src"));
    assert!(!files.is_empty(), "no module read under {crate_dir}/src");
    if let Some(cycle) = find_cycle(&files) {
        panic!("files import each other in a loop: {}", cycle.join(" → "));
    }
    if let Some(cycle) = find_cycle(&top_level(&files)) {
        panic!("modules import each other in a loop: {}", cycle.join(" → "));
    }
}

/// Panics naming both kinds unless the folder modules of the crate at `crate_dir` are written
/// one way: every one as `folder/mod.rs`, or every one as `folder.rs` beside `folder/`.
pub fn assert_one_module_style(crate_dir: &str) {
    fn walk(dir: &Path, mod_rs: &mut Vec<String>, beside: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if !path.is_dir() || name == "snapshots" {
                continue;
            }
            if path.join("mod.rs").exists() {
                mod_rs.push(path.display().to_string());
            }
            if path.with_extension("rs").exists() {
                beside.push(path.with_extension("rs").display().to_string());
            }
            walk(&path, mod_rs, beside);
        }
    }
    let (mut mod_rs, mut beside) = (Vec::new(), Vec::new());
    walk(&Path::new(crate_dir).join("src"), &mut mod_rs, &mut beside);
    assert!(
        mod_rs.is_empty() || beside.is_empty(),
        "both module styles in one crate: {mod_rs:?} as folder/mod.rs, {beside:?} as folder.rs \
         beside folder/"
    );
}

fn collect_files(src: &Path, dir: &Path, out: &mut Vec<(String, std::path::PathBuf)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if name != "tests" && name != "snapshots" {
                collect_files(src, &path, out);
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || name == "tests.rs" {
            continue;
        }
        let rel = path
            .strip_prefix(src)
            .expect("under src")
            .with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|l| l == "mod") {
            parts.pop();
        }
        if parts.is_empty() || parts == ["lib"] || parts == ["main"] {
            continue;
        }
        out.push((parts.join("::"), path));
    }
}

/// Every path `text` (the module at `here`) names through `crate::`, `super::` or `self::`,
/// as segments from the crate root, before its test module and outside comments.
fn paths(text: &str, here: &[&str]) -> Vec<Vec<String>> {
    let code = text
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        let mut i = 0;
        while i < line.len() {
            let rest = &line[i..];
            let starts_word = line[..i]
                .chars()
                .next_back()
                .is_none_or(|c| !is_ident(c) && c != ':');
            let base: Option<(Vec<String>, usize)> = if !starts_word {
                None
            } else if rest.starts_with("crate::") {
                Some((Vec::new(), "crate::".len()))
            } else if rest.starts_with("super::") || rest.starts_with("self::") {
                let mut at: Vec<String> = here.iter().map(|s| (*s).to_owned()).collect();
                let mut len = 0;
                loop {
                    if line[i + len..].starts_with("super::") {
                        at.pop();
                        len += "super::".len();
                    } else if line[i + len..].starts_with("self::") {
                        len += "self::".len();
                    } else {
                        break;
                    }
                }
                Some((at, len))
            } else {
                None
            };
            let Some((prefix, len)) = base else {
                i += rest.chars().next().map_or(1, char::len_utf8);
                continue;
            };
            let tail = &line[i + len..];
            if let Some(group) = tail.strip_prefix('{') {
                for item in group_items(group) {
                    out.push(join(&prefix, item));
                }
            } else {
                out.push(join(&prefix, tail));
            }
            i += len;
        }
    }
    out
}

/// The items of a `{a::b, c, d::{e, f}}` group (the text after its `{`), each as written.
fn group_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (j, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..j]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..j]);
                start = j + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

/// `prefix` followed by the segments of the path at the start of `text` (`a::b::C`).
fn join(prefix: &[String], text: &str) -> Vec<String> {
    let mut out = prefix.to_vec();
    let mut rest = text.trim_start();
    loop {
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() || ident == "self" {
            break;
        }
        rest = &rest[ident.len()..];
        out.push(ident);
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out
}

/// A cycle of `graph` (its modules in order, the first repeated at the end), if any.
pub fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cycle_finder_finds_cycles() {
        let graph = |edges: &[(&str, &str)]| {
            let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (a, b) in edges {
                g.entry((*a).into()).or_default().insert((*b).into());
                g.entry((*b).into()).or_default();
            }
            g
        };
        assert_eq!(
            find_cycle(&graph(&[("error", "version"), ("version", "error")])),
            Some(vec!["error".into(), "version".into(), "error".into()])
        );
        assert_eq!(
            find_cycle(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])),
            None
        );
        let named = |text: &str, here: &[&str]| -> Vec<String> {
            paths(text, here)
                .into_iter()
                .map(|p| p.join("::"))
                .collect()
        };
        assert_eq!(
            named(
                "use super::decide::Pool;\nuse crate::{agent::error::Error, k8s};\nlet x = self::inner::f();\n",
                &["controller", "run"]
            ),
            [
                "controller::decide::Pool",
                "agent::error::Error",
                "k8s",
                "controller::run::inner::f"
            ]
        );
        assert_eq!(
            named(
                "pub(super) fn f() {} // crate::skel\nlet y = flock_cni_proto::error::x;",
                &["a"]
            ),
            Vec::<String>::new()
        );
    }
}
