//! The API crate is what a tool that only reads or writes flock's resources adds: without its
//! features it depends on kube's derive, k8s-openapi, serde and schemars, nothing that does
//! I/O.

#[test]
fn without_features_it_depends_on_the_derive_and_the_schema_crates_only() {
    let mut direct = flock_testkit::dependency_tree("flock-k8s-api", Some(1));
    assert_eq!(direct.remove(0), "flock-k8s-api");
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
        ]
    );
    flock_testkit::assert_pure_dependency_tree("flock-k8s-api", &["kube-derive", "kube-core"]);
}
