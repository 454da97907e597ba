//! The CNIs and the policy engine flock is compared with (issue 29), in the same cluster: the
//! same two nodes, router, control plane, kube-proxy and workloads; only the pod network
//! differs (`cargo xtask cluster up --cni flock|kube-router|ptp [--policy
//! kube-network-policies]`).
//!
//! - **kube-router** (`--cni kube-router`): its DaemonSet, RBAC and CNI configuration as its
//!   project documents them (`daemonset/kubeadm-kuberouter.yaml` of its module), on an image
//!   of the binary built from its module. Its GoBGP speaker peers with the router as flock's
//!   BIRD does (each node's ASN, the router as its peer), announcing the node's pod CIDRs;
//!   pods sit on the `kube-bridge` bridge with `host-local` addresses from the node's CIDRs.
//! - **ptp** (`--cni ptp`): the reference plugins `ptp` and `host-local` with the node's CIDRs
//!   and no BGP: the router has a static route to each node's CIDRs, as a fabric without a
//!   routing protocol would.
//! - **kube-network-policies** (`--policy kube-network-policies`, over ptp): SIG Network's
//!   NetworkPolicy implementation, its DaemonSet and RBAC from its module's `install.yaml`.
//!
//! The peers run only here, inside the test bed's namespaces, never in what flock ships (the
//! module proxy serves kube-router only at a version with reported security flaws).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use super::cni::{Cni, Policy};
use super::deploy::edited;
use super::{NODES, Node, images, kubectl, kubectl_stdin, node};
use crate::components;

/// Installs the peer pod network `cni` (and `policy` over it) on the cluster that is up, and
/// waits until its pods run on every node.
pub fn install(cni: Cni, policy: Option<Policy>) -> Result<()> {
    match cni {
        Cni::Flock => bail!("flock is installed by deploy::install_flock"),
        Cni::KubeRouter => install_kube_router()?,
        Cni::Ptp => install_ptp()?,
    }
    if let Some(Policy::KubeNetworkPolicies) = policy {
        install_kube_network_policies()?;
    }
    Ok(())
}

/// The images of the peers of `cni` and `policy`, to import into each node before its
/// kubelet starts.
pub fn build_images(cni: Cni, policy: Option<Policy>) -> Result<Vec<PathBuf>> {
    let mut archives = Vec::new();
    if cni == Cni::KubeRouter {
        let built = components::kube_router().ensure_built()?;
        archives.push(images::build_kube_router_image(
            &built.tool("kube-router"),
            &kube_router_image(),
        )?);
    }
    if policy == Some(Policy::KubeNetworkPolicies) {
        let built = components::kube_network_policies().ensure_built()?;
        archives.push(images::build_static_image(
            &built.tool("netpol"),
            "bin/netpol",
            &kube_network_policies_image(),
        )?);
    }
    Ok(archives)
}

/// kube-router's image, under upstream's name.
pub fn kube_router_image() -> String {
    format!(
        "docker.io/cloudnativelabs/kube-router:v{}",
        crate::versions::KUBE_ROUTER
    )
}

/// kube-network-policies' image, under upstream's name.
pub fn kube_network_policies_image() -> String {
    format!(
        "registry.k8s.io/networking/kube-network-policies:v{}",
        crate::versions::KUBE_NETWORK_POLICIES
    )
}

/// kube-router's flags beside upstream's example's (`--run-router`, `--run-firewall`,
/// `--run-service-proxy=false`, `--bgp-graceful-restart`): both families; pods routed, not
/// tunnelled and not masqueraded; no full mesh or iBGP between the nodes, each peering with
/// the router (the node annotations of [`annotate_for_kube_router`]) and announcing its pod
/// CIDRs as their next hop (its IPv4 routes over the IPv6 session, as flock's BIRD does);
/// the router ID from the node's IPv6 address, as the nodes have no IPv4 one; the Service
/// ranges of the cluster (its policy controller checks them against the families); the
/// graceful-restart deferral and hold time of flock's sessions' order.
const KUBE_ROUTER_ARGS: &[&str] = &[
    "--enable-ipv4=true",
    "--enable-ipv6=true",
    "--enable-overlay=false",
    "--enable-pod-egress=false",
    "--enable-ibgp=false",
    "--nodes-full-mesh=false",
    "--advertise-pod-cidr=true",
    "--override-nexthop=true",
    "--router-id=generate",
    "--bgp-graceful-restart-deferral-time=30s",
    "--bgp-holdtime=6s",
    "--run-loadbalancer=false",
];

/// kube-router's manifest: upstream's `daemonset/kubeadm-kuberouter.yaml` with the image
/// built here (never pulled), the flags of [`KUBE_ROUTER_ARGS`] and the Service ranges, and
/// without the two host paths this machine lacks and kube-router does not use here
/// (`/lib/modules`: it loads no module, the kernel has them built in; the kubeconfig file:
/// the example mounts it but passes no `--kubeconfig`, kube-router talks to the apiserver as
/// its service account).
pub fn kube_router_manifest() -> Result<String> {
    let source = components::kube_router().source_dir()?;
    let path = source.join("daemonset/kubeadm-kuberouter.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let image = kube_router_image();
    let mut args = String::from("        - --bgp-graceful-restart=true\n");
    for a in KUBE_ROUTER_ARGS {
        args.push_str(&format!("        - {a}\n"));
    }
    for cidr in [super::SERVICE_CIDR, super::SERVICE_CIDR4] {
        args.push_str(&format!("        - --service-cluster-ip-range={cidr}\n"));
    }
    edited(
        &path,
        &text,
        &[
            (
                "image: docker.io/cloudnativelabs/kube-router\n        imagePullPolicy: Always"
                    .into(),
                format!("image: {image}\n        imagePullPolicy: Never"),
            ),
            ("        - --bgp-graceful-restart=true\n".into(), args),
            (
                "        - name: lib-modules\n          mountPath: /lib/modules\n          readOnly: true\n"
                    .into(),
                String::new(),
            ),
            (
                "        - name: kubeconfig\n          mountPath: /var/lib/kube-router/kubeconfig\n          readOnly: true\n"
                    .into(),
                String::new(),
            ),
            (
                "      - name: lib-modules\n        hostPath:\n          path: /lib/modules\n"
                    .into(),
                String::new(),
            ),
            (
                "      - name: kubeconfig\n        hostPath:\n          path: /var/lib/kube-router/kubeconfig\n"
                    .into(),
                String::new(),
            ),
        ],
    )
}

/// What kube-router reads from each Node at start: its ASN and its BGP peer (the router),
/// and its pod CIDRs (`pod-cidr`, which it requires, and `pod-cidrs` with both families),
/// the same CIDRs flock's pool controller gives the node.
fn annotate_for_kube_router(n: &Node) -> Result<()> {
    kubectl(&[
        "annotate",
        "--overwrite",
        "node",
        n.name,
        &format!("kube-router.io/node.asn={}", n.asn),
        &format!("kube-router.io/peer.ips={}", n.gateway),
        &format!("kube-router.io/peer.asns={}", super::ROUTER_ASN),
        &format!("kube-router.io/pod-cidr={}", n.cidr6),
        &format!("kube-router.io/pod-cidrs={},{}", n.cidr6, n.cidr4),
    ])?;
    Ok(())
}

fn install_kube_router() -> Result<()> {
    for n in &NODES {
        annotate_for_kube_router(n)?;
    }
    kubectl_stdin(&["apply", "-f", "-"], &kube_router_manifest()?)?;
    kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        "ds/kube-router",
        "--timeout=180s",
    ])
    .context("wait for kube-router's pods to be ready on every node")?;
    Ok(())
}

/// The conflist of ptp on `n`: `ptp` with `host-local` addresses from the node's CIDRs (the
/// ones flock's pool controller gives it), a default route per family, then `portmap`.
pub fn ptp_conflist(n: &Node) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "ptp",
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": false,
                "mtu": 1500,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": n.cidr6 }], [{ "subnet": n.cidr4 }]],
                    "routes": [{ "dst": "::/0" }, { "dst": "0.0.0.0/0" }],
                },
            },
            { "type": "portmap", "capabilities": { "portMappings": true } },
        ],
    })
    .to_string()
}

/// Writes each node's ptp conflist (the router's static routes to the nodes' CIDRs came with
/// their links: `site::node_net`).
fn install_ptp() -> Result<()> {
    for n in &NODES {
        let dir = node::host_path(n, "/etc/cni/net.d").context("the nodes' CNI folder")?;
        let conf = dir.join("10-ptp.conflist");
        std::fs::write(&conf, ptp_conflist(n))
            .with_context(|| format!("write {}", conf.display()))?;
    }
    // Nodes turn Ready once their runtime finds a network configuration.
    kubectl(&[
        "wait",
        "--for=condition=Ready",
        "node",
        "--all",
        "--timeout=120s",
    ])
    .context("wait for the nodes to be Ready on ptp")?;
    Ok(())
}

/// kube-network-policies' manifest: upstream's `install.yaml` with the image built here
/// (never pulled).
pub fn kube_network_policies_manifest() -> Result<String> {
    let source = components::kube_network_policies().source_dir()?;
    let path = source.join("install.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let upstream_image = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("image: "))
        .with_context(|| format!("{} names no image", path.display()))?
        .to_owned();
    edited(
        &path,
        &text,
        &[(
            format!("image: {upstream_image}"),
            format!(
                "image: {}\n        imagePullPolicy: Never",
                kube_network_policies_image()
            ),
        )],
    )
}

fn install_kube_network_policies() -> Result<()> {
    kubectl_stdin(&["apply", "-f", "-"], &kube_network_policies_manifest()?)?;
    kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        "ds/kube-network-policies",
        "--timeout=180s",
    ])
    .context("wait for kube-network-policies' pods to be ready on every node")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn ptp_gives_pods_the_nodes_cidrs_and_default_routes() {
        let conf: serde_json::Value = serde_json::from_str(&ptp_conflist(&NODES[1])).unwrap();
        let ipam = &conf["plugins"][0]["ipam"];
        assert_eq!(ipam["ranges"][0][0]["subnet"], NODES[1].cidr6);
        assert_eq!(ipam["ranges"][1][0]["subnet"], NODES[1].cidr4);
        assert_eq!(conf["plugins"][0]["ipMasq"], false);
        assert_eq!(conf["plugins"][1]["type"], "portmap");
    }

    /// Reads upstream's manifests from the module cache (`go mod download` when missing).
    #[test]
    fn the_peers_own_manifests_take_the_test_beds_edits() {
        let kr = kube_router_manifest().unwrap();
        assert!(
            kr.contains(&format!("image: {}\n", kube_router_image())),
            "{kr}"
        );
        assert!(!kr.contains("imagePullPolicy: Always"), "{kr}");
        assert!(
            !kr.contains("/lib/modules") && !kr.contains("kube-router/kubeconfig"),
            "{kr}"
        );
        for flag in KUBE_ROUTER_ARGS {
            assert!(kr.contains(&format!("        - {flag}\n")), "{flag}");
        }
        assert!(
            kr.contains("--service-cluster-ip-range=2001:db8:c5::/108"),
            "{kr}"
        );
        // upstream's own parts stay: its flags, CNI configuration and RBAC
        for kept in [
            "--run-firewall=true",
            "\"bridge\":\"kube-bridge\"",
            "kind: ClusterRole",
        ] {
            assert!(kr.contains(kept), "{kept}");
        }
        let knp = kube_network_policies_manifest().unwrap();
        assert!(
            knp.contains(&format!(
                "image: {}\n        imagePullPolicy: Never",
                kube_network_policies_image()
            )),
            "{knp}"
        );
        assert!(knp.contains("- /bin/netpol"), "{knp}");
    }

    #[test]
    fn an_edit_that_finds_nothing_is_refused() {
        let err = edited(
            Path::new("x.yaml"),
            "a: 1\n",
            &[("b: 2".into(), String::new())],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("x.yaml has no \"b: 2\""), "{err}");
        assert_eq!(
            edited(
                Path::new("x.yaml"),
                "a: 1\n",
                &[("a: 1".into(), "a: 2".into())]
            )
            .unwrap(),
            "a: 2\n"
        );
    }
}
