//! flock-cni-proto is pure: its normal dependency tree must hold no async
//! runtime and nothing that does netlink or raw syscalls.

use std::process::Command;

#[test]
fn no_tokio_nix_or_rtnetlink() {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "flock-cni-proto",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(tree.contains("serde_json"), "unexpected tree:\n{tree}");
    let names: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for banned in [
        "tokio",
        "nix",
        "rtnetlink",
        "netlink-sys",
        "netlink-packet-route",
        "mio",
        "libc",
        "futures",
    ] {
        assert!(
            !names.contains(&banned),
            "{banned} is in the normal dependency tree:\n{tree}"
        );
    }
}
