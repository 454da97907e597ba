//! flock's Helm chart (`charts/flock`) and the plain manifests made from it.
//!
//! `deploy/*.yaml` (but the examples) and `deploy/crds/*.yaml` are the chart rendered with
//! its default values (`helm template`), one file per template, so a user of plain manifests
//! and a user of Helm install the same thing. `cargo xtask helm render` writes them;
//! `cargo xtask helm check` (a step of `cargo xtask test`) lints the chart and fails when a
//! committed manifest differs from what the chart renders. Helm is built from its Go module
//! ([`crate::components::helm`]).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::components;
use crate::sys;

/// The chart, under the repository.
pub const CHART: &str = "charts/flock";
/// The release name the manifests are rendered with (and the test bed installs).
pub const RELEASE: &str = "flock";
/// The namespace flock runs in.
pub const NAMESPACE: &str = "kube-system";

/// The helm binary, built when the cache lacks it.
pub fn helm() -> Result<PathBuf> {
    Ok(components::helm().ensure_built()?.tool("helm"))
}

/// The repository's root.
fn repo() -> PathBuf {
    crate::binaries::workspace_root()
}

/// Points `cmd` (a helm) at the test bed's own configuration, caches and data: no user's
/// repositories or plugins, and nothing written into the user's home.
pub fn configure(cmd: &mut Command) -> &mut Command {
    let dir = components::cache_dir().join("helm");
    cmd.env("HELM_CONFIG_HOME", dir.join("config"))
        .env("HELM_CACHE_HOME", dir.join("cache"))
        .env("HELM_DATA_HOME", dir.join("data"))
}

/// `helm ARGS…` in the repository (no cluster); its stdout.
pub fn run(args: &[&str]) -> Result<String> {
    let mut cmd = Command::new(helm()?);
    configure(&mut cmd).args(args).current_dir(repo());
    sys::output(&mut cmd)
}

/// The Kubernetes release charts are rendered and linted for: the newest flock supports
/// (Helm's own default, without a cluster, is far older than the chart's `kubeVersion`).
fn kube_version() -> String {
    crate::versions::Kubernetes::newest().to_string()
}

/// The chart rendered with its default values.
pub fn template_defaults() -> Result<String> {
    run(&[
        "template",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--include-crds",
        "--kube-version",
        &kube_version(),
    ])
}

/// Splits `helm template`'s output into one file per template: (path under `deploy/`,
/// content). The chart's `templates/X.yaml` becomes `X.yaml`, its `crds/X.yaml` (which Helm
/// installs before the templates) `crds/X.yaml`; a template that renders nothing has no file.
pub fn split(rendered: &str) -> Result<Vec<(String, String)>> {
    let prefix = format!("# Source: {RELEASE}/");
    let mut files: Vec<(String, String)> = Vec::new();
    for doc in rendered.split("\n---\n") {
        let doc = doc.strip_prefix("---\n").unwrap_or(doc);
        let Some(first) = doc.lines().next() else {
            continue;
        };
        let Some(path) = first
            .strip_prefix(&prefix)
            .map(|p| p.strip_prefix("templates/").unwrap_or(p))
        else {
            if doc.trim().is_empty() {
                continue;
            }
            bail!("a rendered document does not start with {prefix:?}: {first:?}");
        };
        let body = doc[first.len()..].trim_start_matches('\n').trim_end();
        match files.iter_mut().find(|(p, _)| p == path) {
            Some((_, content)) => {
                content.push_str("---\n");
                content.push_str(body);
                content.push('\n');
            }
            None => files.push((path.to_owned(), format!("{body}\n"))),
        }
    }
    Ok(files)
}

/// The header every rendered manifest starts with.
pub fn header(template: &str) -> String {
    format!(
        "# Rendered from the Helm chart ({CHART}, {template}) with its default values by\n\
         # `cargo xtask helm render`: edit the chart, not this file.\n"
    )
}

/// The manifests the chart renders with its defaults: (path under `deploy/`, content).
pub fn manifests() -> Result<Vec<(String, String)>> {
    Ok(split(&template_defaults()?)?
        .into_iter()
        .map(|(path, body)| {
            let content = format!("{}{body}", header(&path));
            (path, content)
        })
        .collect())
}

/// `cargo xtask helm [render|check|lint]`.
pub fn helm_command(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("render") => render(),
        None | Some("check") => check(),
        Some("lint") => lint(),
        Some(other) => bail!("cargo xtask helm {other:?}: render, check or lint"),
    }
}

/// Writes `deploy/` from the chart.
pub fn render() -> Result<()> {
    let deploy = repo().join("deploy");
    for (path, content) in manifests()? {
        let file = deploy.join(&path);
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        std::fs::write(&file, content).with_context(|| format!("write {}", file.display()))?;
        println!("helm: wrote {}", file.display());
    }
    Ok(())
}

/// `helm lint` of the chart, strict (a warning fails it), with its defaults.
pub fn lint() -> Result<()> {
    print!("{}", lint_with(None)?);
    Ok(())
}

/// `helm lint --strict` of the chart, with the values file `values` if one; its report.
fn lint_with(values: Option<&str>) -> Result<String> {
    let kube = kube_version();
    let mut args = vec![
        "lint",
        "--strict",
        CHART,
        "--namespace",
        NAMESPACE,
        "--kube-version",
        &kube,
    ];
    if let Some(v) = values {
        args.extend(["--values", v]);
    }
    run(&args)
}

/// The values file that sets every value (`charts/flock/ci/`, Helm's folder for such files).
pub const EVERY_VALUE: &str = "charts/flock/ci/every-value.yaml";

/// A fresh folder for values files of the check.
fn tempfile_dir() -> Result<PathBuf> {
    let dir = components::cache_dir()
        .join("helm")
        .join(format!("check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

/// The chart rendered with `values` (a file) and `sets`.
fn template_with(values: &str, sets: &[&str]) -> Result<String> {
    let kube = kube_version();
    let mut args = vec![
        "template",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--kube-version",
        &kube,
        "--values",
        values,
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    run(&args)
}

/// What the chart must render from [`EVERY_VALUE`]: each value reaches its object.
fn check_every_value() -> Result<()> {
    lint_with(Some(EVERY_VALUE))?;
    let rendered = template_with(EVERY_VALUE, &[])?;
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&rendered)
        .map(serde::Deserialize::deserialize)
        .collect::<Result<Vec<serde_yaml::Value>, _>>()
        .context("the chart rendered with every value is not YAML")?;
    let find = |kind: &str, name: &str, namespace: Option<&str>| {
        docs.iter().find(|d| {
            d["kind"] == kind
                && d["metadata"]["name"] == name
                && namespace.is_none_or(|ns| d["metadata"]["namespace"] == ns)
        })
    };
    let mut missing = Vec::new();
    let mut want = |what: &str, ok: bool| {
        if !ok {
            missing.push(what.to_owned());
        }
    };
    let ds = find("DaemonSet", "flock", Some(NAMESPACE));
    let agent = ds.map(|d| &d["spec"]["template"]["spec"]["containers"][0]);
    let env = |name: &str| {
        agent
            .and_then(|a| a["env"].as_sequence())
            .and_then(|e| e.iter().find(|v| v["name"] == name))
            .map(|v| v["value"].clone())
    };
    want(
        "the agent's image registry.example/flock:v0.1.0-test, pulled Always",
        agent.is_some_and(|a| {
            a["image"] == "registry.example/flock:v0.1.0-test" && a["imagePullPolicy"] == "Always"
        }),
    );
    want(
        "FLOCK_NETWORK_POLICY false",
        env("FLOCK_NETWORK_POLICY") == Some("false".into()),
    );
    want(
        "FLOCK_LEAK_GRACE 10m",
        env("FLOCK_LEAK_GRACE") == Some("10m".into()),
    );
    want(
        "the agent's nodeSelector",
        ds.is_some_and(|d| {
            d["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/os"] == "linux"
        }),
    );
    want(
        "3 controller replicas",
        find("Deployment", "flock-controller", Some(NAMESPACE))
            .is_some_and(|d| d["spec"]["replicas"] == 3),
    );
    want(
        "the Role on the Secrets tor-a and tor-b of net-secrets",
        find("Role", "flock-bgp-passwords", Some("net-secrets")).is_some_and(|r| {
            r["rules"][0]["resourceNames"]
                == serde_yaml::from_str::<serde_yaml::Value>("[tor-a, tor-b]").unwrap_or_default()
        }),
    );
    want(
        "its RoleBinding to the agent's account",
        find("RoleBinding", "flock-bgp-passwords", Some("net-secrets"))
            .is_some_and(|b| b["subjects"][0]["namespace"] == NAMESPACE),
    );
    want(
        "NodePool rack1",
        find("NodePool", "rack1", None).is_some_and(|p| p["spec"]["cidr6"] == "2001:db8:1::/48"),
    );
    want(
        "NodeConfig host001 with its ip-algo annotation",
        find("NodeConfig", "host001", None).is_some_and(|c| {
            c["metadata"]["annotations"]["flock.fritzlab.net/ip-algo"] == "workload"
                && c["spec"]["cidr4"] == "10.244.1.0/24"
        }),
    );
    if !missing.is_empty() {
        bail!(
            "the chart rendered with {EVERY_VALUE} lacks: {}",
            missing.join("; ")
        );
    }
    // bad values are refused, naming the value
    let dir = tempfile_dir()?;
    for (i, (values, names)) in [
        ("agent: { networkPolicy: \"on\" }\n", "networkPolicy"),
        ("controller: { replicas: 0 }\n", "replicas"),
        ("pools: [ { name: rack9 } ]\n", "spec"),
        ("agent: { leakGrace: five minutes }\n", "leakGrace"),
    ]
    .into_iter()
    .enumerate()
    {
        let file = dir.join(format!("bad-{i}.yaml"));
        std::fs::write(&file, values).with_context(|| format!("write {}", file.display()))?;
        match template_with(&file.to_string_lossy(), &[]) {
            Ok(_) => bail!("the chart took the values {values:?}"),
            Err(e) if format!("{e:#}").contains(names) => {}
            Err(e) => bail!("values {values:?}: the error does not name {names}: {e:#}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Lints the chart (with its defaults and with every value set), checks every value reaches
/// its object and bad ones are refused, and compares `deploy/` with what the defaults render.
pub fn check() -> Result<()> {
    lint()?;
    check_every_value()?;
    let deploy = repo().join("deploy");
    let mut differ = Vec::new();
    for (path, content) in manifests()? {
        let file = deploy.join(&path);
        let committed = std::fs::read_to_string(&file).unwrap_or_default();
        if committed != content {
            differ.push(path);
        }
    }
    if !differ.is_empty() {
        bail!(
            "deploy/ differs from the chart for {}: `cargo xtask helm render` writes them",
            differ.join(", ")
        );
    }
    println!("helm: the chart lints clean and renders deploy/ as committed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_rendered_output_by_template() {
        let rendered = "---
# Source: flock/templates/rbac.yaml
apiVersion: v1
kind: ServiceAccount
---
# Source: flock/templates/rbac.yaml
kind: ClusterRole
---
# Source: flock/crds/nodepools.flock.fritzlab.net.yaml
kind: CustomResourceDefinition
";
        let files = split(rendered).unwrap();
        assert_eq!(
            files,
            vec![
                (
                    "rbac.yaml".to_owned(),
                    "apiVersion: v1\nkind: ServiceAccount\n---\nkind: ClusterRole\n".to_owned()
                ),
                (
                    "crds/nodepools.flock.fritzlab.net.yaml".to_owned(),
                    "kind: CustomResourceDefinition\n".to_owned()
                ),
            ]
        );
        assert!(split("---\nkind: Pod\n").is_err());
    }
}
