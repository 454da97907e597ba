//! `cargo xtask cluster gomod`: writes each component's wrapper module from
//! [`crate::versions`], then lets `go mod tidy` pin every dependency in its `go.sum`.
//!
//! A wrapper module requires its component at the named version and lists what the test bed
//! builds from it as `tool`s, so `go mod tidy` keeps exactly their dependencies. A test binary
//! compiled from an upstream package (`go test -c sigs.k8s.io/network-policy-api/conformance`)
//! is no tool: the wrapper imports that package in a file of its own under the build tag
//! `tools` ([`test_imports`]), which puts it in the module's package graph, so that `go mod
//! tidy` keeps its module and the sums of its tests' dependencies. A package of Go's standard
//! library (`cmd/test2json`) is built by the toolchain and named nowhere. Kubernetes
//! needs more: its `go.mod` requires its staging modules (`k8s.io/api` …) at `v0.0.0` and
//! replaces them with folders of its own repository, which a dependent module does not see.
//! The wrapper replaces each with the release's `v0.N.P` instead; the list is read from the
//! release's own `go.mod` (served by the module proxy), since it grows between releases (1.36
//! added `k8s.io/streaming` and `k8s.io/cri-streaming`). Its `godebug` line is copied too, so
//! the binaries run with the runtime settings upstream's do.

use std::fmt::Write as _;

use anyhow::{Context, Result, bail};

use crate::components::{self, Component, json_field};
use crate::sys;
use crate::versions::{KUBERNETES, Kubernetes};

/// Rewrites the wrapper module of every component (every supported Kubernetes release, and
/// the others once) and tidies it.
pub fn write_all() -> Result<()> {
    for k in KUBERNETES {
        write_kubernetes(k)?;
    }
    for c in components::cluster(Kubernetes::newest()) {
        if c.name != "kubernetes" {
            write(&c, "")?;
        }
    }
    for c in components::beside_the_cluster() {
        write(&c, "")?;
    }
    Ok(())
}

/// Rewrites the wrapper modules of the components named in `names` (`helm`, `etcd`, …; for
/// Kubernetes, `kubernetes-1.N`), or of every one when `names` is empty.
pub fn write_named(names: &[String]) -> Result<()> {
    if names.is_empty() {
        return write_all();
    }
    for name in names {
        if let Some(k) = KUBERNETES
            .iter()
            .find(|k| *name == format!("kubernetes-1.{}", k.minor))
        {
            write_kubernetes(*k)?;
            continue;
        }
        let c = components::cluster(Kubernetes::newest())
            .into_iter()
            .chain(components::beside_the_cluster())
            .find(|c| c.name == name.as_str() && c.name != "kubernetes")
            .with_context(|| format!("no component {name:?} has a wrapper module"))?;
        write(&c, "")?;
    }
    Ok(())
}

/// The `replace` block and `godebug` line of Kubernetes `k`'s wrapper, from its `go.mod`.
pub fn kubernetes_extras(k: Kubernetes, upstream_go_mod: &str) -> Result<String> {
    let staging = staging_modules(upstream_go_mod);
    if staging.is_empty() {
        bail!("k8s.io/kubernetes v{k}'s go.mod requires no staging module at v0.0.0");
    }
    let mut out = String::new();
    for line in upstream_go_mod
        .lines()
        .filter(|l| l.starts_with("godebug "))
    {
        let _ = writeln!(out, "{line}\n");
    }
    out.push_str("replace (\n");
    for m in staging {
        let _ = writeln!(out, "\t{m} => {m} {}", k.staging());
    }
    out.push_str(")\n");
    Ok(out)
}

/// The modules a Kubernetes `go.mod` requires at `v0.0.0`: its staging modules.
pub fn staging_modules(go_mod: &str) -> Vec<String> {
    go_mod
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let mut name = words.next()?;
            if name == "require" {
                name = words.next()?;
            }
            (words.next()? == "v0.0.0" && name.starts_with("k8s.io/")).then(|| name.to_owned())
        })
        .collect()
}

fn write_kubernetes(k: Kubernetes) -> Result<()> {
    let c = kubernetes_module(k);
    let dir = c.module_dir();
    let json = sys::output(
        components::go_command(&components::modules_dir())?
            .args(["mod", "download", "-json"])
            .arg(format!("k8s.io/kubernetes@v{k}")),
    )?;
    let go_mod_path = json_field(&json, "GoMod")
        .with_context(|| format!("no GoMod in `go mod download -json`: {json}"))?;
    let upstream =
        std::fs::read_to_string(&go_mod_path).with_context(|| format!("read {go_mod_path}"))?;
    // The e2e package is the same source for every release; the newest's is the original.
    let e2e = dir.join("e2e");
    let newest = components::kubernetes(Kubernetes::newest())
        .module_dir()
        .join("e2e");
    if e2e != newest {
        std::fs::create_dir_all(&e2e).with_context(|| format!("create {}", e2e.display()))?;
        let from = newest.join("e2e_test.go");
        std::fs::copy(&from, e2e.join("e2e_test.go"))
            .with_context(|| format!("copy {}", from.display()))?;
    }
    write(&c, &kubernetes_extras(k, &upstream)?)
}

/// What Kubernetes `k`'s wrapper module builds: the cluster's binaries and its suites' (both
/// components build from the one module, so its tools are theirs together).
fn kubernetes_module(k: Kubernetes) -> Component {
    let mut c = components::kubernetes(k);
    c.outputs.extend(components::kubernetes_e2e(k).outputs);
    c
}

/// Writes `c`'s wrapper `go.mod` (with `extra` after its `require`) and tidies it.
fn write(c: &Component, extra: &str) -> Result<()> {
    let dir = c.module_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let text = go_mod(c, extra);
    let path = dir.join("go.mod");
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    let imports = dir.join(TEST_IMPORTS_FILE);
    match test_imports(c) {
        Some(go) => {
            std::fs::write(&imports, go).with_context(|| format!("write {}", imports.display()))?
        }
        None if imports.exists() => std::fs::remove_file(&imports)
            .with_context(|| format!("remove {}", imports.display()))?,
        None => {}
    }
    // Tidy reads the module files as they are; it must be allowed to write them.
    let mut tidy = components::go_command(&dir)?;
    tidy.args(["mod", "tidy"]).env("GOFLAGS", "-mod=mod");
    sys::output(&mut tidy).with_context(|| format!("go mod tidy in {}", dir.display()))?;
    eprintln!(
        "testbed: wrote {} ({} {})",
        path.display(),
        c.upstream,
        c.version
    );
    Ok(())
}

/// The wrapper's `go.mod` before `go mod tidy`.
pub fn go_mod(c: &Component, extra: &str) -> String {
    let mut out = format!(
        "// Written by `cargo xtask cluster gomod` from flock-testbed/src/versions.rs.\n\
         module github.com/fritzlab/flock/testbed/{}\n\n\
         go 1.24.0\n\n\
         require {} v{}\n\n",
        c.module, c.upstream, c.version
    );
    if !c.pins.is_empty() {
        out.push_str("require (\n");
        for (module, version) in c.pins {
            let _ = writeln!(out, "\t{module} {version}");
        }
        out.push_str(")\n\n");
    }
    if !extra.is_empty() {
        out.push_str(extra);
        out.push('\n');
    }
    out.push_str("tool (\n");
    let mut tools: Vec<&str> = c
        .outputs
        .iter()
        .filter(|o| !o.test_binary && !is_std(&o.package))
        .map(|o| o.package.as_str())
        .collect();
    tools.sort_unstable();
    tools.dedup();
    for t in tools {
        let _ = writeln!(out, "\t{t}");
    }
    out.push_str(")\n");
    out
}

/// Whether `package` is of Go's standard library (`cmd/test2json`): its first element has no
/// dot.
fn is_std(package: &str) -> bool {
    !package.split('/').next().unwrap_or("").contains('.')
}

/// The file of a wrapper module that imports the upstream test packages it compiles.
pub const TEST_IMPORTS_FILE: &str = "test_packages.go";

/// The wrapper's [`TEST_IMPORTS_FILE`]: a blank import of each upstream package `c` compiles
/// with `go test -c`, under a build tag no build sets; `None` when it compiles none (a local
/// test package such as Kubernetes' `./e2e` is in the module already).
pub fn test_imports(c: &Component) -> Option<String> {
    let mut packages: Vec<&str> = c
        .outputs
        .iter()
        .filter(|o| o.test_binary && !o.package.starts_with("./"))
        .map(|o| o.package.as_str())
        .collect();
    if packages.is_empty() {
        return None;
    }
    packages.sort_unstable();
    packages.dedup();
    let mut out = String::from(
        "// Written by `cargo xtask cluster gomod` from flock-testbed/src/components.rs.\n\n\
         //go:build tools\n\n\
         // Package tests names the upstream test packages the test bed compiles with\n\
         // `go test -c`. A dependency's test package is in the module's package graph only\n\
         // when imported, and `go mod tidy` keeps the sums of its tests' dependencies only\n\
         // for a package in that graph. The build tag keeps this file out of every build.\n\
         package tests\n\n\
         import (\n",
    );
    for p in packages {
        let _ = writeln!(out, "\t_ \"{p}\"");
    }
    out.push_str(")\n");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPSTREAM: &str = "module k8s.io/kubernetes\n\ngo 1.26.0\n\ngodebug default=go1.26\n\n\
        require (\n\tgithub.com/onsi/ginkgo/v2 v2.32.0\n\tk8s.io/api v0.0.0\n\tk8s.io/streaming v0.0.0\n)\n\n\
        replace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n)\n";

    #[test]
    fn staging_modules_are_the_k8s_requirements_at_v0_0_0() {
        assert_eq!(
            staging_modules(UPSTREAM),
            ["k8s.io/api", "k8s.io/streaming"]
        );
    }

    #[test]
    fn kubernetes_wrapper_replaces_staging_with_the_release_and_keeps_godebug() {
        let k = Kubernetes::newest();
        let extra = kubernetes_extras(k, UPSTREAM).unwrap();
        assert!(extra.starts_with("godebug default=go1.26\n"), "{extra}");
        assert!(extra.contains(&format!("\tk8s.io/api => k8s.io/api {}\n", k.staging())));
        assert!(extra.contains(&format!(
            "\tk8s.io/streaming => k8s.io/streaming {}\n",
            k.staging()
        )));
        let err = kubernetes_extras(k, "module x\n").unwrap_err().to_string();
        assert!(err.contains("no staging module"), "{err}");
    }

    #[test]
    fn wrapper_lists_each_command_once_and_not_the_test_binary() {
        let text = go_mod(&kubernetes_module(Kubernetes::newest()), "");
        assert!(text.contains("\tk8s.io/kubernetes/cmd/kubelet\n"));
        // The suites' tools too: the same module builds them.
        assert!(text.contains("\tk8s.io/kubernetes/test/images/agnhost\n"));
        assert!(text.contains("\tgithub.com/onsi/ginkgo/v2/ginkgo\n"));
        assert!(!text.contains("./e2e"));
        assert!(text.contains(&format!(
            "require k8s.io/kubernetes v{}\n",
            Kubernetes::newest()
        )));
        assert_eq!(
            test_imports(&components::kubernetes_e2e(Kubernetes::newest())),
            None
        );
    }

    #[test]
    fn an_upstream_test_package_is_imported_and_std_is_no_tool() {
        let c = components::network_policy_api();
        let text = go_mod(&c, "");
        assert!(!text.contains("test2json"), "{text}");
        assert!(!text.contains("/conformance"), "{text}");
        let go = test_imports(&c).unwrap();
        assert!(go.contains("\n\n//go:build tools\n\n"), "{go}");
        assert!(go.contains("\npackage tests\n"), "{go}");
        assert!(go.contains(&format!(
            "\t_ \"{}\"\n",
            components::CNP_CONFORMANCE_PACKAGE
        )));
        assert!(is_std("cmd/test2json") && !is_std("k8s.io/kubernetes/cmd/kubelet"));
    }

    #[test]
    fn every_committed_wrapper_names_what_is_built_from_it() {
        // A package built from a module must be one of its tools (or imported by its test
        // file): `-mod=readonly` refuses a package whose dependencies go.mod does not list.
        let mut all: Vec<Component> = KUBERNETES.iter().map(|k| kubernetes_module(*k)).collect();
        all.extend(
            components::cluster(Kubernetes::newest())
                .into_iter()
                .filter(|c| c.name != "kubernetes"),
        );
        all.extend(components::beside_the_cluster());
        for c in all {
            let path = c.module_dir().join("go.mod");
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // `tool X`, or `X` on a line of a `tool ( … )` block.
            let mut tools = Vec::new();
            let mut in_block = false;
            for line in text.lines().map(str::trim) {
                match (in_block, line) {
                    (false, "tool (") => in_block = true,
                    (true, ")") => in_block = false,
                    (true, t) => tools.push(t),
                    (false, l) => tools.extend(l.strip_prefix("tool ")),
                }
            }
            for o in c
                .outputs
                .iter()
                .filter(|o| !o.test_binary && !is_std(&o.package))
            {
                assert!(
                    tools.contains(&o.package.as_str()),
                    "{} lists no tool {}",
                    path.display(),
                    o.package
                );
            }
        }
    }

    #[test]
    fn the_committed_test_imports_file_is_the_one_gomod_writes() {
        let c = components::network_policy_api();
        let path = c.module_dir().join(TEST_IMPORTS_FILE);
        let committed =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(Some(committed), test_imports(&c));
    }
}
