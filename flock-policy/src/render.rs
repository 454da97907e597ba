//! The [`Ruleset`] as an nftables script: one table, replaced in one transaction.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use crate::addr::{AddrRange, Family};
use crate::cluster::Action;
use crate::model::{
    ALWAYS_ICMPV6, AddrSet, Allow, Chain, Direction, Elements, LOG_GROUP, LogMode, Member, Ports,
    Ruleset, TierRule, log_prefix,
};
use crate::state::{ChainChange, Delta};

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
        let classes = [Direction::Ingress, Direction::Egress].map(|d| self.classes(d));
        for (direction, class) in [Direction::Ingress, Direction::Egress].iter().zip(&classes) {
            let map = names(*direction).0;
            let _ = writeln!(out, "\tmap {map} {{\n\t\ttype ifname : verdict");
            let elements: Vec<String> = self
                .chains(*direction)
                .iter()
                .map(|(h, chain)| format!("\"{h}\" : jump {}", class[chain].name))
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
        // one chain per distinct rendering: replicas of a workload share theirs, and so do
        // different rule lists that render alike
        for class in &classes {
            let chains: BTreeMap<&String, &String> =
                class.values().flat_map(|r| r.chains()).collect();
            for (name, body) in chains {
                let _ = writeln!(out, "\tchain {name} {{\n{body}\t}}");
            }
        }
        out.push_str("}\n");
        out
    }

    /// The commands that turn `old`'s applied table into this one without replacing it
    /// (the same sets, only their members, isolated pods or their rules changed), as one
    /// `nft -f` script; `None` when a set came or went (or either table is empty): apply
    /// [`render`](Self::render) instead. `Some("")` when nothing changed.
    pub fn update_from(&self, old: &Ruleset) -> Option<String> {
        self.delta_from(old).map(|d| self.update(&d).script())
    }

    /// What changed from `old` to this ruleset, as a [`Delta`]; `None` when the sets
    /// themselves differ (names, families, what they stand for, ranges) or either ruleset is
    /// empty (no table to change, or one to remove).
    pub fn delta_from(&self, old: &Ruleset) -> Option<Delta> {
        if self.is_empty() || old.is_empty() || self.sets.len() != old.sets.len() {
            return None;
        }
        let mut elements = Vec::new();
        for ((name, new), (old_name, old)) in self.sets.iter().zip(&old.sets) {
            if name != old_name || new.family != old.family || new.about != old.about {
                return None;
            }
            let mut diff = |gone: Vec<Member>, came: Vec<Member>| {
                elements.extend(gone.into_iter().map(|m| (name.clone(), m, false)));
                elements.extend(came.into_iter().map(|m| (name.clone(), m, true)));
            };
            match (&old.elements, &new.elements) {
                (Elements::Addrs(o), Elements::Addrs(n)) => diff(
                    o.difference(n).map(|a| Member::Addr(*a)).collect(),
                    n.difference(o).map(|a| Member::Addr(*a)).collect(),
                ),
                (Elements::AddrPorts(o), Elements::AddrPorts(n)) => diff(
                    o.difference(n)
                        .map(|(a, p)| Member::AddrPort(*a, *p))
                        .collect(),
                    n.difference(o)
                        .map(|(a, p)| Member::AddrPort(*a, *p))
                        .collect(),
                ),
                (o, n) if o == n => {}
                _ => return None,
            }
        }
        elements.sort();
        let mut chains = Vec::new();
        for direction in [Direction::Ingress, Direction::Egress] {
            let (old, new) = (old.chains(direction), self.chains(direction));
            let hosts: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
            for h in hosts {
                let (before, after) = (old.get(h), new.get(h));
                if before != after {
                    chains.push(ChainChange {
                        direction,
                        host_if: h.clone(),
                        before: before.cloned(),
                        after: after.cloned(),
                    });
                }
            }
        }
        Some(Delta {
            elements,
            chains,
            sets: Vec::new(),
        })
    }

    /// The [`Update`] that brings the table of the ruleset `delta` was taken from (before
    /// it) to this one: chains that come, elements, chains that go.
    pub fn update(&self, delta: &Delta) -> Update {
        let mut update = Update::default();
        let gone: BTreeMap<&str, Family> = delta
            .sets
            .iter()
            .filter(|s| !s.came)
            .map(|s| (s.name.as_str(), s.family))
            .collect();
        // a chain of before the change is named as it was rendered then, sets that went
        // included
        let before = |set: &str| gone.get(set).copied().or_else(|| self.family(set));
        for s in delta.sets.iter().filter(|s| s.came) {
            let mut body = String::new();
            render_set(&mut body, &s.name, &self.sets[&s.name]);
            update.new_sets.push((s.name.clone(), body));
        }
        update
            .gone_sets
            .extend(gone.keys().map(|name| (*name).to_owned()));
        for direction in [Direction::Ingress, Direction::Egress] {
            let changes: Vec<&ChainChange> = delta
                .chains
                .iter()
                .filter(|c| c.direction == direction)
                .collect();
            if changes.is_empty() {
                continue;
            }
            // Chains are named by their rendered rules, and two different rule lists may render
            // alike (a rule that can match nothing renders as nothing; an Admin tier and a
            // Baseline tier of the same rules): a kernel chain is used by every veth whose
            // chain renders to its name, so the uses are counted by name.
            let current = self.classes(direction);
            let mut rendered: BTreeMap<&Chain, Rendered> = BTreeMap::new();
            for c in &changes {
                for chain in [&c.before, &c.after].into_iter().flatten() {
                    if !current.contains_key(chain) && !rendered.contains_key(chain) {
                        rendered.insert(chain, render_chain(direction, chain, &before));
                    }
                }
            }
            let of = |chain: &Chain| -> &Rendered {
                current
                    .get(chain)
                    .or_else(|| rendered.get(chain))
                    .expect("rendered above")
            };
            // veths per name, after the change and before it
            let mut uses: BTreeMap<&str, (isize, isize, &Rendered)> = BTreeMap::new();
            for chain in self.chains(direction).values() {
                let r = &current[chain];
                uses.entry(r.name.as_str()).or_insert((0, 0, r)).1 += 1;
            }
            for c in &changes {
                if let Some(before) = &c.before {
                    let r = of(before);
                    uses.entry(r.name.as_str()).or_insert((0, 0, r)).0 += 1;
                }
                if let Some(after) = &c.after {
                    let r = of(after);
                    uses.entry(r.name.as_str()).or_insert((0, 0, r)).0 -= 1;
                }
            }
            for (before, after, r) in uses.values() {
                let before = before + after; // the counts of the untouched veths are the same
                if before <= 0 && *after > 0 {
                    // a Pass target first: the chain jumps to it
                    update
                        .new_chains
                        .extend(r.chains().rev().map(|(n, b)| (n.clone(), b.clone())));
                } else if before > 0 && *after <= 0 {
                    update
                        .gone_chains
                        .extend(r.chains().map(|(n, _)| n.clone()));
                }
            }
            let map = names(direction).0;
            for c in changes {
                let target = |a: &Option<Chain>| a.as_ref().map(|a| of(a).name.clone());
                let (before, after) = (target(&c.before), target(&c.after));
                if before == after {
                    continue;
                }
                if before.is_some() {
                    update.elements.push(ElementOp {
                        add: false,
                        set: map.to_owned(),
                        element: Element::Jump {
                            host_if: c.host_if.clone(),
                            chain: String::new(),
                        },
                    });
                }
                if let Some(chain) = after {
                    update.elements.push(ElementOp {
                        add: true,
                        set: map.to_owned(),
                        element: Element::Jump {
                            host_if: c.host_if.clone(),
                            chain,
                        },
                    });
                }
            }
        }
        for (set, member, add) in &delta.elements {
            update.elements.push(ElementOp {
                add: *add,
                set: set.clone(),
                element: Element::Member(*member),
            });
        }
        // deletes first: a veth moving to another chain is a delete and an add
        update.elements.sort_by_key(|op| op.add);
        update
    }

    /// The family of set `name`, if the ruleset has it.
    fn family(&self, name: &str) -> Option<Family> {
        self.sets.get(name).map(|s| s.family)
    }

    /// The rendered chains of each distinct [`Chain`] of `direction`.
    fn classes(&self, direction: Direction) -> BTreeMap<&Chain, Rendered> {
        let mut out = BTreeMap::new();
        for chain in self.chains(direction).values() {
            if !out.contains_key(chain) {
                out.insert(chain, render_chain(direction, chain, &|s| self.family(s)));
            }
        }
        out
    }
}

/// One element to add to or delete from a set or a verdict map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElementOp {
    /// Add (`true`) or delete.
    pub add: bool,
    /// The set or map.
    pub set: String,
    /// The element.
    pub element: Element,
}

/// An element of one of flock's sets or verdict maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Element {
    /// A selector set's member.
    Member(Member),
    /// A verdict map's element: the host veth and the chain it jumps to (empty in a delete,
    /// which names the key only).
    Jump {
        /// The host veth.
        host_if: String,
        /// The chain.
        chain: String,
    },
}

impl Element {
    fn render(&self, add: bool) -> String {
        match self {
            Element::Member(Member::Addr(a)) => a.to_string(),
            Element::Member(Member::AddrPort(a, p)) => format!("{a} . {p}"),
            Element::Jump { host_if, chain } if add => format!("\"{host_if}\" : jump {chain}"),
            Element::Jump { host_if, .. } => format!("\"{host_if}\""),
        }
    }
}

/// The family of a set by its name, as a chain's rules are rendered with it.
type Families<'a> = &'a dyn Fn(&str) -> Option<Family>;

/// A change of flock's table in place: sets that come (name and definition), chains that
/// come (name and body), set and map elements deleted and added (deletes first), chains
/// that go, sets that go. Applied as one transaction, it leaves the same table as
/// [`Ruleset::render`] of the new ruleset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Update {
    /// Sets to create before any chain names them: `(name, definition)`.
    pub new_sets: Vec<(String, String)>,
    /// Chains to create before anything jumps to them: `(name, rules)`.
    pub new_chains: Vec<(String, String)>,
    /// Elements, deletes first.
    pub elements: Vec<ElementOp>,
    /// Chains nothing jumps to any more.
    pub gone_chains: Vec<String>,
    /// Sets no chain names any more (deleted after the chains).
    pub gone_sets: Vec<String>,
}

impl Update {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty() && self.elements_only()
    }

    /// Whether it only adds and deletes elements (no set or chain comes or goes).
    pub fn elements_only(&self) -> bool {
        self.new_sets.is_empty()
            && self.new_chains.is_empty()
            && self.gone_chains.is_empty()
            && self.gone_sets.is_empty()
    }

    /// The update as an `nft -f` script (one transaction); empty when it changes nothing.
    pub fn script(&self) -> String {
        let mut out = String::new();
        for (_, definition) in &self.new_sets {
            let _ = write!(out, "table inet {TABLE} {{\n{definition}}}\n");
        }
        for (name, body) in &self.new_chains {
            let _ = writeln!(
                out,
                "table inet {TABLE} {{\n\tchain {name} {{\n{body}\t}}\n}}"
            );
        }
        let mut i = 0;
        while i < self.elements.len() {
            let first = &self.elements[i];
            let mut list = Vec::new();
            while i < self.elements.len()
                && self.elements[i].add == first.add
                && self.elements[i].set == first.set
            {
                list.push(self.elements[i].element.render(first.add));
                i += 1;
            }
            let verb = if first.add { "add" } else { "delete" };
            let _ = writeln!(
                out,
                "{verb} element inet {TABLE} {} {{ {} }}",
                first.set,
                list.join(", ")
            );
        }
        for name in &self.gone_chains {
            let _ = writeln!(out, "delete chain inet {TABLE} {name}");
        }
        for name in &self.gone_sets {
            let _ = writeln!(out, "delete set inet {TABLE} {name}");
        }
        out
    }
}

/// A [`Chain`] as nftables chains: the one the verdict map jumps to and, when an Admin rule
/// passes, the one it goes to (the NetworkPolicy or Baseline tier).
struct Rendered {
    name: String,
    body: String,
    pass: Option<(String, String)>,
}

impl Rendered {
    /// The chain, then its Pass target.
    fn chains(&self) -> impl DoubleEndedIterator<Item = (&String, &String)> {
        std::iter::once((&self.name, &self.body)).chain(self.pass.as_ref().map(|(n, b)| (n, b)))
    }
}

/// A chain's name (from its rules, so equal rule lists share one chain, and the name is the
/// same whoever computes it) and its rules. A chain of NetworkPolicy allows only is those
/// allows and `drop`; Admin rules come before them, Baseline rules in their place when no
/// NetworkPolicy isolates the pod.
fn render_chain(direction: Direction, chain: &Chain, sets: Families<'_>) -> Rendered {
    let accept = verdict(
        match direction {
            // egress returns to the forward chain, where the receiver's ingress follows
            Direction::Egress => "return",
            Direction::Ingress => "accept",
        },
        true,
        direction,
        chain.log,
    );
    let accept = accept.as_str();
    let drop = verdict("drop", false, direction, chain.log);
    let drop = drop.as_str();
    let mut tail = String::new();
    match &chain.policy {
        Some(allows) => {
            for allow in allows {
                rule(&mut tail, allow, direction, sets, accept);
            }
            let _ = writeln!(tail, "\t\t{drop}");
        }
        None => {
            tier(
                &mut tail,
                &chain.baseline,
                direction,
                sets,
                accept,
                drop,
                accept,
            );
            // what no tier decided passes: logged as allowed when every decision is
            if chain.log == Some(LogMode::All) {
                let _ = writeln!(tail, "\t\t{accept}");
            }
        }
    }
    let passes = chain.admin.iter().any(|r| r.action == Action::Pass);
    if !passes {
        let mut body = String::new();
        tier(&mut body, &chain.admin, direction, sets, accept, drop, "");
        body.push_str(&tail);
        return Rendered {
            name: chain_name(direction, &body),
            body,
            pass: None,
        };
    }
    // Pass skips the rest of the Admin tier: the next tier is a chain of its own
    let mut whole = String::new();
    tier(
        &mut whole,
        &chain.admin,
        direction,
        sets,
        accept,
        drop,
        "pass",
    );
    whole.push_str(&tail);
    let name = chain_name(direction, &whole);
    let target = format!("{name}_next");
    let mut body = String::new();
    let goto = format!("goto {target}");
    let pass = if tail.is_empty() {
        accept
    } else {
        goto.as_str()
    };
    tier(&mut body, &chain.admin, direction, sets, accept, drop, pass);
    if !tail.is_empty() {
        let _ = writeln!(body, "\t\t{goto}");
    }
    Rendered {
        name,
        body,
        pass: (!tail.is_empty()).then_some((target, tail)),
    }
}

/// A verdict, after the statement that logs it when the chain logs such decisions.
fn verdict(word: &str, allowed: bool, direction: Direction, log: Option<LogMode>) -> String {
    let logged = match log {
        Some(LogMode::All) => true,
        Some(LogMode::Deny) => !allowed,
        None => false,
    };
    if logged {
        format!(
            "log prefix \"{}\" group {LOG_GROUP} {word}",
            log_prefix(allowed, direction)
        )
    } else {
        word.to_owned()
    }
}

/// The rules of a cluster tier: Accept as `accept`, Deny as `drop`, Pass as `pass`.
fn tier(
    out: &mut String,
    rules: &[TierRule],
    direction: Direction,
    sets: Families<'_>,
    accept: &str,
    drop: &str,
    pass: &str,
) {
    for r in rules {
        let verdict = match r.action {
            Action::Accept => accept,
            Action::Deny => drop,
            Action::Pass => pass,
        };
        rule(out, &r.matches, direction, sets, verdict);
    }
}

/// One rule: the match of `allow` and `verdict`; nothing for a match that can match nothing.
fn rule(out: &mut String, allow: &Allow, direction: Direction, sets: Families<'_>, verdict: &str) {
    let Some(m) = matches(allow, direction, sets) else {
        return;
    };
    if m.is_empty() {
        let _ = writeln!(out, "\t\t{verdict}");
    } else {
        let _ = writeln!(out, "\t\t{m} {verdict}");
    }
}

/// `PREFIX<hash of body>`: FNV-1a 64, stable across processes and releases (a chain's name
/// is kernel state).
fn chain_name(direction: Direction, body: &str) -> String {
    let hash = body.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{}{hash:016x}", names(direction).1)
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
fn matches(allow: &Allow, direction: Direction, sets: Families<'_>) -> Option<String> {
    let mut parts = Vec::new();
    let dir = match direction {
        Direction::Ingress => "saddr",
        Direction::Egress => "daddr",
    };
    let family_of = |set: &str| {
        let f = sets(set).or(allow.family).unwrap_or(Family::V6);
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
