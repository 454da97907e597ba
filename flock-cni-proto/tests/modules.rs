//! The crate's modules form a graph without cycles: each module can be read (and moved to a
//! crate of its own) knowing only the modules below it. Read from the sources: every
//! `crate::<module>` path outside comments and test modules is an edge.

use std::path::Path;

use flock_testkit::modules::{find_cycle, module_graph};

#[test]
fn module_imports_have_no_cycle() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(
        graph.contains_key("error") && graph.contains_key("version"),
        "{graph:?}"
    );
    assert_eq!(find_cycle(&graph), None, "module graph: {graph:#?}");
}
