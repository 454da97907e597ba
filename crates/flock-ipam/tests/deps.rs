//! The crate is pure: nothing that does I/O may be among its dependencies.

use std::process::Command;

#[test]
fn no_io_crates_in_the_dependency_tree() {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "flock-ipam",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.contains("ipnet"), "unexpected tree:\n{tree}");
    for banned in ["tokio", "nix", "rtnetlink", "netlink", "mio", "libc"] {
        assert!(
            !tree
                .lines()
                .any(|l| l.split_whitespace().next() == Some(banned)),
            "{banned} in the normal dependency tree of flock-ipam:\n{tree}"
        );
    }
}
