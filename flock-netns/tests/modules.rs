//! The crate's modules form a graph without cycles: each module can be read knowing only the
//! modules below it (`pod` → `host`, `anycast` → `ns`, `nl` → `error`). Read from the
//! sources: every `crate::<module>` path outside comments and test modules is an edge.

use std::path::Path;

use flock_testkit::modules::{find_cycle, module_graph};

#[test]
fn module_imports_have_no_cycle() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert_eq!(find_cycle(&graph), None, "module graph: {graph:#?}");
    // the pod's layout uses the node side and anycast, never the other way round
    for (from, to) in [("pod", "host"), ("pod", "anycast")] {
        assert!(graph[from].contains(to), "{from} → {to}: {graph:#?}");
        assert!(!graph[to].contains(from), "{to} → {from}: {graph:#?}");
    }
}
