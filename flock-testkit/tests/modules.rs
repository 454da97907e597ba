//! Every crate of the workspace, by the project's own checks: no import cycles, neither between
//! a crate's files (`agent::error`, a folder's `mod.rs` being the folder's module) nor between
//! its top-level modules, so each can be read, and moved, knowing only what it uses (read from
//! the sources: every `crate::`, `super::` and `self::` path outside comments and test modules
//! is an edge); and one style of folder module per crate. One test for all, so a new crate is
//! checked without anyone adding a test to it.

use flock_testkit::modules::{assert_no_import_cycles, assert_one_module_style, file_graph};

/// The crates with modules of their own (not a lone `main.rs`, as the shim and xtask).
fn crates_with_modules() -> Vec<String> {
    let crates: Vec<String> = flock_testkit::workspace_crates()
        .into_iter()
        .filter(|dir| dir.join("src").is_dir() && !file_graph(&dir.join("src")).is_empty())
        .map(|dir| dir.display().to_string())
        .collect();
    assert!(crates.len() > 10, "too few crates found: {crates:?}");
    crates
}

#[test]
fn no_import_cycles() {
    for dir in crates_with_modules() {
        assert_no_import_cycles(&dir);
    }
}

#[test]
fn one_module_style() {
    for dir in crates_with_modules() {
        assert_one_module_style(&dir);
    }
}
