//! flock-rpc is pure like the CNI library under it: no async runtime, netlink or syscall crate
//! among its normal dependencies (the shim links it, and starts in well under a millisecond).

#[test]
fn depends_on_no_io_crate() {
    flock_testkit::assert_pure_dependency_tree("flock-rpc", &["flock-cni-proto", "serde_json"]);
}
