//! The site: the router, the control plane's namespace and the nodes' namespaces, wired by
//! veth pairs. Every address is IPv6 (documentation prefix `2001:db8:c0::/48`); the router
//! runs BIRD or FRR (AS 65000, `cargo xtask cluster up --router bird|frr`), peers with each
//! node's BIRD (the flock DaemonSet's sidecar) over IPv6 carrying both families, and installs
//! what it learns, equal-cost paths merged.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use super::proc::{self, Place};
use super::{
    CONTROL, CONTROL_ADDR, CONTROL_ADDR4, CONTROL_GW, JOINER, NODES, Node, ROUTER, ROUTER_ASN,
    ROUTER_LO4, ROUTER_LO6, RUN_DIR,
};
use crate::router::{self, Kind};
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
    ipv4_identity(&ns, node.router_id, node.addr)?;
    if !super::cni::Cni::current().speaks_bgp() {
        // No BGP to say where the node's pods are: the fabric's static routes, through the
        // link just made (they go with it when the node's namespace does, at a reboot).
        let router = Place::Net(ROUTER.to_owned());
        router.run(&["ip", "-6", "route", "replace", node.cidr6, "via", node.addr])?;
        router.run(&[
            "ip", "-4", "route", "replace", node.cidr4, "via", "inet6", node.addr,
        ])?;
    }
    Ok(())
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
    start_router()
}

/// Where the router's kind is recorded for the commands after `up`.
fn kind_file() -> std::path::PathBuf {
    Path::new(RUN_DIR).join("router-kind")
}

/// Records the router of the cluster that is coming up.
pub fn record_router(kind: Kind) -> Result<()> {
    std::fs::write(kind_file(), kind.as_str())
        .with_context(|| format!("write {}", kind_file().display()))
}

/// The router of the cluster that is up (BIRD when none was recorded).
pub fn router_kind() -> Kind {
    std::fs::read_to_string(kind_file())
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_default()
}

/// The router's directory: its configuration, sockets and pid files.
fn router_dir() -> std::path::PathBuf {
    Path::new(RUN_DIR).join("router")
}

/// The router: a session with each of `nodes`; `passwords`: each node's session password, if
/// it has one.
fn router_description<'a>(
    nodes: &[&'a Node],
    passwords: &'a BTreeMap<&str, String>,
    announce: Vec<ipnet::IpNet>,
    bfd_graceful: bool,
) -> router::Router<'a> {
    router::Router {
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
        announce,
        bfd_graceful,
    }
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

/// Writes the router's configuration for the nodes cabled now and checks it with the
/// router's own parser.
///
/// A peer CNI's nodes get what it can speak: kube-router's GoBGP has no BFD and reads no
/// password from flock's Secret (their sessions run without), ptp's nodes speak no BGP (the
/// router has no session with them; `peers` routes their CIDRs statically).
fn write_router_conf() -> Result<()> {
    let cni = super::cni::Cni::current();
    let nodes: Vec<&Node> = if cni.speaks_bgp() {
        cabled()
    } else {
        Vec::new()
    };
    let mut passwords = BTreeMap::new();
    if cni == super::cni::Cni::Flock {
        for n in &nodes {
            if let Some(p) = password(n)? {
                passwords.insert(n.name, p);
            }
        }
    }
    let mut router = router_description(
        &nodes,
        &passwords,
        announced()?,
        bfd_graceful_file().exists(),
    );
    if cni != super::cni::Cni::Flock {
        for peer in &mut router.peers {
            peer.bfd = false;
        }
    }
    router.write(router_kind(), &router_dir())
}

/// Present while the router's BFD sessions restart BGP gracefully ([`bfd_graceful`]).
fn bfd_graceful_file() -> std::path::PathBuf {
    router_dir().join("bfd-graceful")
}

/// Whether the router's BFD sessions restart BGP gracefully now.
pub fn is_bfd_graceful() -> bool {
    bfd_graceful_file().exists()
}

/// Makes a BFD session going down start a graceful restart at the router (`on`) or end the
/// BGP session (the test bed's default): docs/bgp.md, "Graceful restart and BFD".
pub fn bfd_graceful(on: bool) -> Result<()> {
    let was = bfd_graceful_file().exists();
    if on {
        std::fs::write(bfd_graceful_file(), "").context("mark BFD graceful")?;
    } else if was {
        std::fs::remove_file(bfd_graceful_file()).context("unmark BFD graceful")?;
    }
    let plain_again: Vec<&str> = if was && !on {
        cabled()
            .into_iter()
            .filter(|n| n.bfd)
            .map(|n| n.addr)
            .collect()
    } else {
        Vec::new()
    };
    reload_router(router::Dropped {
        bfd_graceful: &plain_again,
        ..router::Dropped::default()
    })
}

/// Where the routes the router announces besides its own are kept ([`announce`]).
fn announced_file() -> std::path::PathBuf {
    router_dir().join("announced")
}

/// The routes the router announces now besides its own addresses.
pub fn announced() -> Result<Vec<ipnet::IpNet>> {
    let text = match std::fs::read_to_string(announced_file()) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).context("read the router's announced routes"),
    };
    text.lines()
        .map(|l| {
            l.parse()
                .with_context(|| format!("{}: {l:?} is no prefix", announced_file().display()))
        })
        .collect()
}

/// Makes the router announce `routes` to every node besides its own addresses (what a rogue
/// or misconfigured router would send), in place of what it announced so; `&[]` stops.
pub fn announce(routes: &[ipnet::IpNet]) -> Result<()> {
    let before = announced()?;
    let text: String = routes.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(announced_file(), text).context("write the router's announced routes")?;
    let withdrawn: Vec<ipnet::IpNet> = before.into_iter().filter(|r| !routes.contains(r)).collect();
    reload_router(router::Dropped {
        announced: &withdrawn,
        ..router::Dropped::default()
    })
}

/// Starts the router's daemons (BIRD, or FRR's zebra, bfdd and bgpd) and waits until it
/// serves.
fn start_router() -> Result<()> {
    write_router_conf()?;
    let kind = router_kind();
    let place = Place::Net(ROUTER.to_owned());
    for daemon in kind.start_commands(&router_dir()) {
        let name = format!("router-{}", daemon.name);
        // a socket left by an earlier router would pass the wait below at once
        let _ = std::fs::remove_file(&daemon.ready);
        proc::spawn(&name, &place, &daemon.argv[0], &daemon.argv[1..], &[])?;
        proc::wait_daemon(
            &name,
            &format!("its socket {}", daemon.ready.display()),
            Duration::from_secs(10),
            || daemon.ready.exists(),
        )?;
    }
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
    reload_router(router::Dropped::default())
}

/// Writes the router's configuration and makes the running router take it; `dropped`: what it
/// had before besides peers (which this finds: the nodes no longer cabled) and has no more.
fn reload_router(dropped: router::Dropped<'_>) -> Result<()> {
    write_router_conf()?;
    let kind = router_kind();
    let cabled = cabled();
    let gone: Vec<&str> = super::every_node()
        .filter(|n| !cabled.iter().any(|c| c.name == n.name))
        .map(|n| n.addr)
        .collect();
    let dropped = router::Dropped {
        peers: &gone,
        ..dropped
    };
    let router = Place::Net(ROUTER.to_owned());
    for argv in kind.reload_commands(&router_dir(), ROUTER_ASN, &dropped) {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let out = router.run(&argv)?;
        if !kind.reload_ok(&out) {
            anyhow::bail!(
                "the router ({kind}) did not take its new configuration ({argv:?}): {out}"
            );
        }
    }
    Ok(())
}

/// What the router shows (`birdc …`, `vtysh -c …`); empty when it does not answer.
fn router_show(what: &str) -> String {
    let argv = router_kind().show_command(&router_dir(), what);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    Place::Net(ROUTER.to_owned()).run(&argv).unwrap_or_default()
}

/// A BGP session of the router, either router's.
pub use crate::router::Session as RouterSession;

/// The router's BGP sessions, each named by its node.
pub fn router_sessions() -> Vec<RouterSession> {
    let kind = router_kind();
    router::parse_sessions(kind, &router_show(kind.sessions_query()))
}

/// The `proto` of the routes the router learned over BGP (`ip route show proto …`).
pub fn router_proto() -> &'static str {
    router_kind().kernel_proto()
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

/// While it lives, what the router sends bound to a node's link (`SO_BINDTODEVICE`: `curl
/// --interface`, `ping -I`) to an address goes to that node's next hop for it, when the
/// router's route to the address is a kernel nexthop object (FRR's zebra installs them; BIRD
/// does not): the kernel picks among an object's paths by the flow's hash alone, whatever
/// device the socket is bound to. A rule (`oif`) sends such traffic to a table of its own
/// holding that one path.
pub struct Steer {
    family: &'static str,
    table: String,
    rule: Vec<String>,
}

impl Steer {
    /// Steers traffic bound to `n`'s link towards `addr` to `n`; `None` when the route needs
    /// no steering (not a nexthop object) or does not go to `n`.
    pub fn to(addr: &str, n: &Node) -> Result<Option<Steer>> {
        let (family, len) = if addr.contains(':') {
            ("-6", 128)
        } else {
            ("-4", 32)
        };
        let router = Place::Net(ROUTER.to_owned());
        // Every route covering the address (an aggregate, or the host route itself).
        let routes = router.run(&["ip", family, "route", "show", "match", addr])?;
        if !routes.contains(" nhid ") {
            return Ok(None);
        }
        let Some(via) = routes
            .lines()
            .find(|l| n.is_next_hop_in(l) && l.contains(" via "))
            .and_then(|l| l.split_once(" via "))
            .map(|(_, rest)| rest.split(" dev ").next().unwrap_or("").trim().to_owned())
        else {
            return Ok(None);
        };
        let index = super::every_node()
            .position(|m| m.name == n.name)
            .unwrap_or(0);
        let table = (2000 + index).to_string();
        let host = format!("{addr}/{len}");
        let mut add = vec!["ip", family, "route", "replace", &host, "via"];
        add.extend(via.split_whitespace());
        add.extend(["dev", n.router_if, "table", &table]);
        router.run(&add)?;
        let rule: Vec<String> = ["oif", n.router_if, "lookup", &table, "pref", "100"]
            .map(str::to_owned)
            .to_vec();
        // One rule per link: one left by an earlier run goes first.
        let mut del = vec!["ip", family, "rule", "del"];
        del.extend(rule.iter().map(String::as_str));
        let _ = router.run(&del);
        let mut argv = vec!["ip", family, "rule", "add"];
        argv.extend(rule.iter().map(String::as_str));
        router.run(&argv)?;
        Ok(Some(Steer {
            family,
            table,
            rule,
        }))
    }
}

impl Drop for Steer {
    fn drop(&mut self) {
        let router = Place::Net(ROUTER.to_owned());
        let mut argv = vec!["ip", self.family, "rule", "del"];
        argv.extend(self.rule.iter().map(String::as_str));
        let _ = router.run(&argv);
        let _ = router.run(&["ip", self.family, "route", "flush", "table", &self.table]);
    }
}

impl Node {
    /// Whether a line of the router's `ip route` goes to this node: over its link (BIRD
    /// installs the node's address as next hop, FRR its link-local address).
    pub fn is_next_hop_in(&self, line: &str) -> bool {
        let dev = format!("dev {}", self.router_if);
        line.split(&dev)
            .skip(1)
            .any(|after| after.is_empty() || after.starts_with(' '))
    }

    /// The node's network namespace.
    pub fn ns(&self) -> String {
        format!("{}{}", super::NS_PREFIX, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_goes_to_the_node_on_its_link() {
        let node1 = &NODES[0];
        // BIRD: the node's address; FRR: its link-local address; either way its link.
        assert!(node1.is_next_hop_in(
            "2001:db8:c1::/64 via 2001:db8:c0:1::2 dev to-node1 proto bird metric 32"
        ));
        assert!(
            node1.is_next_hop_in("\tnexthop via fe80::9485:e1ff:fe00:5e2a dev to-node1 weight 1")
        );
        assert!(node1.is_next_hop_in("10.201.1.0/24 nhid 16 via inet6 fe80::1 dev to-node1"));
        assert!(!node1.is_next_hop_in("2001:db8:c2::/64 via fe80::2 dev to-node2 metric 20"));
        assert!(!node1.is_next_hop_in("2001:db8:c2::/64 via fe80::2 dev to-node10 metric 20"));
    }

    #[test]
    fn router_peers_with_every_node_and_passes_documentation_addresses_only() {
        let passwords = BTreeMap::from([("node1", "s3cret".to_owned())]);
        let nodes: Vec<&Node> = crate::cluster::every_node().collect();
        let conf = router_description(&nodes, &passwords, Vec::new(), false).bird_conf();
        for node in &nodes {
            assert!(conf.contains(&format!("neighbor {} as {}", node.addr, node.asn)));
        }
        assert!(conf.contains("password \"s3cret\";") && conf.contains("bfd on;"));
        let frr = router_description(&nodes, &passwords, Vec::new(), false)
            .frr_conf()
            .integrated();
        assert!(
            frr.contains(" neighbor 2001:db8:c0:1::2 password s3cret\n"),
            "{frr}"
        );
        assert!(!frr.contains("fd00:") && !frr.contains("192.0.2."));
        assert!(!conf.contains("fd00:") && !conf.contains("192.0.2."));
    }
}
