//! The site: the router, the control plane's namespace and the nodes' namespaces, wired by
//! veth pairs. Every address is IPv6 (documentation prefix `2001:db8:c0::/48`); the router
//! runs BIRD (AS 65000), peers with each node's BIRD (the flock DaemonSet's sidecar) over
//! IPv6 carrying both families, and installs what it learns, equal-cost paths merged.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use super::proc::{self, Place};
use super::{
    CONTROL, CONTROL_ADDR, CONTROL_ADDR4, CONTROL_GW, JOINER, NODES, Node, ROUTER, ROUTER_ASN,
    ROUTER_LO4, ROUTER_LO6, RUN_DIR,
};
use crate::sys;

fn add_ns(ns: &str) -> Result<()> {
    sys::output(std::process::Command::new("ip").args(["netns", "add", ns]))?;
    let here = Place::Net(ns.to_owned());
    // No DAD anywhere: an address is usable at once (and is never left tentative).
    here.run(&[
        "sysctl",
        "-q",
        "-w",
        "net.ipv6.conf.all.accept_dad=0",
        "net.ipv6.conf.default.accept_dad=0",
        "net.ipv4.ip_forward=1",
        "net.ipv6.conf.all.forwarding=1",
    ])?;
    here.run(&["ip", "link", "set", "lo", "up"])?;
    Ok(())
}

/// A veth from the router (`router_if`, `router_addr`/64) to `ns` (`uplink`, `addr`/64).
fn link_to_router(ns: &str, router_if: &str, router_addr: &str, addr: &str) -> Result<()> {
    let router = Place::Net(ROUTER.to_owned());
    let there = Place::Net(ns.to_owned());
    // Named at creation: a rename would take the link down and drop its IPv6 addresses.
    router.run(&[
        "ip", "link", "add", router_if, "type", "veth", "peer", "name", "uplink", "netns", ns,
    ])?;
    router.run(&["ip", "link", "set", router_if, "up"])?;
    router.run(&[
        "ip",
        "addr",
        "add",
        &format!("{router_addr}/64"),
        "dev",
        router_if,
        "nodad",
    ])?;
    there.run(&["ip", "link", "set", "uplink", "up"])?;
    there.run(&[
        "ip",
        "addr",
        "add",
        &format!("{addr}/64"),
        "dev",
        "uplink",
        "nodad",
    ])?;
    // Everything beyond the link goes through the router; IPv4 too, over the IPv6 next hop.
    there.run(&["ip", "-6", "route", "add", "default", "via", router_addr])?;
    there.run(&[
        "ip",
        "-4",
        "route",
        "add",
        "default",
        "via",
        "inet6",
        router_addr,
    ])?;
    Ok(())
}

/// Gives the IPv6-linked namespace `ns` an IPv4 address on its loopback, `addr`, and has the
/// router route it over the link (`via` is the namespace's IPv6 address there): replies to
/// what `ns` sends from it come back.
fn ipv4_identity(ns: &str, addr: &str, via: &str) -> Result<()> {
    Place::Net(ns.to_owned()).run(&["ip", "addr", "add", &format!("{addr}/32"), "dev", "lo"])?;
    Place::Net(ROUTER.to_owned()).run(&[
        "ip",
        "route",
        "add",
        &format!("{addr}/32"),
        "via",
        "inet6",
        via,
    ])?;
    Ok(())
}

/// The node's network namespace, as the machine boots it: its link to the router and its
/// addresses. Also how a node is rebooted: its namespace deleted, then made again.
pub fn node_net(node: &Node) -> Result<()> {
    let ns = node.ns();
    add_ns(&ns)?;
    link_to_router(&ns, node.router_if, node.gateway, node.addr)?;
    // The node's IPv4 identity (its BGP router ID): a source address for what the node
    // itself sends to IPv4 pods (the kubelet's probes).
    ipv4_identity(&ns, node.router_id, node.addr)
}

/// Creates every namespace and link and starts the router's BIRD.
pub fn build() -> Result<()> {
    add_ns(ROUTER)?;
    let router = Place::Net(ROUTER.to_owned());
    router.run(&[
        "ip",
        "addr",
        "add",
        &format!("{ROUTER_LO6}/128"),
        "dev",
        "lo",
        "nodad",
    ])?;
    router.run(&[
        "ip",
        "addr",
        "add",
        &format!("{ROUTER_LO4}/32"),
        "dev",
        "lo",
    ])?;
    add_ns(CONTROL)?;
    link_to_router(CONTROL, "to-control", CONTROL_GW, CONTROL_ADDR)?;
    // The apiserver dials a pod at its primary IP when it proxies to it
    // (`…/pods/NAME:PORT/proxy`, the e2e suite): IPv4 for a pod whose primary IP is IPv4.
    ipv4_identity(CONTROL, CONTROL_ADDR4, CONTROL_ADDR)?;
    for node in &NODES {
        node_net(node)?;
    }
    start_router_bird()
}

/// The router's BIRD configuration: a session with each of `nodes`; `passwords`: each node's
/// session password, if it has one.
fn router_bird_conf(nodes: &[&Node], passwords: &BTreeMap<&str, String>) -> String {
    crate::router::Router {
        of: "the cluster",
        router_id: ROUTER_LO4,
        asn: ROUTER_ASN,
        own6: ROUTER_LO6,
        own4: ROUTER_LO4,
        peers: nodes
            .iter()
            .map(|node| crate::router::Peer {
                name: node.name,
                addr: node.addr,
                asn: node.asn,
                interface: None,
                password: passwords.get(node.name).map(String::as_str),
                bfd: node.bfd,
            })
            .collect(),
    }
    .bird_conf()
}

/// The TCP MD5 password of `node`'s session, made once per cluster (kept under the
/// router's directory), or `None` when its session has none.
pub fn password(node: &Node) -> Result<Option<String>> {
    use std::io::Read as _;
    if !node.password {
        return Ok(None);
    }
    let path = Path::new(RUN_DIR)
        .join("router")
        .join(format!("password-{}", node.name));
    if let Ok(p) = std::fs::read_to_string(&path) {
        return Ok(Some(p));
    }
    let mut bytes = [0u8; 12];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("read /dev/urandom")?;
    let p: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::create_dir_all(Path::new(RUN_DIR).join("router"))
        .context("create the router's directory")?;
    std::fs::write(&path, &p).with_context(|| format!("write {}", path.display()))?;
    Ok(Some(p))
}

/// The nodes cabled to the router: the cluster's, and the joiner while it is in.
fn cabled() -> Vec<&'static Node> {
    let mut nodes: Vec<&'static Node> = NODES.iter().collect();
    if joined_marker().exists() {
        nodes.push(&JOINER);
    }
    nodes
}

/// Present while [`JOINER`] is cabled to the router.
fn joined_marker() -> std::path::PathBuf {
    Path::new(RUN_DIR)
        .join("router")
        .join(format!("joined-{}", JOINER.name))
}

/// Writes the router's configuration for the nodes cabled now and checks it with `bird -p`.
fn write_router_conf() -> Result<String> {
    let dir = Path::new(RUN_DIR).join("router");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let conf = dir.join("bird.conf");
    let nodes = cabled();
    let mut passwords = BTreeMap::new();
    for n in &nodes {
        if let Some(p) = password(n)? {
            passwords.insert(n.name, p);
        }
    }
    std::fs::write(&conf, router_bird_conf(&nodes, &passwords))
        .with_context(|| format!("write {}", conf.display()))?;
    let conf_s = conf.to_string_lossy().into_owned();
    Place::Net(ROUTER.to_owned())
        .run(&["bird", "-p", "-c", &conf_s])
        .with_context(|| format!("check {conf_s}"))?;
    Ok(conf_s)
}

fn start_router_bird() -> Result<()> {
    let conf = write_router_conf()?;
    let router = Place::Net(ROUTER.to_owned());
    let ctl = router_ctl();
    proc::spawn(
        "router-bird",
        &router,
        "bird",
        &["-f", "-c", &conf, "-s", &ctl],
        &[],
    )?;
    proc::wait_daemon(
        "router-bird",
        "the router's BIRD control socket",
        Duration::from_secs(10),
        || Path::new(&ctl).exists(),
    )?;
    Ok(())
}

/// Cables [`JOINER`] to the router, as a new server in a new rack: its network namespace and
/// link, and a session for it in the router's BIRD (`birdc configure`).
pub fn join() -> Result<()> {
    node_net(&JOINER)?;
    std::fs::write(joined_marker(), "").context("mark the joiner as cabled")?;
    reconfigure_router()
}

/// Takes [`JOINER`]'s session out of the router's BIRD and deletes its link (the node is
/// powered off by then; its namespace is gone, and the router's end of the link with it).
pub fn unplug() -> Result<()> {
    if joined_marker().exists() {
        std::fs::remove_file(joined_marker()).context("unmark the joiner")?;
    }
    reconfigure_router()?;
    // The route to its IPv4 identity went with the link; the namespace may still be there.
    if Path::new("/run/netns").join(JOINER.ns()).exists() {
        sys::output(std::process::Command::new("ip").args(["netns", "del", &JOINER.ns()]))?;
    }
    Ok(())
}

fn reconfigure_router() -> Result<()> {
    write_router_conf()?;
    let out = Place::Net(ROUTER.to_owned()).run(&["birdc", "-s", &router_ctl(), "configure"])?;
    if !out.contains("Reconfigured") && !out.contains("Reconfiguration in progress") {
        anyhow::bail!("the router's BIRD did not take its new configuration: {out}");
    }
    Ok(())
}

/// The router's BIRD control socket.
pub fn router_ctl() -> String {
    format!("{RUN_DIR}/router/bird.ctl")
}

/// A BGP session of the router, as `birdc show protocols` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterSession {
    /// The protocol's name: the node's.
    pub name: String,
    /// BIRD's protocol state (`up`, `start`).
    pub state: String,
    /// When it entered that state (`22:08:07.282`): a session that went down and up again
    /// in between shows a later time.
    pub since: String,
    /// The rest: the BGP state (`Established`, `Active`) and why.
    pub info: String,
}

/// `birdc show protocols` on the router: each BGP session.
pub fn router_sessions() -> Vec<RouterSession> {
    Place::Net(ROUTER.to_owned())
        .run(&["birdc", "-s", &router_ctl(), "show", "protocols"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 5 && f[1] == "BGP").then(|| RouterSession {
                name: f[0].to_owned(),
                state: f[3].to_owned(),
                since: f[4].to_owned(),
                info: f[5..].join(" "),
            })
        })
        .collect()
}

/// The number of next hops of the router's kernel route to `prefix` (0 without a route).
pub fn router_paths(prefix: &str) -> usize {
    let family = if prefix.contains(':') { "-6" } else { "-4" };
    Place::Net(ROUTER.to_owned())
        .run(&["ip", family, "route", "show", prefix])
        .map(|out| {
            let hops = out.lines().filter(|l| l.contains("nexthop")).count();
            if hops == 0 && out.contains(" via ") {
                1
            } else {
                hops
            }
        })
        .unwrap_or(0)
}

impl Node {
    /// The node's network namespace.
    pub fn ns(&self) -> String {
        format!("{}{}", super::NS_PREFIX, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_peers_with_every_node_and_passes_documentation_addresses_only() {
        let passwords = BTreeMap::from([("node1", "s3cret".to_owned())]);
        let nodes: Vec<&Node> = crate::cluster::every_node().collect();
        let conf = router_bird_conf(&nodes, &passwords);
        for node in &nodes {
            assert!(conf.contains(&format!("neighbor {} as {}", node.addr, node.asn)));
        }
        assert!(conf.contains("password \"s3cret\";") && conf.contains("bfd on;"));
        assert!(!conf.contains("fd00:") && !conf.contains("192.0.2."));
    }
}
