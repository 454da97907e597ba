//! Prints the nftables ruleset of a node running one web pod that only clients of its
//! namespace may reach on its `http` port, and that may send nothing but DNS.
//!
//! `cargo run -p flock-policy --example render_policy > /tmp/policy.nft`, then, as root, in a
//! namespace of your own: `unshare -n nft -c -f /tmp/policy.nft && echo accepted`

use flock_policy::{
    LabelSelector, NamedPort, Namespace, Peer, Pod, Policy, PolicyTypes, PortSpec, Protocol, Rule,
    build,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let web = Pod {
        namespace: "shop".into(),
        name: "web-0".into(),
        labels: std::sync::Arc::new([("app".into(), "web".into())].into()),
        addresses: vec!["2001:db8:0:1::10".parse()?, "10.244.1.10".parse()?],
        host_if: Some("flock1a2b3c4d".into()),
        ports: vec![NamedPort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 8080,
        }],
    };
    let client = Pod {
        name: "client-0".into(),
        labels: std::sync::Arc::new([("role".into(), "client".into())].into()),
        addresses: vec!["2001:db8:0:2::20".parse()?, "10.244.2.20".parse()?],
        host_if: None,
        ports: vec![],
        ..web.clone()
    };
    let dns = Pod {
        namespace: "kube-system".into(),
        name: "coredns-0".into(),
        labels: std::sync::Arc::new([("k8s-app".into(), "kube-dns".into())].into()),
        addresses: vec!["2001:db8:0:3::53".parse()?, "10.244.3.53".parse()?],
        host_if: None,
        ports: vec![],
    };
    let policy = Policy {
        namespace: "shop".into(),
        name: "web".into(),
        pod_selector: LabelSelector::labels([("app", "web")]),
        policy_types: Some(PolicyTypes {
            ingress: true,
            egress: true,
        }),
        ingress: vec![Rule {
            peers: vec![Peer::pods(LabelSelector::labels([("role", "client")]))],
            ports: vec![PortSpec::name(Protocol::Tcp, "http")],
        }],
        egress: vec![Rule {
            peers: vec![Peer::Pods {
                namespace_selector: Some(LabelSelector::labels([(
                    "kubernetes.io/metadata.name",
                    "kube-system",
                )])),
                pod_selector: Some(LabelSelector::labels([("k8s-app", "kube-dns")])),
            }],
            ports: vec![
                PortSpec::number(Protocol::Udp, 53),
                PortSpec::number(Protocol::Tcp, 53),
            ],
        }],
    };
    let namespaces = [Namespace {
        name: "shop".into(),
        ..Default::default()
    }];
    print!(
        "{}",
        build(&[policy], &namespaces, &[web, client, dns])?.render()
    );
    Ok(())
}
