//! The [`Ruleset`] as an nftables script: one table, replaced in one transaction.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use crate::addr::{AddrRange, Family};
use crate::model::{ALWAYS_ICMPV6, AddrSet, Allow, Direction, Elements, Ports, Ruleset};

/// The nftables table flock's policies live in (family `inet`, in the node's namespace).
pub const TABLE: &str = "flock_policy";

/// The script that removes the table, and succeeds whether or not it exists: declaring an
/// empty table first makes the `delete` always find one, all in one transaction.
pub const REMOVE_SCRIPT: &str = "table inet flock_policy {}\ndelete table inet flock_policy\n";

impl Ruleset {
    /// The whole ruleset as an `nft -f` script: the same bytes for the same model. Applying
    /// it replaces flock's table atomically (declare, delete, define: one transaction);
    /// a ruleset with no isolated pod renders as [`REMOVE_SCRIPT`], leaving no rule behind.
    pub fn render(&self) -> String {
        if self.is_empty() {
            return REMOVE_SCRIPT.to_owned();
        }
        let mut out = String::new();
        out.push_str(
            "# flock NetworkPolicy: `nft -f` replaces the whole table in one transaction\n",
        );
        out.push_str(REMOVE_SCRIPT);
        let _ = writeln!(out, "table inet {TABLE} {{");
        for (name, set) in &self.sets {
            render_set(&mut out, name, set);
        }
        for direction in [Direction::Ingress, Direction::Egress] {
            let (map, chains) = names(direction);
            let _ = writeln!(out, "\tmap {map} {{\n\t\ttype ifname : verdict");
            let elements: Vec<String> = self
                .chains(direction)
                .keys()
                .map(|h| format!("\"{h}\" : jump {chains}{h}"))
                .collect();
            render_elements(&mut out, &elements);
            out.push_str("\t}\n");
        }
        let icmpv6: Vec<&str> = ALWAYS_ICMPV6.iter().map(|(_, n)| *n).collect();
        let _ = write!(
            out,
            "\tchain forward {{\n\
             \t\ttype filter hook forward priority filter; policy accept;\n\
             \t\tct state established,related accept\n\
             \t\ticmpv6 type {{ {} }} accept\n\
             \t\ticmp type destination-unreachable icmp code frag-needed accept\n\
             \t\tiifname vmap @{}\n\
             \t\toifname vmap @{}\n\
             \t}}\n",
            icmpv6.join(", "),
            names(Direction::Egress).0,
            names(Direction::Ingress).0,
        );
        for direction in [Direction::Ingress, Direction::Egress] {
            let prefix = names(direction).1;
            let verdict = match direction {
                // egress returns to the forward chain, where the receiver's ingress follows
                Direction::Egress => "return",
                Direction::Ingress => "accept",
            };
            for (host_if, allows) in self.chains(direction) {
                let _ = writeln!(out, "\tchain {prefix}{host_if} {{");
                for allow in allows {
                    let Some(m) = matches(allow, direction, &self.sets) else {
                        continue;
                    };
                    if m.is_empty() {
                        let _ = writeln!(out, "\t\t{verdict}");
                    } else {
                        let _ = writeln!(out, "\t\t{m} {verdict}");
                    }
                }
                out.push_str("\t\tdrop\n\t}\n");
            }
        }
        out.push_str("}\n");
        out
    }

    /// The commands that turn `old`'s applied table into this one when only set members
    /// changed (a pod joined or left a selector, got or lost an address): deletes, then adds,
    /// applied by one `nft -f` as one transaction. `None` when anything else changed (a
    /// policy, an isolated pod): apply [`render`](Self::render) instead. `Some("")` when
    /// nothing changed.
    pub fn update_from(&self, old: &Ruleset) -> Option<String> {
        if self.is_empty()
            || self.ingress != old.ingress
            || self.egress != old.egress
            || self.sets.len() != old.sets.len()
        {
            return None;
        }
        let mut deletes = String::new();
        let mut adds = String::new();
        for ((name, new), (old_name, old)) in self.sets.iter().zip(&old.sets) {
            if name != old_name || new.family != old.family || new.about != old.about {
                return None;
            }
            let (gone, came): (Vec<String>, Vec<String>) = match (&old.elements, &new.elements) {
                (Elements::Addrs(o), Elements::Addrs(n)) => (
                    o.difference(n).map(IpAddr::to_string).collect(),
                    n.difference(o).map(IpAddr::to_string).collect(),
                ),
                (Elements::AddrPorts(o), Elements::AddrPorts(n)) => (
                    o.difference(n).map(|(a, p)| format!("{a} . {p}")).collect(),
                    n.difference(o).map(|(a, p)| format!("{a} . {p}")).collect(),
                ),
                (o, n) if o == n => (Vec::new(), Vec::new()),
                _ => return None,
            };
            for (list, verb, out) in [(gone, "delete", &mut deletes), (came, "add", &mut adds)] {
                if !list.is_empty() {
                    let _ = writeln!(
                        out,
                        "{verb} element inet {TABLE} {name} {{ {} }}",
                        list.join(", ")
                    );
                }
            }
        }
        Some(deletes + &adds)
    }

    fn chains(&self, direction: Direction) -> &BTreeMap<String, Vec<Allow>> {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
}

/// The verdict map's name and the prefix of the per-pod chains.
fn names(direction: Direction) -> (&'static str, &'static str) {
    match direction {
        Direction::Ingress => ("ingress_pods", "ingress_"),
        Direction::Egress => ("egress_pods", "egress_"),
    }
}

fn nft_family(f: Family) -> (&'static str, &'static str, &'static str) {
    match f {
        Family::V6 => ("ip6", "ipv6_addr", "ipv6"),
        Family::V4 => ("ip", "ipv4_addr", "ipv4"),
    }
}

fn render_set(out: &mut String, name: &str, set: &AddrSet) {
    let (_, addr_type, _) = nft_family(set.family);
    let about: String = set
        .about
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let _ = writeln!(out, "\t# {about}\n\tset {name} {{");
    let elements: Vec<String> = match &set.elements {
        Elements::Addrs(a) => {
            let _ = writeln!(out, "\t\ttype {addr_type}");
            a.iter().map(IpAddr::to_string).collect()
        }
        Elements::Ranges(r) => {
            let _ = writeln!(out, "\t\ttype {addr_type}\n\t\tflags interval");
            r.iter().map(range).collect()
        }
        Elements::AddrPorts(e) => {
            let _ = writeln!(out, "\t\ttype {addr_type} . inet_service");
            e.iter().map(|(a, p)| format!("{a} . {p}")).collect()
        }
    };
    render_elements(out, &elements);
    out.push_str("\t}\n");
}

fn render_elements(out: &mut String, elements: &[String]) {
    if elements.is_empty() {
        return;
    }
    out.push_str("\t\telements = {\n");
    out.push_str(
        &elements
            .iter()
            .map(|e| format!("\t\t\t{e}"))
            .collect::<Vec<_>>()
            .join(",\n"),
    );
    out.push_str("\n\t\t}\n");
}

/// A range as a prefix when it is one (host prefixes as plain addresses), else `first-last`.
fn range(r: &AddrRange) -> String {
    match r.as_prefix() {
        Some(net) if net.prefix_len() == net.max_prefix_len() => net.addr().to_string(),
        Some(net) => net.to_string(),
        None => format!("{}-{}", r.first, r.last),
    }
}

/// The match part of an allow rule (empty: everything), `None` for a rule that can match
/// nothing (its family differs from a set's). A set is matched by its own family; one the
/// model lacks is still named, so nft refuses the script rather than allowing more.
fn matches(
    allow: &Allow,
    direction: Direction,
    sets: &BTreeMap<String, AddrSet>,
) -> Option<String> {
    let mut parts = Vec::new();
    let dir = match direction {
        Direction::Ingress => "saddr",
        Direction::Egress => "daddr",
    };
    let family_of = |set: &str| {
        let f = sets
            .get(set)
            .map(|s| s.family)
            .or(allow.family)
            .unwrap_or(Family::V6);
        (allow.family.is_none_or(|a| a == f)).then_some(f)
    };
    if let Some(set) = &allow.peer {
        let (ip, _, _) = nft_family(family_of(set)?);
        parts.push(format!("{ip} {dir} @{set}"));
    }
    if let Ports::Named { protocol, set } = &allow.ports {
        let (ip, _, _) = nft_family(family_of(set)?);
        parts.push(format!("{ip} daddr . {} dport @{set}", protocol.as_str()));
    }
    if let Some(f) = allow.family
        && parts.is_empty()
    {
        parts.push(format!("meta nfproto {}", nft_family(f).2));
    }
    if let Ports::Listed { protocol, ranges } = &allow.ports {
        let p = protocol.as_str();
        if ranges == &[(0, u16::MAX)] {
            parts.push(format!("meta l4proto {p}"));
        } else {
            let list: Vec<String> = ranges
                .iter()
                .map(|(lo, hi)| {
                    if lo == hi {
                        lo.to_string()
                    } else {
                        format!("{lo}-{hi}")
                    }
                })
                .collect();
            if list.len() == 1 {
                parts.push(format!("{p} dport {}", list[0]));
            } else {
                parts.push(format!("{p} dport {{ {} }}", list.join(", ")));
            }
        }
    }
    Some(parts.join(" "))
}
