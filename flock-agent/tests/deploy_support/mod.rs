//! Reading the repository's manifests, for the tests of what `deploy/` installs.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file of the repository, by its path from the root.
pub fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// Every YAML document of a file.
pub fn documents(rel: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(&read(rel))
        .map(|d| serde_yaml::Value::deserialize(d).unwrap_or_else(|e| panic!("{rel}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// A YAML document as the Kubernetes object it is.
pub fn typed<T: serde::de::DeserializeOwned>(v: &serde_yaml::Value) -> T {
    serde_yaml::from_value(v.clone()).expect("a valid object of its kind")
}

/// A CRD as `deploy/crds/` and the Helm chart's `crds/` hold it: the chart's file, and
/// `deploy/`'s rendered from it (its header comment, then the same text). Panics, naming
/// the files, when they are not the same.
pub fn committed_crd(file: &str) -> String {
    let chart = read(&format!("charts/flock/crds/{file}"));
    let rendered = read(&format!("deploy/crds/{file}"));
    let body: String = rendered
        .split_inclusive('\n')
        .skip_while(|l| l.starts_with('#'))
        .collect();
    assert!(
        body == chart,
        "deploy/crds/{file} is not charts/flock/crds/{file} rendered: run `cargo xtask helm render`"
    );
    chart
}
