//! A crate's module graph, read from its sources, and the cycle finder the "no import
//! cycles" tests use: every `crate::<module>` path outside comments and test modules is an
//! edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module name → the modules it uses, for the top-level modules of a crate's `src` folder.
pub fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("read src") {
        let path = entry.expect("entry").path();
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_none_or(|e| e != "rs") || name == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read module");
        modules.insert(name.to_owned(), uses(&text));
    }
    for (name, used) in &mut modules {
        used.remove(name);
    }
    modules
}

/// The modules `text` names as `crate::x` (or in `crate::{x, y}`), before its test module and
/// outside comments.
fn uses(text: &str) -> BTreeSet<String> {
    let code = text
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        for (i, _) in line.match_indices("crate::") {
            let rest = &line[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // The first name of each top-level item of the group.
                let mut depth = 0;
                let mut item_start = true;
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => item_start = true,
                        c if item_start && !c.is_whitespace() => {
                            found.insert(ident(&group[j..]));
                            item_start = false;
                        }
                        _ => {}
                    }
                }
            } else {
                found.insert(ident(rest));
            }
        }
    }
    found.retain(|m| !m.is_empty());
    found
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
        assert_eq!(
            uses(
                "use crate::error::{A, B};\n// crate::skel\nfn f() { crate::env::x(); }\n#[cfg(test)]\nmod tests {\n    use crate::rpc;\n}\n"
            ),
            ["env", "error"].map(String::from).into()
        );
        assert_eq!(
            uses("use crate::{delqueue, rpc::{self, Op}};"),
            ["delqueue", "rpc"].map(String::from).into()
        );
    }
}
