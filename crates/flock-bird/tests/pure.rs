//! flock-bird is pure: its normal dependencies are ipnet and thiserror (and
//! what they pull in), never an async runtime, netlink or syscall crate.

use std::process::Command;

#[test]
fn depends_on_no_io_crate() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "flock-bird",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        crates.contains(&"ipnet") && crates.contains(&"thiserror"),
        "{tree}"
    );
    for banned in [
        "tokio",
        "nix",
        "rtnetlink",
        "netlink-packet-route",
        "libc",
        "mio",
    ] {
        assert!(
            !crates.contains(&banned),
            "flock-bird depends on {banned}:\n{tree}"
        );
    }
}
