//! flock-policy is pure: no async runtime, netlink or syscall crate among its normal dependencies.

#[test]
fn depends_on_no_io_crate() {
    flock_testkit::assert_pure_dependency_tree("flock-policy", &["ipnet", "thiserror"]);
}
