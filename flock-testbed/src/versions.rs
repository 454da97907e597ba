//! Every version the test bed builds, in one place.
//!
//! The wrapper modules under `flock-testbed/go/` require exactly these versions (a test reads
//! each `go.mod` and compares), and `cargo xtask cluster gomod` writes the Kubernetes ones from
//! here. flock supports the three newest Kubernetes minors, [`KUBERNETES`]; the cluster runs
//! the newest unless `--kubernetes` names another.

use std::fmt;

use anyhow::{Result, bail};

/// A Kubernetes release the test bed can build and run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kubernetes {
    /// `37` for 1.37.
    pub minor: u32,
    /// `2` for 1.37.2.
    pub patch: u32,
}

/// The releases flock supports, oldest first: the three newest minors, each at the newest
/// patch the Go module proxy serves.
pub const KUBERNETES: [Kubernetes; 3] = [
    Kubernetes {
        minor: 35,
        patch: 4,
    },
    Kubernetes {
        minor: 36,
        patch: 3,
    },
    Kubernetes {
        minor: 37,
        patch: 2,
    },
];

/// containerd 2 (its CRI plugin calls CNI STATUS), with its runc shim.
pub const CONTAINERD: &str = "2.4.2";
/// containerd 1.7, the newest of its line: Kubernetes 1.35 and 1.36 still support it
/// (Debian 13 ships it), and flock's installed conflist must keep working on it.
pub const CONTAINERD_1_7: &str = "1.7.35";
/// runc, the version containerd's own CI runs (`script/setup/runc-version` of [`CONTAINERD`]).
pub const RUNC: &str = "1.5.2";
/// etcd, the version the newest Kubernetes defaults to (kubeadm's `DefaultEtcdVersion`).
pub const ETCD: &str = "3.7.0";
/// CoreDNS, the version the newest Kubernetes deploys (kubeadm's `CoreDNSVersion`).
pub const COREDNS: &str = "1.14.6";
/// The reference CNI plugins (loopback for every sandbox; ptp, host-local, portmap and
/// bandwidth for the chains and comparisons).
pub const CNI_PLUGINS: &str = "1.10.0";
/// SIG Network's network-policy-api (`sigs.k8s.io/network-policy-api`): the
/// ClusterNetworkPolicy CRD the cluster installs, and its conformance suite
/// (`cargo xtask cluster e2e --suite cluster-network-policy`).
pub const NETWORK_POLICY_API: &str = "0.3.0";

/// Helm (`helm.sh/helm/v3`): the test bed installs flock's chart (`charts/flock`) with
/// it, and `cargo xtask helm` renders `deploy/` from the chart and lints it.
pub const HELM: &str = "3.22.0";

/// Multus (`gopkg.in/k8snetworkplumbingwg/multus-cni.v4`, the path the Go module proxy serves
/// it under; `github.com/k8snetworkplumbingwg/multus-cni/v4` is refused), thick plugin:
/// `cargo xtask cluster up --multus` runs it as the cluster's meta-plugin with flock behind it.
pub const MULTUS: &str = "4.2.3";

/// kube-router (`github.com/cloudnativelabs/kube-router/v2`): the routed BGP CNI most like
/// flock, a comparison peer of `cargo xtask cluster up --cni kube-router` only (never shipped).
/// The Go module proxy serves this version alone; security flaws are reported for it.
pub const KUBE_ROUTER: &str = "2.1.0";
/// kube-network-policies (`sigs.k8s.io/kube-network-policies`): SIG Network's reference
/// NetworkPolicy implementation, a comparison peer of `--policy kube-network-policies` only.
pub const KUBE_NETWORK_POLICIES: &str = "0.8.0";

impl Kubernetes {
    /// The newest supported release: what the cluster runs by default.
    pub fn newest() -> Kubernetes {
        KUBERNETES[KUBERNETES.len() - 1]
    }

    /// The release of `text`: a supported minor (`1.37`) or its exact version (`1.37.2`).
    pub fn parse(text: &str) -> Result<Kubernetes> {
        let text = text.trim().trim_start_matches('v');
        let found = KUBERNETES.iter().find(|k| {
            text == format!("1.{}", k.minor) || text == format!("1.{}.{}", k.minor, k.patch)
        });
        match found {
            Some(k) => Ok(*k),
            None => bail!(
                "--kubernetes {text:?}: flock's test bed runs {} (the three newest minors)",
                KUBERNETES
                    .iter()
                    .map(|k| format!("1.{}", k.minor))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// The version of its staging modules (`k8s.io/api` …): `v0.37.2`.
    pub fn staging(self) -> String {
        format!("v0.{}.{}", self.minor, self.patch)
    }

    /// Its wrapper module's folder under `go/`: `kubernetes-1.37`.
    pub fn module_dir(self) -> String {
        format!("kubernetes-1.{}", self.minor)
    }
}

impl fmt::Display for Kubernetes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}.{}", self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_minor_or_an_exact_version() {
        assert_eq!(Kubernetes::parse("1.37").unwrap(), Kubernetes::newest());
        assert_eq!(Kubernetes::parse("v1.36.3").unwrap().minor, 36);
        let err = Kubernetes::parse("1.20").unwrap_err().to_string();
        assert!(
            err.contains("\"1.20\"") && err.contains("1.35, 1.36, 1.37"),
            "{err}"
        );
        assert!(Kubernetes::parse("1.37.1").is_err());
    }

    #[test]
    fn releases_are_three_consecutive_minors_oldest_first() {
        for pair in KUBERNETES.windows(2) {
            assert_eq!(pair[0].minor + 1, pair[1].minor);
        }
    }
}
