//! No import cycles: neither between the crate's files nor between its top-level modules, so
//! each can be read knowing only the modules below it (`pod` → `host`, `anycast` → `ns`,
//! `nl` → `error`). Read from the sources: every `crate::`, `super::` and `self::` path
//! outside comments and test modules is an edge.

use std::path::Path;

use flock_testkit::modules::{assert_no_import_cycles, file_graph, top_level};

#[test]
fn no_import_cycles() {
    assert_no_import_cycles(env!("CARGO_MANIFEST_DIR"));
    let graph = top_level(&file_graph(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
    ));
    // the pod's layout uses the node side and anycast, never the other way round
    for (from, to) in [("pod", "host"), ("pod", "anycast")] {
        assert!(graph[from].contains(to), "{from} → {to}: {graph:#?}");
        assert!(!graph[to].contains(from), "{to} → {from}: {graph:#?}");
    }
}

#[test]
fn one_module_style() {
    flock_testkit::modules::assert_one_module_style(env!("CARGO_MANIFEST_DIR"));
}
