//! No import cycles: neither between the crate's files (`agent::error`, a folder's `mod.rs`
//! being the folder's module) nor between its top-level modules, so each can be read, and
//! moved, knowing only what it uses. Read from the sources: every `crate::`, `super::` and
//! `self::` path outside comments and test modules is an edge.

#[test]
fn no_import_cycles() {
    flock_testkit::modules::assert_no_import_cycles(env!("CARGO_MANIFEST_DIR"));
}

#[test]
fn one_module_style() {
    flock_testkit::modules::assert_one_module_style(env!("CARGO_MANIFEST_DIR"));
}
