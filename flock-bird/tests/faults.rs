//! Routing that survives restarts and failures, measured with real BIRD in
//! network namespaces, every node configured by flock-bird:
//!
//! ```text
//!                  router (AS65000, BIRD, hand-written configuration)
//!           to-n1 fe80::1 |                         | to-n2 fe80::1
//!                    [bridge br1]  switch ns  [bridge br2]
//!           eth0 fe80::2  |                         | eth0 fe80::2
//!   node1 (AS64601)                                   node2 (AS64602)
//!   neighbor fe80::1 on eth0                          any link-local peer on eth0
//!   graceful restart on (120 s), BFD 100 ms x 3       graceful restart off, no BFD
//!   pod 2001:db8:e1::10, 10.201.1.10                  pod 2001:db8:e2::10, 10.201.2.10
//! ```
//!
//! The links have link-local addresses only: every session is unnumbered and
//! carries IPv6 and IPv4 (extended next hop, IPv4 routes via an IPv6 link-local
//! next hop). A bridge sits in each link so that a node's link going down is not
//! seen by the router's interface, as with a switch in between. The two nodes
//! differ only in graceful restart and BFD, so one run measures each feature
//! against its absence:
//!
//! - BIRD stopped (`birdc graceful restart`, a planned restart, or SIGKILL, a
//!   crash) and restarted 1 s later with `-R`, while the other node's pod pings
//!   the node's pod every 20 ms: lost pings with graceful restart (goal 0) and
//!   without; and with graceful restart once more against a router in `bfd on`
//!   mode, where BFD expiring ends the graceful restart;
//! - a TCP MD5 password: the same on both sides brings the session up, a wrong
//!   one keeps it down;
//! - graceful shutdown (a drain): the node's routes reach the router with the
//!   GRACEFUL_SHUTDOWN community;
//! - the node's link cut (`ip link set eth0 down` inside the node): time until
//!   the router's kernel loses the node's CIDR, with BFD 100 ms x 3 (goal
//!   < 1 s) and without (hold time 3 s).
//!
//! The figures are printed (`--no-capture` shows them; `FLOCK_FAULTS_REPORT=FILE`
//! writes them to a file) and asserted.
#![cfg(feature = "root-tests")]

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flock_bird::{
    BfdTiming, BirdModel, GracefulRestart, NeighborSpec, ProtocolRow, Timers, parse_show_protocols,
    render,
};
use flock_testkit::Netns;

const DEADLINE: Duration = Duration::from_secs(20);
/// Hold 3 s, keepalive 1 s: a fast fabric, so the test without BFD stays short.
const TIMERS: Timers = Timers {
    hold: 3,
    keepalive: 1,
    connect_retry: 1,
    connect_delay: 1,
};

/// A BIRD daemon in a namespace, its files in a private directory.
struct Bird {
    // Field order matters: BIRD is stopped before its directory goes.
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Bird {
    fn new() -> Bird {
        Bird {
            child: None,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("bird.conf")
    }

    fn ctl(&self) -> PathBuf {
        self.dir.path().join("bird.ctl")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bird.log")).unwrap_or_default()
    }

    /// Starts BIRD on the configuration already written; `recovery` adds `-R`
    /// (graceful restart recovery: routes of the previous run kept in the kernel
    /// until the peers have sent theirs again).
    fn start(&mut self, ns: &Netns, recovery: bool) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("bird.log"))
            .expect("log file");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns.name(), "bird", "-f", "-c"])
            .arg(self.conf())
            .arg("-s")
            .arg(self.ctl())
            .arg("-P")
            .arg(self.dir.path().join("bird.pid"));
        if recovery {
            cmd.arg("-R");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("spawn bird");
        self.child = Some(child);
    }

    /// SIGKILL: no goodbye to the peers, the kernel closes the TCP sessions.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `birdc graceful restart`: BIRD stops without telling its peers (no
    /// notification, BFD sessions go AdminDown), leaves its kernel routes, and
    /// exits; what the agent's container does on SIGTERM before a restart.
    fn graceful_stop(&mut self) {
        let out = self.birdc(&["graceful", "restart"]);
        assert!(
            out.contains("Graceful restart"),
            "birdc graceful restart: {out}"
        );
        let child = self.child.as_mut().expect("bird was started");
        let start = Instant::now();
        while child.try_wait().expect("wait for bird").is_none() {
            assert!(start.elapsed() < DEADLINE, "BIRD did not exit: {out}");
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child = None;
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

    fn protocols(&self) -> Vec<ProtocolRow> {
        parse_show_protocols(&self.birdc(&["show", "protocols"])).unwrap_or_default()
    }

    /// Waits until some BGP session is Established.
    fn wait_established(&self, what: &str) {
        let start = Instant::now();
        while !self
            .protocols()
            .iter()
            .any(|r| r.bgp_state() == Some("Established"))
        {
            assert!(
                start.elapsed() < DEADLINE,
                "{what}: no session Established within {DEADLINE:?}:\n{}\n{}",
                self.birdc(&["show", "protocols"]),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Bird {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One node: its namespace, one pod (a namespace with a veth, laid out as
/// flock lays out a pod) and BIRD on flock-bird's configuration.
struct Node {
    bird: Bird,
    pod: Netns,
    ns: Netns,
    model: BirdModel,
    cidr6: &'static str,
    cidr4: &'static str,
    pod6: &'static str,
    pod4: &'static str,
}

impl Node {
    fn new(tag: &str, asn: u64, net: u8, uplink: NeighborSpec) -> Node {
        let ns = Netns::new(tag);
        let pod = Netns::new(&format!("{tag}pod"));
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        let (cidr6, cidr4) = (
            leak(format!("2001:db8:e{net}::/64")),
            leak(format!("10.201.{net}.0/24")),
        );
        let (pod6, pod4) = (
            leak(format!("2001:db8:e{net}::10")),
            leak(format!("10.201.{net}.10")),
        );
        for (family, key) in [("ipv6", "conf.all.forwarding"), ("ipv4", "ip_forward")] {
            ns.ok(["sysctl", "-qw", &format!("net.{family}.{key}=1")]);
        }
        // What the agent does: blackholes for the CIDRs, a veth and host routes per pod.
        ns.ok(["ip", "-6", "route", "add", "blackhole", cidr6]);
        ns.ok(["ip", "-4", "route", "add", "blackhole", cidr4]);
        ns.ok([
            "ip",
            "link",
            "add",
            "pod0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ]);
        ns.ok(["ip", "link", "set", "pod0", "addrgenmode", "none"]);
        ns.ok(["ip", "addr", "add", "fe80::1/64", "dev", "pod0", "nodad"]);
        ns.ok(["sysctl", "-qw", "net.ipv4.conf.pod0.proxy_arp=1"]);
        ns.ok(["ip", "link", "set", "pod0", "up"]);
        ns.ok([
            "ip",
            "-6",
            "route",
            "add",
            &format!("{pod6}/128"),
            "dev",
            "pod0",
        ]);
        ns.ok([
            "ip",
            "-4",
            "route",
            "add",
            &format!("{pod4}/32"),
            "dev",
            "pod0",
        ]);
        pod.ok(["ip", "link", "set", "eth0", "up"]);
        pod.ok([
            "ip",
            "addr",
            "add",
            &format!("{pod6}/128"),
            "dev",
            "eth0",
            "nodad",
        ]);
        pod.ok(["ip", "addr", "add", &format!("{pod4}/32"), "dev", "eth0"]);
        pod.ok([
            "ip", "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
        ]);
        pod.ok([
            "ip",
            "-4",
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ]);
        pod.ok([
            "ip",
            "-4",
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ]);
        let model = BirdModel {
            router_id: format!("10.255.0.{net}"),
            asn,
            neighbors: vec![uplink],
            graceful_restart: Some(120),
            cidrs: vec![cidr6.parse().unwrap(), cidr4.parse().unwrap()],
            ..Default::default()
        };
        Node {
            bird: Bird::new(),
            pod,
            ns,
            model,
            cidr6,
            cidr4,
            pod6,
            pod4,
        }
    }

    fn write_conf(&self) {
        let conf = render(&self.model.validate().expect("test model is valid"));
        std::fs::write(self.bird.conf(), conf).expect("write bird.conf");
    }

    fn start(&mut self, recovery: bool) {
        self.write_conf();
        self.bird.start(&self.ns, recovery);
    }
}

/// A link with link-local addresses only, through a bridge in the switch
/// namespace: `fe80::1` on the router's end, `fe80::2` on the node's `eth0`.
/// The bridge keeps the router's carrier up when the node's link goes down, as
/// a switch between them would: only BFD or the hold time can tell.
fn link(switch: &Netns, router: &Netns, router_if: &str, node: &Netns, bridge: &str) {
    switch.ok(["ip", "link", "add", bridge, "type", "bridge"]);
    switch.ok(["ip", "link", "set", bridge, "up"]);
    for (ns, ifname, port) in [(router, router_if, "r"), (node, "eth0", "n")] {
        let port = format!("{bridge}{port}");
        switch.ok([
            "ip",
            "link",
            "add",
            &port,
            "type",
            "veth",
            "peer",
            "name",
            ifname,
            "netns",
            ns.name(),
        ]);
        switch.ok(["ip", "link", "set", &port, "master", bridge]);
        switch.ok(["ip", "link", "set", &port, "up"]);
    }
    for (ns, ifname, addr) in [
        (router, router_if, "fe80::1/64"),
        (node, "eth0", "fe80::2/64"),
    ] {
        ns.ok(["ip", "link", "set", ifname, "addrgenmode", "none"]);
        ns.ok(["ip", "addr", "add", addr, "dev", ifname, "nodad"]);
        ns.ok(["ip", "link", "set", ifname, "up"]);
    }
    // The node's own IPv4 default route (a real node has one): proxy ARP answers
    // a pod's 169.254.1.1 only when the node routes that address elsewhere.
    node.ok([
        "ip", "-4", "route", "add", "default", "via", "inet6", "fe80::1", "dev", "eth0",
    ]);
}

/// One of the router's links: its interface, the node's ASN, how the router
/// reacts to BFD going down (`on`: the session goes down and the node's routes
/// with it; `graceful`: BIRD treats it as a graceful restart of the node), and
/// the TCP MD5 password.
struct RouterLink {
    ifname: &'static str,
    asn: u32,
    bfd: &'static str,
    password: Option<&'static str>,
}

/// The router: a BIRD peering with `fe80::2` on each node link, BFD offered at
/// 100 ms x 3, graceful-restart aware (BIRD's default), re-announcing everything.
/// Its neighbors are explicit, not a dynamic `neighbor range`: BIRD deletes a
/// dynamic session, routes and all, when it goes down, so a dynamic neighbor
/// cannot keep a restarting peer's routes.
fn router_conf(links: &[RouterLink]) -> String {
    let mut conf = String::from(
        "router id 10.255.0.254;\nlog stderr all;\ndebug protocols { states, events };\nprotocol device {}\n\
         protocol bfd { interface \"*\" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }; }\n\
         protocol kernel { ipv6 { export all; }; }\nprotocol kernel { ipv4 { export all; }; }\n",
    );
    for link in links {
        let name = link.ifname.replace('-', "_");
        conf.push_str(&format!(
            "protocol bgp {name} {{\n  local as 65000;\n  interface \"{ifname}\";\n\
             \x20 neighbor fe80::2 as {asn};\n  bfd {bfd};\n\
             \x20 hold time 3; keepalive time 1; connect retry time 1; connect delay time 1;\n\
             {password}\
             \x20 ipv6 {{ import all; export all; next hop self; }};\n\
             \x20 ipv4 {{ extended next hop on; import all; export all; next hop self; }};\n}}\n",
            ifname = link.ifname,
            asn = link.asn,
            bfd = link.bfd,
            password = link
                .password
                .map(|p| format!("  password \"{p}\";\n"))
                .unwrap_or_default(),
        ));
    }
    conf
}

fn uplink() -> NeighborSpec {
    NeighborSpec {
        address: "fe80::1".into(),
        interface: Some("eth0".into()),
        asn: 65000,
        timers: Some(TIMERS),
        ..Default::default()
    }
}

fn route(ns: &Netns, prefix: &str) -> String {
    let family = if prefix.contains(':') { "-6" } else { "-4" };
    ns.ok(["ip", family, "route", "show", prefix])
}

fn wait_route(ns: &Netns, prefix: &str, what: &str, check: impl Fn(&str) -> bool) -> Duration {
    let start = Instant::now();
    loop {
        let r = route(ns, prefix);
        if check(&r) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{}: {what} for {prefix} not seen within {DEADLINE:?}; kernel has {r:?}",
            ns.name()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `ping -i 0.02` of `count` packets from `from` to `to`, started now.
fn start_ping(from: &Netns, to: &str, count: u32) -> Child {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            from.name(),
            "ping",
            "-n",
            "-q",
            "-i",
            "0.02",
            "-W",
            "1",
        ])
        .args(["-c", &count.to_string(), to])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ping")
}

/// (sent, received) from ping's summary.
fn ping_result(child: Child) -> (u32, u32) {
    let out = child.wait_with_output().expect("wait for ping");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary in {text:?}"));
    let nums: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (nums[0], nums[1])
}

/// How BIRD goes down.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// `birdc graceful restart` (a planned restart of the container).
    Planned,
    /// SIGKILL (a crash).
    Crash,
}

/// Stops `victim`'s BIRD while `pinger`'s pod pings `victim`'s pod every 20 ms,
/// restarts it 1 s later with `-R`, and returns (sent, lost) once the ping run
/// of 4 s is over.
fn bird_restart_loss(victim: &mut Node, pinger: &Node, router: &Bird, stop: Stop) -> (u32, u32) {
    victim.bird.wait_established("node before the restart");
    router.wait_established("router before the restart");
    let ping = start_ping(&pinger.pod, victim.pod6, 200);
    std::thread::sleep(Duration::from_millis(500));
    match stop {
        Stop::Planned => victim.bird.graceful_stop(),
        Stop::Crash => victim.bird.kill(),
    }
    std::thread::sleep(Duration::from_secs(1));
    victim.start(true);
    victim.bird.wait_established("restarted node");
    router.wait_established("router after the restart");
    let (sent, received) = ping_result(ping);
    (sent, sent - received)
}

#[test]
fn graceful_restart_bfd_and_link_local_sessions_measured() {
    flock_testkit::require_root();
    let switch = Netns::new("sw");
    let router_ns = Netns::new("rtr");
    for (family, key) in [("ipv6", "conf.all.forwarding"), ("ipv4", "ip_forward")] {
        router_ns.ok(["sysctl", "-qw", &format!("net.{family}.{key}=1")]);
    }
    let mut n1 = Node::new(
        "gr",
        64601,
        1,
        NeighborSpec {
            bfd: true,
            bfd_timing: Some(BfdTiming {
                interval_ms: 100,
                multiplier: 3,
            }),
            ..uplink()
        },
    );
    let mut n2 = Node::new(
        "nogr",
        64602,
        2,
        NeighborSpec {
            // Unnumbered without knowing the router's address: any link-local
            // peer on eth0 may connect (dynamic BGP); the router connects.
            address: String::new(),
            graceful_restart: Some(GracefulRestart::Off),
            ..uplink()
        },
    );
    link(&switch, &router_ns, "to-n1", &n1.ns, "br1");
    link(&switch, &router_ns, "to-n2", &n2.ns, "br2");
    let mut router = Bird::new();
    let mut links = [
        RouterLink {
            ifname: "to-n1",
            asn: 64601,
            bfd: "graceful",
            password: None,
        },
        RouterLink {
            ifname: "to-n2",
            asn: 64602,
            bfd: "on",
            password: None,
        },
    ];
    std::fs::write(router.conf(), router_conf(&links)).unwrap();
    router.start(&router_ns, false);
    n1.start(false);
    n2.start(false);

    // Unnumbered sessions carry both families: each node's CIDRs reach the
    // other node, IPv4 with an IPv6 link-local next hop.
    for (node, other) in [(&n1, &n2), (&n2, &n1)] {
        node.bird.wait_established("node");
        wait_route(&other.ns, node.cidr6, "IPv6 route", |r| {
            r.contains("via fe80::1 dev eth0 proto bird")
        });
        wait_route(&other.ns, node.cidr4, "IPv4 route", |r| {
            r.contains("via inet6 fe80::1 dev eth0 proto bird")
        });
    }
    for (from, to) in [(&n1, &n2), (&n2, &n1)] {
        for addr in [to.pod6, to.pod4] {
            assert!(
                from.pod.pings(addr),
                "{} cannot ping {addr}:\n{}{}",
                from.pod.name(),
                from.ns.ok(["ip", "-6", "route"]),
                from.ns.ok(["ip", "-4", "route"])
            );
        }
    }
    println!(
        "unnumbered sessions, node1 (fe80::1 on eth0) and node2 (any link-local peer on eth0), both families:\n{}{}{}{}",
        n1.bird.birdc(&["show", "protocols"]),
        n2.bird.birdc(&["show", "protocols"]),
        n1.ns.ok(["ip", "-6", "route", "show", "proto", "bird"]),
        n1.ns.ok(["ip", "-4", "route", "show", "proto", "bird"]),
    );

    // BIRD restarts: node1 offers graceful restart, node2 does not. The router
    // runs BFD with node1 in `bfd graceful` mode: BIRD's BFD lives in the BIRD
    // process, so a restart also stops BFD, and `bfd on` would end the graceful
    // restart the moment BFD expires (measured below).
    let mut report = String::new();
    let mut loss = Vec::new();
    for stop in [Stop::Planned, Stop::Crash] {
        let (sent_gr, lost_gr) = bird_restart_loss(&mut n1, &n2, &router, stop);
        let (sent_nogr, lost_nogr) = bird_restart_loss(&mut n2, &n1, &router, stop);
        let _ = writeln!(
            report,
            "BIRD stopped ({stop:?}) and restarted 1 s later, pings every 20 ms from the other node's pod:\n\
             \x20 with graceful restart:    {lost_gr} lost of {sent_gr}\n\
             \x20 without graceful restart: {lost_nogr} lost of {sent_nogr}"
        );
        loss.push((stop, lost_gr, lost_nogr));
    }

    // The router switches to `bfd on` for node1: fast withdrawal, at the price
    // of graceful restart.
    links[0].bfd = "on";
    reconfigure_router(&router, &links);
    let (sent_strict, lost_strict) = bird_restart_loss(&mut n1, &n2, &router, Stop::Planned);
    let _ = writeln!(
        report,
        "the same planned restart with graceful restart, router with `bfd on`: {lost_strict} lost of {sent_strict}"
    );

    // TCP MD5: node2 and the router with the same password, then a wrong one.
    links[1].password = Some("s3cret");
    n2.model.neighbors[0].password = Some("s3cret".into());
    n2.write_conf();
    n2.bird.birdc(&["configure"]);
    reconfigure_router(&router, &links);
    n2.bird.wait_established("node2 with a password");
    let _ = writeln!(report, "password: the same on both sides: Established");
    n2.model.neighbors[0].password = Some("wrong".into());
    n2.write_conf();
    n2.bird.birdc(&["configure"]);
    std::thread::sleep(Duration::from_secs(4));
    let rows = n2.bird.protocols();
    let session = rows
        .iter()
        .filter(|r| r.is_bgp())
        .map(|r| format!("{} {} {}", r.name, r.state, r.info))
        .collect::<Vec<_>>()
        .join("; ");
    assert!(
        !rows.iter().any(|r| r.bgp_state() == Some("Established")),
        "a wrong password still gave a session: {session}"
    );
    let router_side = router
        .protocols()
        .iter()
        .filter(|r| r.name == "to_n2")
        .map(|r| format!("{} {} {}", r.name, r.state, r.info))
        .collect::<Vec<_>>()
        .join("; ");
    let _ = writeln!(
        report,
        "password: a wrong one on the node: node {session}; router {router_side}"
    );

    // Draining node1: graceful shutdown marks its routes at the router with
    // GRACEFUL_SHUTDOWN (65535:0) through `birdc configure`, without a session reset.
    n1.model.graceful_shutdown = true;
    n1.write_conf();
    n1.bird.birdc(&["configure"]);
    let start = Instant::now();
    loop {
        let routes = router.birdc(&["show", "route", "all", n1.cidr6]);
        if routes.contains("(65535,0)") {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no GRACEFUL_SHUTDOWN community at the router: {routes}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = writeln!(
        report,
        "graceful shutdown: node1's routes carry 65535:0 at the router after {} ms",
        start.elapsed().as_millis()
    );

    // Link cut with BFD 100 ms x 3 (node1, router `bfd on`) and without (node2,
    // hold time 3 s).
    n2.model.neighbors[0].password = Some("s3cret".into());
    n2.write_conf();
    n2.bird.birdc(&["configure"]);
    for node in [&n1, &n2] {
        node.bird.wait_established("node before the link cut");
        wait_route(&router_ns, node.cidr6, "route back", |r| {
            r.contains("proto bird")
        });
    }
    let mut withdrawal = Vec::new();
    for node in [&n1, &n2] {
        node.ns.ok(["ip", "link", "set", "eth0", "down"]);
        let took = wait_route(&router_ns, node.cidr6, "withdrawal", |r| {
            r.trim().is_empty()
        });
        withdrawal.push(took);
    }
    let _ = writeln!(
        report,
        "node link cut to the router's withdrawal of the node's CIDR:\n\
         \x20 with BFD 100 ms x 3:    {} ms\n\
         \x20 without BFD (hold 3 s): {} ms",
        withdrawal[0].as_millis(),
        withdrawal[1].as_millis()
    );
    print!("{report}");
    if let Ok(path) = std::env::var("FLOCK_FAULTS_REPORT") {
        std::fs::write(path, &report).expect("write the report");
    }

    for (stop, lost_gr, lost_nogr) in &loss {
        assert!(
            *lost_gr <= 2,
            "{stop:?}: graceful restart lost {lost_gr} pings\n{report}"
        );
        assert!(
            lost_nogr > lost_gr,
            "{stop:?}: without graceful restart only {lost_nogr} pings were lost: the test measured nothing\n{report}"
        );
    }
    assert!(
        withdrawal[0] < Duration::from_secs(1),
        "BFD took {:?}\n{report}",
        withdrawal[0]
    );
    assert!(
        withdrawal[1] > Duration::from_secs(1),
        "without BFD the route went in {:?}: the test measured nothing\n{report}",
        withdrawal[1]
    );
}

fn reconfigure_router(router: &Bird, links: &[RouterLink]) {
    std::fs::write(router.conf(), router_conf(links)).unwrap();
    let out = router.birdc(&["configure"]);
    assert!(
        out.contains("Reconfigured") || out.contains("Reconfiguration in progress"),
        "router configure: {out}"
    );
}
