//! The BGP router of the lab and of the cluster, one description of it rendered for either of
//! two routers: BIRD 2 ([`Router::bird_conf`]) or FRR ([`Router::frr_conf`]: zebra, bgpd and
//! bfdd, as the top-of-rack routers of real fabrics run it; SONiC is FRR inside).
//!
//! The router is not a flock node. It learns every node's pod prefixes, anycast and Service
//! addresses over BGP, installs them in its kernel (equal-cost paths merged, so an anycast
//! address has a next hop per node) and passes them on to the other nodes. It announces its
//! own addresses (on its `lo`) so that pods can answer it. Fast timers: a session is up in
//! about a second, and a node that stops answering is dropped at the hold time (6 s), or by BFD
//! (100 ms x 3) when the peer asks for it.
//!
//! [`Kind`] also knows how to start the router, ask it for its sessions, a route's communities
//! and its BFD sessions, and reads the answers ([`parse_sessions`], [`parse_communities`],
//! [`parse_bfd_up`]); the lab and the cluster run those commands in their own way.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Which BGP implementation is the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    /// BIRD 2, as every node runs it.
    #[default]
    Bird,
    /// FRR (Debian's `frr`): zebra, bgpd and bfdd.
    Frr,
}

impl std::str::FromStr for Kind {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Kind> {
        match s {
            "bird" => Ok(Kind::Bird),
            "frr" => Ok(Kind::Frr),
            other => bail!("--router {other:?}: the router is `bird` or `frr`"),
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Bird => "BIRD",
            Kind::Frr => "FRR",
        })
    }
}

/// FRR's daemons, each started with its own file of [`FrrConf`].
pub const FRR_DAEMONS: [&str; 3] = ["zebra", "bfdd", "bgpd"];

/// One daemon of the router: its name, its command line, and the file whose existence says it
/// serves.
#[derive(Debug, Clone)]
pub struct Daemon {
    /// `bird`, `zebra`, `bfdd` or `bgpd`.
    pub name: &'static str,
    /// Its command line, in the foreground.
    pub argv: Vec<String>,
    /// Its socket: there once it serves.
    pub ready: std::path::PathBuf,
}

/// Where Debian's `frr` package puts the daemons.
const FRR_BIN: &str = "/usr/lib/frr";

impl Kind {
    /// Its name on the command line (`--router bird|frr`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Bird => "bird",
            Kind::Frr => "frr",
        }
    }

    /// The Debian packages the router needs.
    pub fn packages(self) -> &'static [&'static str] {
        match self {
            Kind::Bird => &["bird2"],
            Kind::Frr => &["frr"],
        }
    }

    /// The `proto` of the routes the router installs in its kernel (`ip route show proto …`).
    pub fn kernel_proto(self) -> &'static str {
        match self {
            Kind::Bird => "bird",
            Kind::Frr => "bgp",
        }
    }

    /// The daemons that start the router in the foreground, in order (BIRD is one, FRR three:
    /// zebra, then bfdd and bgpd, which connect to it), with every file, socket and log in
    /// `dir` (the configuration written there by [`Router::write`]). Start each only once the
    /// one before serves ([`Daemon::ready`]): a daemon that finds no zebra tries again only
    /// 10 s later, and the BFD sessions bgpd asks for before bfdd is connected may never be
    /// made (a CI run's router had none after 30 s).
    pub fn start_commands(self, dir: &Path) -> Vec<Daemon> {
        let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
        match self {
            Kind::Bird => vec![Daemon {
                name: "bird",
                argv: vec![
                    "bird".into(),
                    "-f".into(),
                    "-c".into(),
                    path("bird.conf"),
                    "-s".into(),
                    path("bird.ctl"),
                    "-P".into(),
                    path("bird.pid"),
                ],
                ready: dir.join("bird.ctl"),
            }],
            Kind::Frr => FRR_DAEMONS
                .iter()
                .map(|daemon| {
                    let mut argv = vec![
                        format!("{FRR_BIN}/{daemon}"),
                        "-f".into(),
                        path(&format!("{daemon}.conf")),
                        "-i".into(),
                        path(&format!("{daemon}.pid")),
                        "-z".into(),
                        path("zserv.api"),
                        "--vty_socket".into(),
                        dir.to_string_lossy().into_owned(),
                        // No TCP vty: vtysh reaches each daemon on its socket in `dir`.
                        "-P".into(),
                        "0".into(),
                        // Root, in the vty group the package's daemons insist on.
                        "-u".into(),
                        "root".into(),
                        "-g".into(),
                        "frrvty".into(),
                        "--log".into(),
                        format!("file:{}", path(&format!("{daemon}.log"))),
                    ];
                    if *daemon == "bfdd" {
                        argv.extend(["--bfdctl".into(), path("bfdd.sock")]);
                    }
                    // zebra serves its clients on zserv.api; bfdd and bgpd open their vty
                    // socket as they start, and connect to zebra at once when it is there.
                    let ready = if *daemon == "zebra" {
                        dir.join("zserv.api")
                    } else {
                        dir.join(format!("{daemon}.vty"))
                    };
                    Daemon {
                        name: daemon,
                        argv,
                        ready,
                    }
                })
                .collect(),
        }
    }

    /// How long after it starts the router's OPEN carries the restart-state bit of graceful
    /// restart (RFC 4724 "R"): FRR's bgpd sets it for its default restart time, 120 s, from
    /// the start of its BGP instance, whatever it is configured with (`t_startup` in bgpd).
    /// BIRD, restarting itself, does not wait for the End-of-RIB of a peer that says it
    /// restarts too, so a node's BIRD that crashes in that window prunes its kernel routes
    /// before the router has sent them again.
    pub fn restart_state_window(self) -> Option<std::time::Duration> {
        match self {
            Kind::Bird => None,
            Kind::Frr => Some(std::time::Duration::from_secs(120)),
        }
    }

    /// The file whose age is the router's: written when it started.
    pub fn started_file(self, dir: &Path) -> std::path::PathBuf {
        match self {
            Kind::Bird => dir.join("bird.pid"),
            Kind::Frr => dir.join("bgpd.pid"),
        }
    }

    /// The command that checks the configuration in `dir` with the router's own parser.
    pub fn check_command(self, dir: &Path) -> Vec<String> {
        let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
        match self {
            Kind::Bird => vec!["bird".into(), "-p".into(), "-c".into(), path("bird.conf")],
            // vtysh parses the integrated form with every daemon's grammar; exit 2 on an error.
            Kind::Frr => vec!["vtysh".into(), "-C".into(), "-f".into(), path("frr.conf")],
        }
    }

    /// The command that asks the router in `dir` to show something: `birdc ARGS` or
    /// `vtysh -c ARGS`.
    pub fn show_command(self, dir: &Path, what: &str) -> Vec<String> {
        match self {
            Kind::Bird => {
                let mut argv = vec![
                    "birdc".into(),
                    "-s".into(),
                    dir.join("bird.ctl").to_string_lossy().into_owned(),
                ];
                argv.extend(what.split_whitespace().map(str::to_owned));
                argv
            }
            Kind::Frr => vec![
                "vtysh".into(),
                "--vty_socket".into(),
                dir.to_string_lossy().into_owned(),
                "-c".into(),
                what.to_owned(),
            ],
        }
    }

    /// The commands that make the router running in `dir` take the configuration
    /// [`Router::write`] wrote there (`asn`: the router's); `dropped`: what it had before and
    /// its new configuration no longer has, which FRR keeps unless told. [`Kind::reload_ok`]
    /// reads each one's output.
    pub fn reload_commands(self, dir: &Path, asn: u32, dropped: &Dropped<'_>) -> Vec<Vec<String>> {
        match self {
            Kind::Bird => vec![self.show_command(dir, "configure")],
            Kind::Frr => {
                let socket = dir.to_string_lossy().into_owned();
                let mut commands = Vec::new();
                if !dropped.is_empty() {
                    let mut argv = vec![
                        "vtysh".to_owned(),
                        "--vty_socket".into(),
                        socket.clone(),
                        "-c".into(),
                        "configure terminal".into(),
                        "-c".into(),
                        format!("router bgp {asn}"),
                    ];
                    for peer in dropped.peers {
                        argv.extend(["-c".into(), format!("no neighbor {peer}")]);
                    }
                    for peer in dropped.bfd_graceful {
                        argv.extend([
                            "-c".into(),
                            format!("no neighbor {peer} bfd check-control-plane-failure"),
                        ]);
                    }
                    for route in dropped.announced {
                        let family = match route {
                            ipnet::IpNet::V6(_) => "ipv6",
                            ipnet::IpNet::V4(_) => "ipv4",
                        };
                        argv.extend([
                            "-c".into(),
                            format!("address-family {family} unicast"),
                            "-c".into(),
                            format!("no network {route}"),
                            "-c".into(),
                            "exit-address-family".into(),
                        ]);
                    }
                    commands.push(argv);
                }
                // Applies the file's lines over the running configuration (what is already
                // there stays, what is new is added).
                commands.push(vec![
                    "vtysh".into(),
                    "--vty_socket".into(),
                    socket,
                    "-f".into(),
                    dir.join("bgpd.conf").to_string_lossy().into_owned(),
                ]);
                commands
            }
        }
    }

    /// Whether the output of one of [`Kind::reload_commands`] says it was taken.
    pub fn reload_ok(self, output: &str) -> bool {
        match self {
            Kind::Bird => {
                output.contains("Reconfigured") || output.contains("Reconfiguration in progress")
            }
            // vtysh marks an error with `%` (`% Unknown command`, `% Specify remote-as …`).
            Kind::Frr => !output.lines().any(|l| l.trim_start().starts_with('%')),
        }
    }

    /// What [`Kind::show_command`] asks for the BGP sessions ([`parse_sessions`] reads it).
    pub fn sessions_query(self) -> &'static str {
        match self {
            Kind::Bird => "show protocols",
            Kind::Frr => "show bgp neighbors json",
        }
    }

    /// What [`Kind::show_command`] asks for the BGP paths of `prefix` ([`parse_communities`]
    /// reads it).
    pub fn route_query(self, prefix: &str) -> String {
        match self {
            Kind::Bird => format!("show route all {prefix}"),
            Kind::Frr => {
                let family = if prefix.contains(':') { "ipv6" } else { "ipv4" };
                format!("show bgp {family} unicast {prefix} json")
            }
        }
    }

    /// What [`Kind::show_command`] asks for the BFD sessions ([`parse_bfd_up`] reads it).
    pub fn bfd_query(self) -> &'static str {
        match self {
            Kind::Bird => "show bfd sessions",
            Kind::Frr => "show bfd peers json",
        }
    }
}

/// One BGP session of the router, the same for either router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The node's name (BIRD: the protocol's name; FRR: the neighbor's description).
    pub name: String,
    /// `up` when Established, else `start` (BIRD's words).
    pub state: String,
    /// Identifies the session's last change of state: a session that went down and up again
    /// shows another value (BIRD: the time of the change; FRR: how many times it came up).
    pub since: String,
    /// The BGP state (`Established`, `Active`, `Connect`) and why, if the router says.
    pub info: String,
}

impl Session {
    /// Whether the session is Established.
    pub fn established(&self) -> bool {
        self.info == "Established"
    }
}

/// The sessions in the router's answer to [`Kind::sessions_query`]; empty when it is not one.
pub fn parse_sessions(kind: Kind, text: &str) -> Vec<Session> {
    match kind {
        Kind::Bird => flock_bird::parse_show_protocols(text)
            .unwrap_or_default()
            .into_iter()
            .filter(|row| row.is_bgp())
            .map(|row| Session {
                name: row.name,
                state: row.state,
                since: row.since,
                info: row.info,
            })
            .collect(),
        Kind::Frr => {
            let Ok(Value::Object(neighbors)) = serde_json::from_str::<Value>(text) else {
                return Vec::new();
            };
            neighbors
                .iter()
                .map(|(peer, n)| {
                    let state = n["bgpState"].as_str().unwrap_or("unknown");
                    let name = n["nbrDesc"].as_str().unwrap_or(peer);
                    let up = n["connectionsEstablished"].as_u64().unwrap_or(0);
                    let mut info = state.to_owned();
                    if let Some(why) = n["lastResetDueTo"].as_str()
                        && state != "Established"
                    {
                        let _ = write!(info, " ({why})");
                    }
                    Session {
                        name: name.to_owned(),
                        state: if state == "Established" {
                            "up"
                        } else {
                            "start"
                        }
                        .into(),
                        since: format!("established {up} times"),
                        info,
                    }
                })
                .collect()
        }
    }
}

/// The communities on the best path of a route, in the router's answer to
/// [`Kind::route_query`]: standard ones as `a:b`, large ones as `a:b:c`.
pub fn parse_communities(kind: Kind, text: &str) -> Vec<String> {
    match kind {
        Kind::Bird => {
            // A route starts on a line of its own (`PREFIX unicast [node1 …] * (100)`, a
            // second path of the prefix indented by spaces), its attributes follow indented
            // by a tab: `\tBGP.community: (65535,0) (64601,100)` and
            // `\tBGP.large_community: (64601, 7, 1)`. The best path comes first.
            let mut out = Vec::new();
            let mut routes = 0;
            for line in text.lines() {
                if line.contains(" [") && !line.starts_with('\t') {
                    routes += 1;
                    if routes > 1 {
                        break;
                    }
                }
                let Some((attr, values)) = line.trim().split_once(": ") else {
                    continue;
                };
                if attr == "BGP.community" || attr == "BGP.large_community" {
                    for value in values.split(')') {
                        let inner = value.trim().trim_start_matches('(');
                        if !inner.is_empty() {
                            out.push(inner.replace(' ', "").replace(',', ":"));
                        }
                    }
                }
            }
            out
        }
        Kind::Frr => {
            let Ok(route) = serde_json::from_str::<Value>(text) else {
                return Vec::new();
            };
            let Some(paths) = route["paths"].as_array() else {
                return Vec::new();
            };
            let best = paths
                .iter()
                .find(|p| p["bestpath"]["overall"].as_bool() == Some(true))
                .or(paths.first());
            let Some(best) = best else {
                return Vec::new();
            };
            let mut out = Vec::new();
            for attr in ["community", "largeCommunity"] {
                if let Some(list) = best[attr]["string"].as_str() {
                    out.extend(list.split_whitespace().map(|c| match c {
                        // FRR names the well-known ones.
                        "graceful-shutdown" => "65535:0".to_owned(),
                        other => other.to_owned(),
                    }));
                }
            }
            out
        }
    }
}

/// How many BFD sessions are up in the router's answer to [`Kind::bfd_query`].
pub fn parse_bfd_up(kind: Kind, text: &str) -> usize {
    match kind {
        // `IP address  Interface  State  Since  Interval  Timeout`
        Kind::Bird => text
            .lines()
            .filter(|l| l.split_whitespace().nth(2) == Some("Up"))
            .count(),
        Kind::Frr => serde_json::from_str::<Value>(text)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter(|p| p["status"].as_str() == Some("up"))
            .count(),
    }
}

/// What a running router had and the configuration it is to take no longer has
/// ([`Kind::reload_commands`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped<'a> {
    /// Peers: addresses, or interfaces of unnumbered ones.
    pub peers: &'a [&'a str],
    /// Routes it announced ([`Router::announce`]).
    pub announced: &'a [ipnet::IpNet],
    /// Peers (as in `peers`) whose BFD it ran in graceful mode ([`Router::bfd_graceful`]) and
    /// now runs in plain mode.
    pub bfd_graceful: &'a [&'a str],
}

impl Dropped<'_> {
    fn is_empty(&self) -> bool {
        self.peers.is_empty() && self.announced.is_empty() && self.bfd_graceful.is_empty()
    }
}

/// One node the router peers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer<'a> {
    /// The protocol's name (the node's name).
    pub name: &'a str,
    /// The node's address on the link.
    pub addr: &'a str,
    /// The node's ASN.
    pub asn: u32,
    /// The router's interface towards a peer at a link-local address (BGP unnumbered).
    pub interface: Option<&'a str>,
    /// The session's TCP MD5 password.
    pub password: Option<&'a str>,
    /// Run BFD on the session.
    pub bfd: bool,
}

/// The router: its identity, its own addresses and its peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Router<'a> {
    /// What it is the router of, for the file's first line (`the lab`, `the cluster`).
    pub of: &'a str,
    /// Its BGP router ID.
    pub router_id: &'a str,
    /// Its ASN.
    pub asn: u32,
    /// Its own addresses (on its `lo`), announced to every node.
    pub own6: &'a str,
    /// Likewise, IPv4.
    pub own4: &'a str,
    /// The nodes.
    pub peers: Vec<Peer<'a>>,
    /// Routes it announces to every node besides its own addresses, though nothing behind it
    /// calls for them (a test's rogue announcements: a default route, a node's own prefix).
    pub announce: Vec<ipnet::IpNet>,
    /// A BFD session going down starts a graceful restart of its BGP session rather than
    /// ending it (BIRD's `bfd graceful`, FRR's `bfd check-control-plane-failure`): a node's
    /// BIRD restarting loses nothing, a dead link keeps the node's routes for the restart
    /// time (docs/bgp.md, "Graceful restart and BFD").
    pub bfd_graceful: bool,
}

impl Router<'_> {
    /// The BIRD 2 configuration (`bird -p -c` accepts it).
    pub fn bird_conf(&self) -> String {
        let mut conf = format!(
            "# BIRD 2 on {of}'s router (not a flock node): it learns every node's pod prefixes,
# anycast and Service addresses, installs them (equal-cost paths merged) and passes them on
# to the other nodes.
router id {id};
log stderr all;

protocol device {{ }}

protocol kernel kernel6 {{
  ipv6 {{ import none; export where source = RTS_BGP; }};
  merge paths on;
}}

protocol kernel kernel4 {{
  ipv4 {{ import none; export where source = RTS_BGP; }};
  merge paths on;
}}

# The router's own addresses (on lo), announced so that the pods can answer it.
protocol static router6 {{
  ipv6;
  route {own6}/128 blackhole;
}}

protocol static router4 {{
  ipv4;
  route {own4}/32 blackhole;
}}

template bgp flocknode {{
  local as {asn};
  hold time 6;
  keepalive time 2;
  connect retry time 1;
  connect delay time 1;
  error wait time 1, 10;
  ipv6 {{ import all; export all; next hop self; }};
  ipv4 {{ extended next hop on; import all; export all; next hop self; }};
}}
",
            of = self.of,
            id = self.router_id,
            own6 = self.own6,
            own4 = self.own4,
            asn = self.asn,
        );
        for (name, family, v6) in [("announce6", "ipv6", true), ("announce4", "ipv4", false)] {
            let routes: Vec<_> = self
                .announce
                .iter()
                .filter(|r| matches!(r, ipnet::IpNet::V6(_)) == v6)
                .collect();
            if routes.is_empty() {
                continue;
            }
            let _ = write!(
                conf,
                "\n# Announced though nothing behind the router calls for it.\nprotocol static {name} {{\n  {family};\n"
            );
            for r in routes {
                let _ = writeln!(conf, "  route {r} blackhole;");
            }
            conf.push_str("}\n");
        }
        if self.peers.iter().any(|p| p.bfd) {
            conf.push_str("\nprotocol bfd { }\n");
        }
        for peer in &self.peers {
            let _ = write!(conf, "\nprotocol bgp {} from flocknode {{\n", peer.name);
            if let Some(interface) = peer.interface {
                let _ = writeln!(conf, "  interface \"{interface}\";");
            }
            let _ = writeln!(conf, "  neighbor {} as {};", peer.addr, peer.asn);
            if peer.bfd {
                conf.push_str(if self.bfd_graceful {
                    "  bfd graceful;\n"
                } else {
                    "  bfd on;\n"
                });
            }
            if let Some(password) = peer.password {
                let _ = writeln!(conf, "  password \"{password}\";");
            }
            conf.push_str("}\n");
        }
        conf
    }
}

/// FRR's configuration: one file per daemon, as each daemon reads its own with `-f`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrrConf {
    /// zebra: the kernel's routes and interfaces.
    pub zebra: String,
    /// bfdd: the BFD profile the sessions use.
    pub bfdd: String,
    /// bgpd: the sessions and what is announced.
    pub bgpd: String,
}

impl FrrConf {
    /// The three as one integrated `frr.conf` (what `vtysh -C` checks).
    pub fn integrated(&self) -> String {
        format!("{}{}{}", self.zebra, self.bfdd, self.bgpd)
    }

    fn file(&self, daemon: &str) -> &str {
        match daemon {
            "zebra" => &self.zebra,
            "bfdd" => &self.bfdd,
            _ => &self.bgpd,
        }
    }
}

impl Router<'_> {
    /// FRR's configuration of the same router as [`Router::bird_conf`]: zebra, bfdd and bgpd.
    ///
    /// - Every session carries both families; a numbered IPv6 one announces IPv4 with an IPv6
    ///   next hop (`capability extended-nexthop`, RFC 8950), as the nodes' BIRD does.
    /// - A peer on an interface is FRR's unnumbered neighbor (`neighbor IFACE interface`): FRR
    ///   learns the node's link-local address from the router advertisements flock's BIRD
    ///   sends on that link, and connects to it.
    /// - No policy (`no bgp ebgp-requires-policy`), equal-cost paths across the nodes' ASNs
    ///   (`multipath-relax`, 8 paths), announcements sent at once (`advertisement-interval
    ///   0`), hold 6 s and keepalive 2 s as on the BIRD router.
    /// - Graceful restart: FRR's default helper mode (it keeps a restarting node's routes; it
    ///   does not itself restart gracefully, so its OPEN never carries the restart-state bit).
    /// - BFD, for the peers that ask, at 100 ms x 3 (bfdd's profile `flock`): the session
    ///   goes down with BFD, routes and all, as BIRD's `bfd on`.
    pub fn frr_conf(&self) -> FrrConf {
        let zebra = format!(
            "! FRR on {of}'s router (not a flock node): zebra, bfdd and bgpd. It learns every
! node's pod prefixes, anycast and Service addresses, installs them (equal-cost paths merged)
! and passes them on to the other nodes.
frr defaults datacenter
hostname router
!
",
            of = self.of
        );
        let bfdd = "bfd
 profile flock
  receive-interval 100
  transmit-interval 100
  detect-multiplier 3
 exit
 !
exit
!
"
        .to_owned();
        let mut bgpd = format!(
            "router bgp {asn}
 bgp router-id {id}
 no bgp ebgp-requires-policy
 no bgp default ipv4-unicast
 bgp bestpath as-path multipath-relax
 no bgp network import-check
 timers bgp 2 6
",
            asn = self.asn,
            id = self.router_id,
        );
        let peers: Vec<(String, &Peer<'_>)> = self
            .peers
            .iter()
            .map(|p| (p.interface.unwrap_or(p.addr).to_owned(), p))
            .collect();
        for (key, peer) in &peers {
            match peer.interface {
                Some(_) => {
                    let _ = writeln!(bgpd, " neighbor {key} interface remote-as {}", peer.asn);
                }
                None => {
                    let _ = writeln!(bgpd, " neighbor {key} remote-as {}", peer.asn);
                }
            }
            let _ = writeln!(bgpd, " neighbor {key} description {}", peer.name);
            let _ = writeln!(bgpd, " neighbor {key} timers connect 1");
            let _ = writeln!(bgpd, " neighbor {key} advertisement-interval 0");
            if peer.interface.is_none() && peer.addr.contains(':') {
                let _ = writeln!(bgpd, " neighbor {key} capability extended-nexthop");
            }
            if let Some(password) = peer.password {
                let _ = writeln!(bgpd, " neighbor {key} password {password}");
            }
            if peer.bfd {
                let _ = writeln!(bgpd, " neighbor {key} bfd profile flock");
                if self.bfd_graceful {
                    let _ = writeln!(bgpd, " neighbor {key} bfd check-control-plane-failure");
                }
            }
        }
        for (family, own) in [
            ("ipv6", format!("{}/128", self.own6)),
            ("ipv4", format!("{}/32", self.own4)),
        ] {
            let _ = writeln!(bgpd, " !\n address-family {family} unicast");
            let _ = writeln!(bgpd, "  network {own}");
            for r in self.announce.iter().filter(|r| match r {
                ipnet::IpNet::V6(_) => family == "ipv6",
                ipnet::IpNet::V4(_) => family == "ipv4",
            }) {
                let _ = writeln!(bgpd, "  network {r}");
            }
            bgpd.push_str("  maximum-paths 8\n");
            for (key, _) in &peers {
                let _ = writeln!(bgpd, "  neighbor {key} activate");
            }
            bgpd.push_str(" exit-address-family\n");
        }
        bgpd.push_str("exit\n!\n");
        FrrConf { zebra, bfdd, bgpd }
    }

    /// Writes the router's configuration for `kind` into `dir` and checks it with the
    /// router's own parser (`bird -p`, `vtysh -C`).
    pub fn write(&self, kind: Kind, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))
        };
        match kind {
            Kind::Bird => write("bird.conf", &self.bird_conf())?,
            Kind::Frr => {
                let conf = self.frr_conf();
                for daemon in FRR_DAEMONS {
                    write(&format!("{daemon}.conf"), conf.file(daemon))?;
                }
                write("frr.conf", &conf.integrated())?;
            }
        }
        let argv = kind.check_command(dir);
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .with_context(|| {
                format!(
                    "run {argv:?} (apt-get install {})",
                    kind.packages().join(" ")
                )
            })?;
        if !out.status.success() {
            bail!(
                "{kind} refuses the router's configuration in {} ({argv:?}): {}{}",
                dir.display(),
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_peer_with_its_options() {
        let router = two_peers();
        let conf = router.bird_conf();
        assert!(conf.contains(
            "protocol bgp a from flocknode {\n  interface \"to-a\";\n  neighbor fe80::2 as 64601;\n  password \"s3cret\";\n}\n"
        ));
        assert!(conf.contains(
            "protocol bgp b from flocknode {\n  neighbor 2001:db8:1::2 as 64602;\n  bfd on;\n}\n"
        ));
        assert!(
            conf.contains("protocol bfd { }") && conf.contains("route 2001:db8::1/128 blackhole;")
        );
        // what it announces besides its own, each family in a protocol of its own
        assert!(
            conf.contains("protocol static announce6 {\n  ipv6;\n  route ::/0 blackhole;\n}")
                && conf.contains(
                    "protocol static announce4 {\n  ipv4;\n  route 10.0.0.0/25 blackhole;\n}"
                ),
            "{conf}"
        );
        // BIRD's own parser accepts it (`cargo xtask test` installs bird2).
        let file = std::env::temp_dir().join(format!("router-{}.conf", std::process::id()));
        std::fs::write(&file, &conf).unwrap();
        let parsed = std::process::Command::new("bird")
            .arg("-p")
            .arg("-c")
            .arg(&file)
            .output()
            .expect("run `bird -p` (apt-get install bird2)");
        let _ = std::fs::remove_file(&file);
        assert!(
            parsed.status.success(),
            "{}\n{conf}",
            String::from_utf8_lossy(&parsed.stderr)
        );
        let mut no_bfd = router.clone();
        no_bfd.peers.truncate(1);
        assert!(!no_bfd.bird_conf().contains("protocol bfd"));
        let mut graceful = router.clone();
        graceful.bfd_graceful = true;
        assert!(graceful.bird_conf().contains("  bfd graceful;\n"));
        assert!(
            graceful
                .frr_conf()
                .bgpd
                .contains(" neighbor 2001:db8:1::2 bfd check-control-plane-failure\n")
        );
        assert!(
            !router
                .frr_conf()
                .bgpd
                .contains("check-control-plane-failure")
        );
    }

    fn two_peers() -> Router<'static> {
        Router {
            of: "a test",
            router_id: "10.0.0.1",
            asn: 65000,
            own6: "2001:db8::1",
            own4: "10.0.0.1",
            peers: vec![
                Peer {
                    name: "a",
                    addr: "fe80::2",
                    asn: 64601,
                    interface: Some("to-a"),
                    password: Some("s3cret"),
                    bfd: false,
                },
                Peer {
                    name: "b",
                    addr: "2001:db8:1::2",
                    asn: 64602,
                    interface: None,
                    password: None,
                    bfd: true,
                },
            ],
            announce: vec!["::/0".parse().unwrap(), "10.0.0.0/25".parse().unwrap()],
            bfd_graceful: false,
        }
    }

    #[test]
    fn frr_gets_every_peer_with_its_options_and_accepts_them() {
        let conf = two_peers().frr_conf();
        let bgpd = &conf.bgpd;
        // Unnumbered the FRR way: the interface, the address learned from router
        // advertisements; numbered IPv6 with IPv4 over it.
        for line in [
            " neighbor to-a interface remote-as 64601\n",
            " neighbor to-a description a\n",
            " neighbor 2001:db8:1::2 remote-as 64602\n",
            " neighbor 2001:db8:1::2 capability extended-nexthop\n",
            " neighbor to-a password s3cret\n",
            " neighbor 2001:db8:1::2 bfd profile flock\n",
            "  network 2001:db8::1/128\n",
            "  network 10.0.0.1/32\n",
            "  network ::/0\n",
            "  network 10.0.0.0/25\n",
            " no bgp network import-check\n",
            "  neighbor to-a activate\n",
        ] {
            assert!(bgpd.contains(line), "{line:?} not in\n{bgpd}");
        }
        assert!(!bgpd.contains("neighbor to-a capability") && !bgpd.contains("neighbor to-a bfd"));
        assert!(
            !bgpd.contains("fe80::2"),
            "FRR learns an interface peer's address: {bgpd}"
        );
        assert_eq!(
            bgpd.matches("  neighbor 2001:db8:1::2 activate\n").count(),
            2
        );
        assert!(conf.bfdd.contains("profile flock") && conf.bfdd.contains("detect-multiplier 3"));
        // FRR's own parser accepts every daemon's part (`cargo xtask test` installs frr), and
        // refuses a broken one (the check can fail).
        let dir = tempfile::tempdir().unwrap();
        two_peers().write(Kind::Frr, dir.path()).unwrap();
        for daemon in FRR_DAEMONS {
            assert!(dir.path().join(format!("{daemon}.conf")).exists());
        }
        std::fs::write(
            dir.path().join("frr.conf"),
            format!(
                "{}router bgp 1\n neighbor x remote-ass 2\n",
                conf.integrated()
            ),
        )
        .unwrap();
        let argv = Kind::Frr.check_command(dir.path());
        let status = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .unwrap()
            .status;
        assert!(!status.success(), "vtysh -C accepted a wrong command");
    }

    #[test]
    fn each_router_runs_in_its_directory() {
        let dir = Path::new("/run/r");
        let bird = Kind::Bird.start_commands(dir);
        assert_eq!(bird.len(), 1);
        assert_eq!(bird[0].name, "bird");
        assert!(
            bird[0].argv.contains(&"/run/r/bird.conf".to_owned())
                && bird[0].argv.contains(&"-f".to_owned())
        );
        assert_eq!(bird[0].ready, Path::new("/run/r/bird.ctl"));
        let frr = Kind::Frr.start_commands(dir);
        assert_eq!(frr.len(), 3);
        assert!(
            frr[0].name == "zebra" && frr[0].argv[0].ends_with("/zebra"),
            "zebra first: {frr:?}"
        );
        // each waits for the one before: zebra's socket before its clients start
        assert_eq!(frr[0].ready, Path::new("/run/r/zserv.api"));
        assert_eq!(frr[2].ready, Path::new("/run/r/bgpd.vty"));
        for argv in frr.iter().map(|d| &d.argv) {
            assert!(
                argv.contains(&"/run/r/zserv.api".to_owned())
                    && argv.contains(&"/run/r".to_owned())
            );
            assert!(
                !argv.contains(&"-d".to_owned()),
                "in the foreground: {argv:?}"
            );
        }
        assert!(
            frr.iter()
                .any(|d| d.argv.contains(&"/run/r/bfdd.sock".to_owned()))
        );
        assert_eq!(
            Kind::Frr.show_command(dir, "show bgp summary")[4],
            "show bgp summary"
        );
        assert_eq!(
            &Kind::Bird.show_command(dir, "show protocols")[3..],
            ["show", "protocols"]
        );
        assert_eq!("frr".parse::<Kind>().unwrap(), Kind::Frr);
        let err = "quagga".parse::<Kind>().unwrap_err().to_string();
        assert!(
            err.contains("\"quagga\"") && err.contains("--router"),
            "{err}"
        );
    }

    #[test]
    fn a_running_router_takes_a_new_configuration() {
        let dir = Path::new("/run/r");
        assert_eq!(
            Kind::Bird.reload_commands(
                dir,
                65000,
                &Dropped {
                    peers: &["2001:db8::9"],
                    ..Dropped::default()
                }
            ),
            [["birdc", "-s", "/run/r/bird.ctl", "configure"]]
        );
        let frr = Kind::Frr.reload_commands(
            dir,
            65000,
            &Dropped {
                peers: &["2001:db8::9", "to-x"],
                ..Dropped::default()
            },
        );
        assert_eq!(frr.len(), 2);
        assert!(frr[0].contains(&"router bgp 65000".to_owned()));
        assert!(frr[0].contains(&"no neighbor 2001:db8::9".to_owned()));
        assert!(frr[0].contains(&"no neighbor to-x".to_owned()));
        assert_eq!(&frr[1][3..], ["-f", "/run/r/bgpd.conf"]);
        assert_eq!(
            Kind::Frr
                .reload_commands(dir, 65000, &Dropped::default())
                .len(),
            1
        );
        // a route announced before and no more is withdrawn in its family
        let frr = Kind::Frr.reload_commands(
            dir,
            65000,
            &Dropped {
                announced: &["::/0".parse().unwrap()],
                ..Dropped::default()
            },
        );
        assert_eq!(frr.len(), 2);
        let at = frr[0].iter().position(|a| a == "no network ::/0").unwrap();
        assert_eq!(frr[0][at - 2], "address-family ipv6 unicast");
        // a peer's BFD back from graceful mode to plain
        let frr = Kind::Frr.reload_commands(
            dir,
            65000,
            &Dropped {
                bfd_graceful: &["2001:db8:1::2"],
                ..Dropped::default()
            },
        );
        assert!(
            frr[0]
                .contains(&"no neighbor 2001:db8:1::2 bfd check-control-plane-failure".to_owned())
        );
        assert!(
            Kind::Bird
                .reload_ok("BIRD 2.0.12 ready.\nReading configuration from x\nReconfigured\n")
        );
        assert!(!Kind::Bird.reload_ok("x:3:1 syntax error\n"));
        assert!(Kind::Frr.reload_ok(""));
        assert!(!Kind::Frr.reload_ok("% Unknown command: neighbor x remote-ass 2\n"));
    }

    #[test]
    fn sessions_of_either_router() {
        let bird = "BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
device1    Device     ---        up     21:29:11.250
node1      BGP        ---        up     21:29:26.507  Established
node2      BGP        ---        start  21:29:11.258  Active        Socket: Connection refused
";
        let sessions = parse_sessions(Kind::Bird, bird);
        assert_eq!(sessions.len(), 2);
        assert!(sessions[0].established() && sessions[0].name == "node1");
        assert!(!sessions[1].established() && sessions[1].info.starts_with("Active"));
        // FRR: `show bgp neighbors json`, keyed by address or interface, named by description.
        let frr = r#"{
  "to-node2": {"nbrDesc": "node2", "bgpState": "Established", "connectionsEstablished": 3,
               "lastResetDueTo": "No AFI/SAFI activated for peer"},
  "2001:db8:f1:1::2": {"nbrDesc": "node1", "bgpState": "Active", "connectionsEstablished": 2,
                       "lastResetDueTo": "BFD down received"}
}"#;
        let sessions = parse_sessions(Kind::Frr, frr);
        assert_eq!(sessions.len(), 2);
        let node2 = sessions.iter().find(|s| s.name == "node2").unwrap();
        assert!(node2.established() && node2.state == "up");
        let node1 = sessions.iter().find(|s| s.name == "node1").unwrap();
        assert_eq!(node1.info, "Active (BFD down received)");
        assert_eq!(node1.state, "start");
        assert!(parse_sessions(Kind::Frr, "% Unknown command").is_empty());
    }

    #[test]
    fn communities_of_the_best_path_of_either_router() {
        let bird = "BIRD 2.0.12 ready.
Table master6:
2001:db8:53::53/128  unicast [node1 21:29:26.507] * (100) [AS64601i]
\tvia 2001:db8:f1:1::2 on to-node1
\tType: BGP univ
\tBGP.as_path: 64601
\tBGP.community: (64601,100) (65535,0)
\tBGP.large_community: (64601, 7, 1)
                     unicast [node2 21:29:11.258] (100) [AS64602i]
\tvia fe80::2 on to-node2
\tBGP.community: (64602,9)
";
        assert_eq!(
            parse_communities(Kind::Bird, bird),
            ["64601:100", "65535:0", "64601:7:1"]
        );
        let frr = r#"{"prefix": "2001:db8:a1::/64", "paths": [
  {"bestpath": {"overall": true},
   "community": {"string": "64601:100 graceful-shutdown", "list": ["64601:100", "gracefulShutdown"]},
   "largeCommunity": {"string": "64601:7:1", "list": ["64601:7:1"]}},
  {"community": {"string": "64602:9"}}
]}"#;
        assert_eq!(
            parse_communities(Kind::Frr, frr),
            ["64601:100", "65535:0", "64601:7:1"]
        );
        assert!(parse_communities(Kind::Frr, "{}").is_empty());
        assert!(
            parse_communities(Kind::Bird, "BIRD 2.0.12 ready.\nNetwork not found\n").is_empty()
        );
    }

    #[test]
    fn bfd_sessions_up_of_either_router() {
        let bird = "BIRD 2.0.12 ready.
bfd1:
IP address                Interface  State      Since         Interval  Timeout
2001:db8:f1:1::2          to-node1   Up         21:29:26.126    0.100    0.300
2001:db8:f1:2::2          to-node2   Down       21:29:26.126    1.000    0.000
";
        assert_eq!(parse_bfd_up(Kind::Bird, bird), 1);
        let frr =
            r#"[{"peer": "2001:db8:f1:1::2", "status": "up"}, {"peer": "x", "status": "down"}]"#;
        assert_eq!(parse_bfd_up(Kind::Frr, frr), 1);
        assert_eq!(parse_bfd_up(Kind::Frr, ""), 0);
    }
}
