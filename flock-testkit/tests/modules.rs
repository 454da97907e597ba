//! No import cycles in the test kit itself, by its own check.

#[test]
fn no_import_cycles() {
    flock_testkit::modules::assert_no_import_cycles(env!("CARGO_MANIFEST_DIR"));
}

#[test]
fn one_module_style() {
    flock_testkit::modules::assert_one_module_style(env!("CARGO_MANIFEST_DIR"));
}
