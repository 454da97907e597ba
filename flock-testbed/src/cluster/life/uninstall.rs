//! `cargo xtask cluster life uninstall`: flock removed as `docs/install.md` says — `helm
//! uninstall` and the CRDs deleted (or `kubectl delete -R -f deploy/` for a cluster installed
//! from the manifests), then `flock-agent cleanup` on each node — leaves nothing of flock in
//! the API, no flock rule in any node's nftables, and kube-proxy's rules where they were. It ends flock in the
//! cluster, so `cargo xtask cluster check` runs it last, after the e2e suites; it is not one
//! of the life tests run by default.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cluster::deploy::{self, DEMO_NS};
use crate::cluster::proc::Place;
use crate::cluster::{NODES, Node, kubectl, kubectl_stdin, node, repo_root};
use crate::sys;

/// A policy that isolates the anycast DaemonSet's pods (one on every node), so each node
/// has flock's table (`web`'s replicas may all be on one node by then).
fn isolate() -> String {
    format!(
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{ name: before-uninstall, namespace: {DEMO_NS} }}
spec:
  podSelector: {{ matchLabels: {{ app: anycast }} }}
  policyTypes: [Ingress]
  ingress: [ {{ from: [ {{ podSelector: {{}} }} ] }} ]
"
    )
}

/// flock's objects still in the API: CRDs of its group, cluster-wide RBAC named flock*, and
/// anything named flock* in kube-system or default — the Secret of BGP passwords aside,
/// which is the cluster's own (the chart only references it) — and Helm's release records.
fn api_leftovers() -> Result<Vec<String>> {
    let mut left: Vec<String> = kubectl(&["get", "crd", "-o", "name"])?
        .lines()
        .filter(|l| l.ends_with(".flock.fritzlab.net"))
        .map(str::to_owned)
        .collect();
    let named = |args: &[&str]| -> Result<Vec<String>> {
        Ok(kubectl(args)?
            .lines()
            .filter(|l| {
                l.rsplit('/').next().is_some_and(|n| {
                    n.starts_with("flock") || n.starts_with("sh.helm.release.v1.flock.")
                })
            })
            .filter(|l| !l.ends_with(&format!("/{}", deploy::PASSWORD_SECRET)))
            .map(str::to_owned)
            .collect())
    };
    left.extend(named(&[
        "get",
        "clusterroles,clusterrolebindings",
        "-o",
        "name",
    ])?);
    for ns in ["kube-system", "default"] {
        let kinds =
            "daemonsets,deployments,serviceaccounts,roles,rolebindings,secrets,configmaps,leases";
        left.extend(
            named(&["-n", ns, "get", kinds, "-o", "name"])?
                .into_iter()
                .map(|l| format!("{ns}/{l}")),
        );
    }
    Ok(left)
}

/// The lines of `nft list ruleset` in `n`'s namespace that name flock.
fn flock_rules(n: &Node) -> Result<Vec<String>> {
    Ok(flock_lines(
        &Place::Net(n.ns()).run(&["nft", "list", "ruleset"])?,
    ))
}

/// The lines of a ruleset that name flock, but for kube-proxy's own: its local-traffic
/// detector names flock's veths (`iifname != "flock*"`, docs/services.md), in its tables
/// (`ip`/`ip6 kube-proxy`, nftables mode) or its `KUBE-*` chains (iptables mode).
fn flock_lines(ruleset: &str) -> Vec<String> {
    let mut table = "";
    let mut chain = "";
    let mut out = Vec::new();
    for line in ruleset.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["table", _, name, "{"] => table = name,
            ["chain", name, "{"] => chain = name,
            _ => {}
        }
        let kube_proxys = table == "kube-proxy" || chain.starts_with("KUBE-");
        if line.to_lowercase().contains("flock") && !kube_proxys {
            out.push(line.to_owned());
        }
    }
    out
}

/// kube-proxy's rules in its service chain in `n`'s namespace for the Services of the
/// `default` and demo namespaces (they must survive flock's removal). Services elsewhere
/// are left out: the e2e suites' namespaces may still be terminating, and their Services'
/// rules go with them while this test runs.
fn kube_proxy_rules(n: &Node) -> Vec<String> {
    // iptables names a Service in a rule's comment ("default/kubernetes:https"), nftables in
    // its chain's name (service-HASH-default/kubernetes/tcp/https).
    let ours = [
        "\"default/".to_owned(),
        format!("\"{DEMO_NS}/"),
        "-default/".to_owned(),
        format!("-{DEMO_NS}/"),
    ];
    // Both families: the demo's Services are dual-stack.
    let mut rules: Vec<String> = [node::Family::V6, node::Family::V4]
        .into_iter()
        .filter_map(|family| node::kube_services(&Place::Net(n.ns()), family).ok())
        .flat_map(|s| {
            s.lines()
                .filter(|l| ours.iter().any(|o| l.contains(o.as_str())))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    // kube-proxy writes them in no fixed order.
    rules.sort();
    rules
}

/// Removes flock from the cluster as a user does and checks that nothing of it is left while
/// kube-proxy's rules stay as they were; its tables into `out`; returns what missed its goal.
pub fn uninstall(out: &mut String, bins: &Path) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    kubectl_stdin(&["apply", "-f", "-"], &isolate())?;
    sys::wait_for(Duration::from_secs(60), || {
        NODES.iter().all(|n| {
            flock_rules(n).is_ok_and(|r| r.iter().any(|l| l.contains("table inet flock_policy")))
        })
    })
    .context("flock's nftables table on every node, with the anycast pods isolated")?;
    let mut rows = Vec::new();
    let installed: Vec<(usize, Vec<String>)> = NODES
        .iter()
        .map(|n| {
            (
                flock_rules(n).map(|r| r.len()).unwrap_or(0),
                kube_proxy_rules(n),
            )
        })
        .collect();
    let installer = deploy::installed_with();
    let how = match installer {
        deploy::Installer::Helm => {
            deploy::helm(&[
                "uninstall",
                crate::helm::RELEASE,
                "--namespace",
                crate::helm::NAMESPACE,
                "--wait",
                "--timeout",
                "120s",
            ])
            .context("helm uninstall")?;
            // Helm keeps a chart's CRDs (crds/): removed by hand, as docs/install.md says, and
            // every NodeConfig and NodePool with them
            kubectl(&[
                "delete",
                "crd",
                "nodeconfigs.flock.fritzlab.net",
                "nodepools.flock.fritzlab.net",
                "--timeout=120s",
            ])?;
            "helm uninstall flock, kubectl delete crd …flock.fritzlab.net, the controller's Lease"
        }
        deploy::Installer::Manifests => {
            let deploy = repo_root().join("deploy");
            kubectl(&[
                "delete",
                "-R",
                "-f",
                &deploy.to_string_lossy(),
                "--ignore-not-found",
                "--timeout=120s",
            ])
            .context("kubectl delete -R -f deploy/")?;
            "kubectl delete -R -f deploy/, the controller's Lease"
        }
    };
    // the pool controller's leader election Lease is the controller's, not the install's
    kubectl(&[
        "-n",
        "kube-system",
        "delete",
        "lease",
        "flock-controller",
        "--ignore-not-found",
    ])?;
    sys::wait_for(Duration::from_secs(120), || {
        kubectl(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name in (flock, flock-bird, flock-controller)",
            "-o",
            "name",
        ])
        .is_ok_and(|p| p.trim().is_empty())
    })
    .context("flock's pods gone after the uninstall")?;
    for left in api_leftovers()? {
        failures.push(format!("uninstall: {left} is left in the API"));
    }
    let deleted: Vec<usize> = NODES
        .iter()
        .map(|n| flock_rules(n).map(|r| r.len()).unwrap_or(0))
        .collect();
    let agent = bins.join("flock-agent");
    for (i, n) in NODES.iter().enumerate() {
        Place::Net(n.ns())
            .run(&[&agent.to_string_lossy(), "cleanup"])
            .with_context(|| format!("flock-agent cleanup on {}", n.name))?;
        let left = flock_rules(n)?;
        let kube_proxy = kube_proxy_rules(n);
        if !left.is_empty() {
            failures.push(format!("uninstall: {} keeps flock rules: {left:?}", n.name));
        }
        if kube_proxy.is_empty() {
            failures.push(format!(
                "uninstall: kube-proxy's rules on {} have none for the default and {DEMO_NS} Services",
                n.name
            ));
        } else if kube_proxy != installed[i].1 {
            failures.push(format!(
                "uninstall: kube-proxy's rules on {} changed for the default and {DEMO_NS} Services: had {:?}, has {kube_proxy:?}",
                n.name, installed[i].1
            ));
        }
        rows.push(vec![
            n.name.to_owned(),
            installed[i].0.to_string(),
            deleted[i].to_string(),
            left.len().to_string(),
            format!("{} / {}", installed[i].1.len(), kube_proxy.len()),
        ]);
    }
    let _ = writeln!(
        out,
        "UNINSTALL ({how}, then flock-agent cleanup on each node; nft list ruleset in the node's namespace)"
    );
    sys::table(
        out,
        &[
            "node",
            "flock lines installed",
            "after the uninstall",
            "after cleanup",
            "kube-proxy's rules (default, demo) before / after",
        ],
        &rows,
    );
    out.push('\n');
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxys_detector_of_flocks_veths_is_not_a_flock_rule() {
        let ruleset = "table inet flock_policy {
\tchain ingress {
\t\tiifname \"flock0a1b2c3d\" accept
\t}
}
table ip kube-proxy {
\tchain services {
\t\tip daddr @cluster-ips iifname != \"flock*\" meta mark set meta mark | 0x00004000
\t}
}
table ip nat {
\tchain KUBE-SERVICES {
\t\tiifname != \"flock*\" counter jump KUBE-MARK-MASQ
\t}
\tchain POSTROUTING {
\t\toifname \"flock*\" masquerade
\t}
}
";
        assert_eq!(
            flock_lines(ruleset),
            [
                "table inet flock_policy {",
                "iifname \"flock0a1b2c3d\" accept",
                "oifname \"flock*\" masquerade"
            ]
        );
    }
}
