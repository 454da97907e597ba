//! The renderer: a [`ValidModel`] in, a complete BIRD 2 configuration out.

use std::fmt::Write as _;

use ipnet::IpNet;

use crate::model::{Community, GracefulRestart, Neighbor, ValidModel};

/// The two address families, in the order they are rendered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    V6,
    V4,
}

impl Family {
    fn channel(self) -> &'static str {
        match self {
            Family::V6 => "ipv6",
            Family::V4 => "ipv4",
        }
    }
    fn suffix(self) -> &'static str {
        match self {
            Family::V6 => "6",
            Family::V4 => "4",
        }
    }
    fn holds(self, net: &IpNet) -> bool {
        matches!(
            (self, net),
            (Family::V6, IpNet::V6(_)) | (Family::V4, IpNet::V4(_))
        )
    }
    /// Shorter prefixes than this (other than a default route) are refused.
    fn min_len(self) -> u8 {
        match self {
            Family::V6 => 16,
            Family::V4 => 8,
        }
    }
    /// Prefixes no peer should ever send.
    fn bogons(self) -> &'static str {
        match self {
            Family::V6 => "::/128, ::1/128, fe80::/10+, ff00::/8+",
            Family::V4 => "0.0.0.0/8+, 127.0.0.0/8+, 169.254.0.0/16+, 224.0.0.0/3+",
        }
    }
}

/// Renders the complete BIRD 2 configuration of a node.
///
/// Deterministic: the same [`ValidModel`] gives the same bytes, and
/// [`BirdModel::validate`](crate::BirdModel::validate) sorts every list, so
/// the input order never shows. The control socket is not part of the
/// configuration: BIRD takes it as `-s PATH` on its command line.
pub fn render(model: &ValidModel) -> String {
    // About 40 bytes per route, twice (own-prefix set and static route).
    let routes = model.cidrs.len() + model.host_routes.len() + model.services.len();
    let mut out = String::with_capacity(4096 + 1024 * model.neighbors.len() + 80 * routes);
    let families: Vec<Family> = [
        (Family::V6, model.families.ipv6),
        (Family::V4, model.families.ipv4),
    ]
    .into_iter()
    .filter_map(|(f, on)| on.then_some(f))
    .collect();

    out.push_str(
        "# BIRD 2 configuration of a flock node, rendered by flock-bird.\n\
         # Do not edit: the flock agent rewrites it and reloads BIRD on every change.\n\n",
    );
    let _ = writeln!(out, "router id {};\n", model.router_id);
    out.push_str(
        "# Interfaces and their addresses, for next-hop resolution.\n\
         protocol device flock_device {\n}\n",
    );

    for &family in &families {
        render_family(&mut out, model, family);
    }

    if model.neighbors.iter().any(|n| n.bfd) {
        out.push_str(
            "\n# Bidirectional forwarding detection for the neighbors that ask for it.\n\
             protocol bfd flock_bfd {\n}\n",
        );
    }
    render_radv(&mut out, model);
    for neighbor in &model.neighbors {
        render_neighbor(&mut out, model, neighbor, &families);
    }
    out
}

/// Router advertisements on the link of each unnumbered neighbor (one given by interface).
/// FRR's `neighbor IFACE interface` (SONiC, Cumulus) learns the peer's link-local address
/// only from them, and stays idle without. Router lifetime 0 and every prefix skipped: no
/// host on the link takes the node as its default router or an address from its prefixes.
/// An advertisement every 3 to 10 s (BIRD's default is up to 600 s), so that a router that
/// restarts finds the node within seconds.
fn render_radv(out: &mut String, model: &ValidModel) {
    let links: std::collections::BTreeSet<&str> = model
        .neighbors
        .iter()
        .filter_map(|n| n.interface.as_deref())
        .collect();
    if links.is_empty() {
        return;
    }
    out.push_str(
        "\n# Router advertisements on the links of unnumbered neighbors: a peer that learns\n\
         # this node's link-local address from them (FRR's `neighbor IFACE interface`) can\n\
         # connect. Router lifetime 0, no prefixes: nobody takes the node as its router.\n\
         protocol radv flock_radv {\n",
    );
    for link in links {
        let _ = write!(
            out,
            "  interface \"{link}\" {{\n\
             \x20   min ra interval {RA_MIN};\n\
             \x20   max ra interval {RA_MAX};\n\
             \x20   default lifetime 0;\n\
             \x20   prefix ::/0 {{ skip yes; }};\n\
             \x20 }};\n"
        );
    }
    out.push_str("}\n");
}

/// The interval between two router advertisements of [`render_radv`], in seconds: BIRD's
/// smallest minimum, and a maximum that lets a restarted router find the node in seconds.
const RA_MIN: u32 = 3;
const RA_MAX: u32 = 10;

/// BIRD's `error wait time` for every neighbor: the first and the longest wait, in seconds.
const ERROR_WAIT_MIN: u32 = 5;
const ERROR_WAIT_MAX: u32 = 60;

fn render_family(out: &mut String, model: &ValidModel, family: Family) {
    let v = family.suffix();
    let cidrs = model.cidrs.iter().filter(|n| family.holds(n));
    let hosts = model.host_routes.iter().filter(|n| family.holds(n));
    let services = model.services.iter().filter(|n| family.holds(n));

    let _ = write!(
        out,
        "\n# ---- {ch} ----\n\n\
         # flock's own {ch} prefixes (node CIDRs and everything inside them, the\n\
         # routes announced individually and the Service routes): never accepted\n\
         # back from a peer.\n\
         define FLOCK_OWN{v} = [",
        ch = family.channel(),
    );
    let mut first = true;
    for net in cidrs.clone() {
        out.push_str(if first { "\n  " } else { ",\n  " });
        first = false;
        let _ = write!(out, "{net}+");
    }
    for net in hosts.clone().chain(services.clone()) {
        out.push_str(if first { "\n  " } else { ",\n  " });
        first = false;
        let _ = write!(out, "{net}");
        if !is_host(net) {
            out.push('+');
        }
    }
    out.push_str(if first { "];\n" } else { "\n];\n" });

    let _ = write!(
        out,
        "\n# What a peer may send: {default}, nothing shorter than /{min},\n\
         # no martians, none of our own prefixes.\n\
         filter flock_import{v} {{\n",
        default = if model.import_default {
            "a default route (import_default is set)"
        } else {
            "no default route"
        },
        min = family.min_len(),
    );
    if model.import_default {
        out.push_str("  if net.len = 0 then accept;\n");
    }
    let _ = write!(
        out,
        "  if net.len < {min} then reject;\n\
         \x20 if net ~ [ {bogons} ] then reject;\n\
         \x20 if net ~ FLOCK_OWN{v} then reject;\n\
         \x20 accept;\n}}\n",
        min = family.min_len(),
        bogons = family.bogons(),
    );

    let _ = write!(
        out,
        "\n# Exactly what we announce: the node CIDRs, the addresses outside them, the\n\
         # anycast addresses and the Service routes; never a pod's host route that a\n\
         # CIDR covers.\n\
         define FLOCK_EXPORT{v} = ["
    );
    let mut first = true;
    for net in cidrs.clone().chain(hosts.clone()).chain(services.clone()) {
        out.push_str(if first { "\n  " } else { ",\n  " });
        first = false;
        let _ = write!(out, "{net}");
    }
    out.push_str(if first { "];\n" } else { "\n];\n" });
    let _ = write!(
        out,
        "\n# What we announce: only flock's own routes (protocols flock_routes{v} and\n\
         # flock_services{v}), never a route learned from another peer.\n\
         filter flock_export{v} {{\n\
         \x20 if proto != \"flock_routes{v}\" && proto != \"flock_services{v}\" then reject;\n\
         \x20 if ! (net ~ FLOCK_EXPORT{v}) then reject;\n"
    );
    if model.graceful_shutdown {
        out.push_str(
            "  # Draining (graceful shutdown, RFC 8326): peers prefer other paths.\n\
             \x20 bgp_community.add((65535, 0));\n",
        );
    }
    for community in &model.communities {
        match community {
            Community::Standard(a, b) => {
                let _ = writeln!(out, "  bgp_community.add(({a}, {b}));");
            }
            Community::Large(a, b, c) => {
                let _ = writeln!(out, "  bgp_large_community.add(({a}, {b}, {c}));");
            }
        }
    }
    out.push_str("  accept;\n}\n");

    let _ = write!(
        out,
        "\n# Node CIDRs (aggregates) and individually announced addresses. BIRD only\n\
         # announces them: the agent programs the kernel (its own blackholes for the\n\
         # CIDRs, routes to the pods), and flock_kernel{v} exports only BGP routes.\n\
         protocol static flock_routes{v} {{\n\
         \x20 {ch} {{ import all; export none; }};\n",
        ch = family.channel(),
    );
    for net in cidrs.chain(hosts) {
        let _ = writeln!(out, "  route {net} blackhole;");
    }
    out.push_str("}\n");

    let _ = write!(
        out,
        "\n# Service routes: LoadBalancer and external IPs (host routes) and cluster-IP\n\
         # ranges (aggregates) this node announces. Announced only: kube-proxy takes\n\
         # the traffic on arrival (DNAT in PREROUTING), so the kernel needs no route.\n\
         protocol static flock_services{v} {{\n\
         \x20 {ch} {{ import all; export none; }};\n",
        ch = family.channel(),
    );
    for net in services {
        let _ = writeln!(out, "  route {net} blackhole;");
    }
    out.push_str("}\n");

    let _ = write!(
        out,
        "\n# Routes learned over BGP into the kernel, equal-cost paths merged into one\n\
         # multipath route, kept in the kernel when BIRD stops or restarts.\n\
         protocol kernel flock_kernel{v} {{\n\
         \x20 {ch} {{\n\
         \x20   import none;\n\
         \x20   export filter {{ if source = RTS_BGP then accept; reject; }};\n\
         \x20 }};\n\
         \x20 merge paths on;\n\
         \x20 persist;\n",
        ch = family.channel(),
    );
    if model
        .neighbors
        .iter()
        .any(|n| matches!(n.graceful_restart, GracefulRestart::On { .. }))
    {
        out.push_str("  graceful restart on;\n");
    }
    out.push_str("}\n");
}

/// A /128 or /32.
fn is_host(net: &IpNet) -> bool {
    net.prefix_len() == net.max_prefix_len()
}

fn render_neighbor(out: &mut String, model: &ValidModel, n: &Neighbor, families: &[Family]) {
    let _ = write!(
        out,
        "\nprotocol bgp {name} {{\n\
         \x20 description \"flock neighbor {peer} AS{asn}\";\n",
        name = n.name,
        peer = n.peer(),
        asn = n.asn,
    );
    match n.source_address {
        Some(source) => {
            let _ = writeln!(out, "  local {source} as {};", model.asn);
        }
        None => {
            let _ = writeln!(out, "  local as {};", model.asn);
        }
    }
    if let Some(ifname) = &n.interface {
        let _ = writeln!(out, "  interface \"{ifname}\";");
    }
    match n.address {
        Some(address) => {
            let _ = writeln!(out, "  neighbor {address} as {};", n.asn);
        }
        None => {
            // Dynamic BGP: one session per link-local peer that connects.
            let _ = write!(
                out,
                "  neighbor range fe80::/10 as {};\n  dynamic name \"{}_\";\n",
                n.asn, n.name
            );
        }
    }
    if let Some(hops) = n.multihop {
        let _ = writeln!(out, "  multihop {hops};");
    }
    if let Some(password) = &n.password {
        let _ = writeln!(out, "  password \"{password}\";");
    }
    match (n.bfd, n.bfd_timing) {
        (true, Some(t)) => {
            let _ = writeln!(
                out,
                "  bfd {{ min rx interval {i} ms; min tx interval {i} ms; multiplier {m}; }};",
                i = t.interval_ms,
                m = t.multiplier
            );
        }
        (true, None) => out.push_str("  bfd on;\n"),
        (false, _) => {}
    }
    if let Some(t) = n.timers {
        let _ = write!(
            out,
            "  hold time {};\n  keepalive time {};\n  connect retry time {};\n  connect delay time {};\n",
            t.hold, t.keepalive, t.connect_retry, t.connect_delay
        );
    }
    // After a session error (a hold timer that expired, a notification) BIRD waits this long
    // before it connects again, doubling on repeated errors. Its default, 60 s to 300 s, kept
    // a node's routes away from the fabric for a minute after a hiccup of a second; 5 s to
    // 60 s still damps a flapping session.
    let _ = writeln!(out, "  error wait time {ERROR_WAIT_MIN}, {ERROR_WAIT_MAX};");
    match n.graceful_restart {
        GracefulRestart::On {
            restart_time,
            long_lived_stale_time,
        } => {
            let _ = write!(
                out,
                "  graceful restart on;\n  graceful restart time {restart_time};\n"
            );
            if let Some(stale) = long_lived_stale_time {
                let _ = write!(
                    out,
                    "  long lived graceful restart on;\n  long lived stale time {stale};\n"
                );
            }
        }
        GracefulRestart::Off => out.push_str("  graceful restart aware;\n"),
    }
    for &family in families {
        // An IPv4 session carries only IPv4; an IPv6 session carries both,
        // IPv4 with IPv6 next hops (RFC 8950).
        let ipv4_session = n.address.is_some_and(|a| a.is_ipv4());
        if family == Family::V6 && ipv4_session {
            continue;
        }
        let v = family.suffix();
        let _ = writeln!(out, "  {} {{", family.channel());
        if family == Family::V4 && !ipv4_session {
            out.push_str("    extended next hop on;\n");
        }
        let _ = write!(
            out,
            "    import filter flock_import{v};\n\
             \x20   export filter flock_export{v};\n\
             \x20   next hop self;\n\
             \x20 }};\n"
        );
    }
    out.push_str("}\n");
}
