//! Which pod network the cluster runs — flock's, or a peer's it is compared with
//! (`cargo xtask cluster up --cni …`, `--policy …`; [`super::peers`] installs the peers) —
//! recorded at `up` for every command after it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::RUN_DIR;

/// The pod network of a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cni {
    /// flock (the default).
    #[default]
    Flock,
    /// kube-router: routes over BGP (GoBGP), pods on a bridge, NetworkPolicy in iptables.
    KubeRouter,
    /// The reference `ptp` + `host-local`, statically routed.
    Ptp,
}

impl Cni {
    /// As `--cni` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Cni::Flock => "flock",
            Cni::KubeRouter => "kube-router",
            Cni::Ptp => "ptp",
        }
    }

    /// The CNI of the cluster that is up (flock when none was recorded).
    pub fn current() -> Cni {
        std::fs::read_to_string(cni_file())
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_default()
    }

    /// Records the CNI of the cluster that is coming up.
    pub fn record(self) -> Result<()> {
        std::fs::write(cni_file(), self.as_str())
            .with_context(|| format!("write {}", cni_file().display()))
    }

    /// The reference plugins its pods need on each node besides those every node has
    /// (loopback, portmap, bandwidth).
    pub fn node_plugins(self) -> &'static [&'static str] {
        match self {
            Cni::Flock => &[],
            Cni::KubeRouter => &["bridge", "host-local"],
            Cni::Ptp => &["ptp", "host-local"],
        }
    }

    /// How kube-proxy tells a pod's traffic from the rest: `detectLocalMode` and its
    /// `detectLocal` setting. By the interface the traffic comes in on: flock's veths
    /// (`flock…`), kube-router's bridge, ptp's veths (`veth…`).
    pub fn kube_proxy_local(self) -> (&'static str, &'static str) {
        match self {
            Cni::Flock => ("InterfaceNamePrefix", "interfaceNamePrefix: flock"),
            Cni::KubeRouter => ("BridgeInterface", "bridgeInterface: kube-bridge"),
            Cni::Ptp => ("InterfaceNamePrefix", "interfaceNamePrefix: veth"),
        }
    }

    /// Whether the router peers with the nodes over BGP: flock's BIRD and kube-router's GoBGP
    /// do; ptp's nodes speak no BGP.
    pub fn speaks_bgp(self) -> bool {
        self != Cni::Ptp
    }
}

impl std::str::FromStr for Cni {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Cni> {
        match s {
            "flock" => Ok(Cni::Flock),
            "kube-router" => Ok(Cni::KubeRouter),
            "ptp" => Ok(Cni::Ptp),
            other => bail!("--cni {other:?}: flock, kube-router or ptp"),
        }
    }
}

/// A NetworkPolicy engine run beside a CNI that has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// SIG Network's kube-network-policies.
    KubeNetworkPolicies,
}

impl Policy {
    /// As `--policy` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::KubeNetworkPolicies => "kube-network-policies",
        }
    }

    /// The policy engine of the cluster that is up, if it runs one of its own.
    pub fn current() -> Option<Policy> {
        std::fs::read_to_string(policy_file())
            .ok()
            .and_then(|t| t.trim().parse().ok())
    }

    /// Records the policy engine of the cluster that is coming up (`None`: the CNI's own).
    pub fn record(policy: Option<Policy>) -> Result<()> {
        match policy {
            Some(p) => std::fs::write(policy_file(), p.as_str())
                .with_context(|| format!("write {}", policy_file().display())),
            None => Ok(()),
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Policy> {
        match s {
            "kube-network-policies" => Ok(Policy::KubeNetworkPolicies),
            other => bail!("--policy {other:?}: kube-network-policies"),
        }
    }
}

/// Whether `policy` can run over `cni`: a policy engine of its own goes over a CNI without
/// one (ptp); flock and kube-router enforce NetworkPolicy themselves.
pub fn check_combination(cni: Cni, policy: Option<Policy>) -> Result<()> {
    match (cni, policy) {
        (_, None) | (Cni::Ptp, Some(_)) => Ok(()),
        (cni, Some(p)) => bail!(
            "--policy {} runs over a CNI without NetworkPolicy (--cni ptp); {} enforces \
             NetworkPolicy itself",
            p.as_str(),
            cni.as_str()
        ),
    }
}

fn cni_file() -> PathBuf {
    Path::new(RUN_DIR).join("cni")
}

fn policy_file() -> PathBuf {
    Path::new(RUN_DIR).join("policy")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cni_and_policy_parse_and_combine() {
        assert_eq!("kube-router".parse::<Cni>().unwrap(), Cni::KubeRouter);
        assert_eq!("ptp".parse::<Cni>().unwrap().as_str(), "ptp");
        let err = "calico".parse::<Cni>().unwrap_err().to_string();
        assert!(
            err.contains("\"calico\"") && err.contains("kube-router"),
            "{err}"
        );
        let knp = Some(Policy::KubeNetworkPolicies);
        assert!(check_combination(Cni::Ptp, knp).is_ok());
        assert!(check_combination(Cni::Flock, None).is_ok());
        let err = check_combination(Cni::KubeRouter, knp)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("kube-router enforces NetworkPolicy itself"),
            "{err}"
        );
    }
}
