//! Sets up one dual-stack pod in a throw-away node namespace, pings its
//! gateway, checks it, tears it down. Root only; touches nothing outside the
//! two namespaces it creates.
//!
//! `sudo cargo run -p flock-netns --example pod`

use flock_netns::{NodeNs, PodSpec, check, host_ifname, setup, teardown};
use flock_testkit::Netns;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let node_ns = Netns::new("exnode");
    let pod_ns = Netns::new("expod");
    let node = NodeNs::at(node_ns.path());
    let spec = PodSpec {
        container_id: "example-container".into(),
        // the agent picks the first attempt no other attachment owns, and records it
        host_if: host_ifname("example-container", "eth0", 0),
        netns: pod_ns.path(),
        if_name: "eth0".into(),
        mtu: 1500,
        addresses: vec!["2001:db8:e::1/128".parse()?, "10.244.0.7/32".parse()?],
        anycast: vec![],
        default_route: true,
        routes: vec![],
    };
    let out = setup(&node, &spec).await?;
    println!(
        "{} ({}) <-> {} ({})",
        out.host_if, out.host_mac, out.pod_if, out.pod_mac
    );
    println!("ping fe80::1%eth0: {}", pod_ns.pings("fe80::1%eth0"));
    println!("ping 169.254.1.1:  {}", pod_ns.pings("169.254.1.1"));
    println!("check: {:?}", check(&node, &spec).await?);
    teardown(&node, &spec).await?;
    Ok(())
}
