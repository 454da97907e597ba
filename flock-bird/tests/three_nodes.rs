//! Real BIRD in three network namespaces, configured by flock-bird:
//!
//! ```text
//!        A (AS64601) ---- B (AS64602)
//!          \              /
//!           \            /
//!            C (AS64603)
//! ```
//!
//! Every link is a veth with a 2001:db8:… /64; every session is IPv6 and
//! carries both families (IPv4 with extended next hop). The test checks that
//! sessions come up, that each node CIDR reaches the other nodes' kernels,
//! that an anycast address appears and disappears with `birdc configure`,
//! that an anycast address hosted on A and B gives C a two-path route, and
//! that learned routes stay in the kernel when BIRD shuts down.
#![cfg(feature = "root-tests")]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flock_bird::{BirdModel, NeighborSpec, Timers, parse_show_protocols, render};
use flock_testkit::Netns;

const DEADLINE: Duration = Duration::from_secs(20);

/// One node: a namespace, its BIRD and the model BIRD was last configured with.
struct Node {
    // Field order matters: BIRD is stopped, then the namespace removed, then
    // the directory holding its socket and configuration.
    bird: Option<Child>,
    ns: Netns,
    dir: tempfile::TempDir,
    model: BirdModel,
}

impl Node {
    fn new(tag: &str, router_id: &str, asn: u64, cidr6: &str, cidr4: &str) -> Node {
        let ns = Netns::new(tag);
        // What the agent does for its CIDRs: blackholes, so BIRD only announces.
        ns.ok(["ip", "-6", "route", "add", "blackhole", cidr6]);
        ns.ok(["ip", "-4", "route", "add", "blackhole", cidr4]);
        Node {
            bird: None,
            ns,
            dir: tempfile::tempdir().expect("tempdir"),
            model: BirdModel {
                router_id: router_id.into(),
                asn,
                cidrs: vec![cidr6.parse().unwrap(), cidr4.parse().unwrap()],
                graceful_restart: Some(30),
                ..Default::default()
            },
        }
    }

    fn peer(&mut self, address: &str, asn: u64) {
        self.model.neighbors.push(NeighborSpec {
            address: address.into(),
            asn,
            timers: Some(Timers::FAST),
            ..Default::default()
        });
    }

    /// The BIRD protocol names of the node's neighbors, sorted.
    fn neighbor_names(&self) -> Vec<String> {
        let valid = self.model.validate().expect("test model is valid");
        let mut names: Vec<String> = valid
            .neighbors()
            .iter()
            .map(|n| n.name().to_owned())
            .collect();
        names.sort_unstable();
        names
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("bird.conf")
    }

    fn ctl(&self) -> PathBuf {
        self.dir.path().join("bird.ctl")
    }

    fn write_conf(&self) {
        let conf = render(&self.model.validate().expect("test model is valid"));
        std::fs::write(self.conf(), conf).expect("write bird.conf");
    }

    fn start(&mut self) {
        self.write_conf();
        let log = std::fs::File::create(self.dir.path().join("bird.log")).expect("log file");
        let child = Command::new("ip")
            .args(["netns", "exec", self.ns.name(), "bird", "-f", "-c"])
            .arg(self.conf())
            .arg("-s")
            .arg(self.ctl())
            .arg("-P")
            .arg(self.dir.path().join("bird.pid"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("spawn bird");
        self.bird = Some(child);
    }

    fn birdc(&self, args: &[&str]) -> String {
        let out = Command::new("birdc")
            .arg("-s")
            .arg(self.ctl())
            .args(args)
            .output()
            .expect("run birdc");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Renders the current model and has BIRD reload it.
    fn reconfigure(&self) {
        self.write_conf();
        let out = self.birdc(&["configure"]);
        assert!(
            out.contains("Reconfigured") || out.contains("Reconfiguration in progress"),
            "birdc configure: {out}"
        );
    }

    fn route(&self, prefix: &str) -> String {
        let family = if prefix.contains(':') { "-6" } else { "-4" };
        self.ns.ok(["ip", family, "route", "show", prefix])
    }

    /// Waits until `check` holds for `ip route show prefix`, or fails
    /// showing what the node had.
    fn wait_route(&self, prefix: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let routes = self.route(prefix);
            if check(&routes) {
                return routes;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{}: {what} for {prefix} not seen within {DEADLINE:?}; kernel has {routes:?}\n{}",
                self.ns.name(),
                self.birdc(&["show", "route", "all"])
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_established(&self) {
        let start = Instant::now();
        loop {
            let protocols = self.birdc(&["show", "protocols"]);
            // real BIRD output through flock-bird's own parser
            let rows = parse_show_protocols(&protocols).unwrap_or_default();
            let mut established: Vec<String> = rows
                .iter()
                .filter(|r| r.bgp_state() == Some("Established"))
                .map(|r| r.name.clone())
                .collect();
            established.sort_unstable();
            if established == self.neighbor_names() {
                return;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{}: sessions not Established within {DEADLINE:?}:\n{protocols}\n{}",
                self.ns.name(),
                std::fs::read_to_string(self.dir.path().join("bird.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Node {
    /// Waits for BIRD to exit on its own (after `birdc down`).
    fn wait_exit(&mut self) {
        let child = self.bird.as_mut().expect("bird was started");
        let start = Instant::now();
        while child.try_wait().expect("wait for bird").is_none() {
            assert!(
                start.elapsed() < DEADLINE,
                "BIRD did not exit after `birdc down`"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.bird = None;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.bird.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A veth between two nodes with an IPv6 address on each end.
fn link(a: &Node, a_if: &str, a_addr: &str, b: &Node, b_if: &str, b_addr: &str) {
    a.ns.ok([
        "ip",
        "link",
        "add",
        a_if,
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.ns.name(),
    ]);
    for (node, ifname, addr) in [(a, a_if, a_addr), (b, b_if, b_addr)] {
        node.ns
            .ok(["ip", "-6", "addr", "add", addr, "dev", ifname, "nodad"]);
        node.ns.ok(["ip", "link", "set", ifname, "up"]);
    }
}

fn nexthops(routes: &str) -> usize {
    routes
        .lines()
        .filter(|l| l.trim_start().starts_with("nexthop"))
        .count()
}

#[test]
fn three_nodes_route_cidrs_and_anycast() {
    flock_testkit::require_root();
    let mut a = Node::new(
        "birda",
        "10.255.0.1",
        64601,
        "2001:db8:a::/64",
        "10.1.0.0/24",
    );
    let mut b = Node::new(
        "birdb",
        "10.255.0.2",
        64602,
        "2001:db8:b::/64",
        "10.2.0.0/24",
    );
    let mut c = Node::new(
        "birdc",
        "10.255.0.3",
        64603,
        "2001:db8:c::/64",
        "10.3.0.0/24",
    );
    link(
        &a,
        "to-b",
        "2001:db8:ab::1/64",
        &b,
        "to-a",
        "2001:db8:ab::2/64",
    );
    link(
        &a,
        "to-c",
        "2001:db8:ac::1/64",
        &c,
        "to-a",
        "2001:db8:ac::3/64",
    );
    link(
        &b,
        "to-c",
        "2001:db8:bc::2/64",
        &c,
        "to-b",
        "2001:db8:bc::3/64",
    );
    a.peer("2001:db8:ab::2", 64602);
    a.peer("2001:db8:ac::3", 64603);
    b.peer("2001:db8:ab::1", 64601);
    b.peer("2001:db8:bc::3", 64603);
    c.peer("2001:db8:ac::1", 64601);
    c.peer("2001:db8:bc::2", 64602);
    for node in [&mut a, &mut b, &mut c] {
        node.start();
    }
    for node in [&a, &b, &c] {
        node.wait_established();
    }

    // Each node CIDR, both families, in the other nodes' kernels.
    let installed = |r: &str| r.contains("proto bird");
    for (node, others) in [(&a, [&b, &c]), (&b, [&a, &c]), (&c, [&a, &b])] {
        for cidr in &node.model.cidrs {
            for other in others {
                other.wait_route(&cidr.to_string(), "BGP route", installed);
            }
        }
    }
    // IPv4 over the IPv6 session: an IPv6 next hop.
    // (B may hold the longer path through C for a moment before A's direct one wins.)
    b.wait_route("10.1.0.0/24", "IPv4 route via A's IPv6 address", |r| {
        r.contains("via inet6 2001:db8:ab::1")
    });
    // Our own CIDR never comes back from a peer: A keeps only its blackhole.
    let own = a.route("2001:db8:a::/64");
    assert!(
        own.contains("blackhole") && !own.contains("proto bird"),
        "{own}"
    );

    // An anycast address announced by A appears on B, then goes when removed.
    let anycast = "2001:db8:face::1";
    a.model.anycast.push(anycast.parse().unwrap());
    a.reconfigure();
    let r = b.wait_route(anycast, "route via A", |r| r.contains("via 2001:db8:ab::1"));
    assert!(installed(&r), "{r}");
    a.model.anycast.clear();
    a.reconfigure();
    b.wait_route(anycast, "withdrawal", |r| r.trim().is_empty());
    c.wait_route(anycast, "withdrawal", |r| r.trim().is_empty());
    // The sessions survived the reconfigurations.
    a.wait_established();

    // The same anycast address (IPv6 and IPv4) on A and B: C gets one route
    // with two next hops.
    for node in [&mut a, &mut b] {
        node.model.anycast.push(anycast.parse().unwrap());
        node.model.anycast.push("100.64.0.1".parse().unwrap());
        node.reconfigure();
    }
    let r6 = c.wait_route(anycast, "two-path route", |r| nexthops(r) == 2);
    assert!(
        r6.contains("via 2001:db8:ac::1") && r6.contains("via 2001:db8:bc::2"),
        "{r6}"
    );
    let r4 = c.wait_route("100.64.0.1", "two-path route", |r| nexthops(r) == 2);
    assert!(
        r4.contains("2001:db8:ac::1") && r4.contains("2001:db8:bc::2"),
        "{r4}"
    );
    // A and B do not take each other's copy: they host it themselves.
    for (node, other) in [(&a, "2001:db8:ab::2"), (&b, "2001:db8:ab::1")] {
        let r = node.route(anycast);
        assert!(!r.contains(other), "{}: {r}", node.ns.name());
    }

    // A clean BIRD shutdown on B leaves its learned routes in the kernel
    // (`persist`), so pod traffic keeps flowing while BIRD restarts.
    let down = b.birdc(&["down"]);
    assert!(down.contains("Shutdown requested"), "birdc down: {down}");
    b.wait_exit();
    let kept = b.route("2001:db8:a::/64");
    assert!(
        kept.contains("proto bird"),
        "route lost on shutdown: {kept:?}"
    );
}
