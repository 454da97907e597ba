//! The address families of the pods the suite creates: the pools' IPv4 switched off for an
//! IPv6-only run and back on after, checked on a pod of each node.

use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::super::{NODES, images, kubectl, kubectl_stdin};
use crate::sys;

/// The address families of the pods the suite creates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pods {
    /// IPv6 only (NodeConfig `defaults.ipv4: false`): every pod IP the suite sees is IPv6.
    Ipv6,
    /// IPv6 and IPv4, as the cluster's NodeConfigs have it.
    Dual,
}

impl Pods {
    /// `--pods VALUE`.
    pub fn parse(value: &str) -> Result<Pods> {
        match value {
            "ipv6" => Ok(Pods::Ipv6),
            "dual" => Ok(Pods::Dual),
            other => bail!("--pods {other:?}: ipv6 or dual"),
        }
    }

    pub(super) fn describe(self) -> &'static str {
        match self {
            Pods::Ipv6 => "IPv6-only",
            Pods::Dual => "dual-stack",
        }
    }

    /// The value of NodeConfig `spec.defaults.ipv4` for this mode.
    fn ipv4(self) -> bool {
        self == Pods::Dual
    }
}

/// The pools' `spec.defaults.ipv4` set for the suite's pods (the pool controller passes it on
/// to each node's NodeConfig), and put back when dropped.
pub(super) struct PodFamilies {
    /// Each rack's pool's value before (`None`: unset).
    previous: Vec<(&'static str, Option<bool>)>,
}

impl PodFamilies {
    /// Sets every node's default and waits until a new pod on each node has just the wanted
    /// families: the agents follow their NodeConfig through a watch.
    pub(super) fn set(pods: Pods) -> Result<PodFamilies> {
        let mut previous = Vec::new();
        for n in &NODES {
            let before = kubectl(&[
                "get",
                "nodepool",
                n.rack,
                "-o",
                "jsonpath={.spec.defaults.ipv4}",
            ])?;
            previous.push((n.rack, before.trim().parse::<bool>().ok()));
            patch_ipv4(n.rack, Some(pods.ipv4()))?;
        }
        let families = PodFamilies { previous };
        for n in &NODES {
            // Each probe is a pod started and deleted; the last one's outcome is the error's.
            let mut last = String::from("no probe finished");
            sys::wait_for(Duration::from_secs(60), || match probe_families(n.name) {
                Ok((v6, v4)) => {
                    last = format!("the last probe pod got IPv6 {v6}, IPv4 {v4}");
                    v6 && v4 == pods.ipv4()
                }
                Err(e) => {
                    last = format!("the last probe: {e:#}");
                    false
                }
            })
            .with_context(|| {
                format!(
                    "new pods on {} do not get {} addresses after its NodePool's \
                     defaults.ipv4 became {} ({last}; NodeConfig {}'s defaults.ipv4: {})",
                    n.name,
                    pods.describe(),
                    pods.ipv4(),
                    n.name,
                    kubectl(&[
                        "get",
                        "nodeconfig",
                        n.name,
                        "-o",
                        "jsonpath={.spec.defaults.ipv4}",
                    ])
                    .unwrap_or_else(|e| format!("{e:#}"))
                )
            })?;
        }
        Ok(families)
    }
}

impl Drop for PodFamilies {
    fn drop(&mut self) {
        for (pool, before) in &self.previous {
            if let Err(e) = patch_ipv4(pool, *before) {
                eprintln!("cluster: e2e: could not restore NodePool {pool}'s defaults.ipv4: {e:#}");
            }
        }
    }
}

fn patch_ipv4(pool: &str, ipv4: Option<bool>) -> Result<()> {
    let value = ipv4.map_or("null".to_owned(), |v| v.to_string());
    kubectl(&[
        "patch",
        "nodepool",
        pool,
        "--type=merge",
        "-p",
        &format!("{{\"spec\":{{\"defaults\":{{\"ipv4\":{value}}}}}}}"),
    ])?;
    Ok(())
}

/// Starts a pod on `node`, returns whether it got an IPv6 and an IPv4 address, deletes it.
fn probe_families(node: &str) -> Result<(bool, bool)> {
    let name = format!("flock-e2e-probe-{node}");
    let manifest = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"default"}},
"spec":{{"nodeName":"{node}","terminationGracePeriodSeconds":0,
"containers":[{{"name":"net","image":"{}","imagePullPolicy":"Never"}}]}}}}"#,
        images::NET
    );
    let _ = kubectl(&["delete", "pod", "-n", "default", &name, "--wait=true"]);
    kubectl_stdin(&["apply", "-f", "-"], &manifest)?;
    let mut ips = String::new();
    let seen = sys::wait_for(Duration::from_secs(20), || {
        match kubectl(&[
            "get",
            "pod",
            "-n",
            "default",
            &name,
            "-o",
            "jsonpath={.status.podIPs[*].ip}",
        ]) {
            Ok(got) if !got.trim().is_empty() => {
                ips = got;
                true
            }
            _ => false,
        }
    });
    let _ = kubectl(&["delete", "pod", "-n", "default", &name, "--wait=false"]);
    seen.with_context(|| format!("{name} got no address"))?;
    let ips: Vec<&str> = ips.split_whitespace().collect();
    Ok((
        ips.iter().any(|ip| ip.contains(':')),
        ips.iter().any(|ip| !ip.contains(':')),
    ))
}
