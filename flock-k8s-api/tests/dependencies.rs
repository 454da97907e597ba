//! The API crate is what a tool that only reads or writes flock's resources adds: without its
//! `settings` feature it depends on kube's derive, k8s-openapi, serde and schemars, nothing
//! that does I/O.

use std::process::Command;

#[test]
fn without_settings_it_depends_on_the_derive_and_the_schema_crates_only() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "flock-k8s-api",
            "-e",
            "normal",
            "--depth",
            "1",
            "--prefix",
            "none",
            "--offline",
        ])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let mut direct: Vec<&str> = tree
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    direct.sort_unstable();
    // serde_json: the CustomResource derive's generated code names it; thiserror: the Error.
    assert_eq!(
        direct,
        [
            "k8s-openapi",
            "kube",
            "schemars",
            "serde",
            "serde_json",
            "thiserror"
        ],
        "{tree}"
    );
    flock_testkit::assert_pure_dependency_tree("flock-k8s-api", &["kube-derive", "kube-core"]);
}
