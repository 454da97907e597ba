//! An evaluator of the rendered nftables *text*: it parses the script `render` writes (sets,
//! verdict maps, chains) and runs a packet through the `forward` hook as the kernel would —
//! first matching rule wins, `jump`, `goto` and `return`, `accept` ends the base chain, the chain
//! policy at the end; a `log prefix "…" group N` statement of a rule that matches records its
//! prefix ([`Nft::logged`]). It knows only the statements flock renders and panics on anything
//! else, so a change of the renderer cannot slip past the property test unevaluated.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::IpAddr;

use flock_policy::{Hop, Packet, Transport};
use ipnet::IpNet;

#[derive(Debug, Default)]
pub struct Nft {
    /// set name → elements as (first, last) address ranges
    addr_sets: BTreeMap<String, Vec<(IpAddr, IpAddr)>>,
    /// set name → (address, port) elements
    pair_sets: BTreeMap<String, Vec<(IpAddr, u16)>>,
    /// map name → ifname → chain
    maps: BTreeMap<String, BTreeMap<String, String>>,
    /// chain name → rules (each a list of tokens, the verdict last)
    chains: BTreeMap<String, Vec<Vec<String>>>,
    /// the prefixes logged by the last [`Nft::accepts`], in order
    logged: RefCell<Vec<String>>,
}

enum Outcome {
    Accept,
    Drop,
    Return,
}

fn addr_range(e: &str) -> (IpAddr, IpAddr) {
    if let Some((a, b)) = e.split_once('-') {
        (a.parse().unwrap(), b.parse().unwrap())
    } else if e.contains('/') {
        let n: IpNet = e.parse().unwrap();
        (n.network(), n.broadcast())
    } else {
        let a: IpAddr = e.parse().unwrap();
        (a, a)
    }
}

/// Splits a rule into tokens, a `{ a, b }` group being one token `{a,b}`.
fn tokens(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut group: Option<String> = None;
    for t in line.split_whitespace() {
        match (&mut group, t) {
            (None, "{") => group = Some(String::from("{")),
            (Some(g), "}") => {
                g.push('}');
                out.push(std::mem::take(g));
                group = None;
            }
            (Some(g), t) => g.push_str(t),
            (None, t) => out.push(t.to_owned()),
        }
    }
    out
}

/// Whether `d` is in `80` or `80-90` or `{80,443,1000-2000}`.
fn port_in(list: &str, d: u16) -> bool {
    list.trim_start_matches('{')
        .trim_end_matches('}')
        .split(',')
        .any(|r| match r.split_once('-') {
            Some((lo, hi)) => lo.parse::<u16>().unwrap() <= d && d <= hi.parse::<u16>().unwrap(),
            None => r.parse::<u16>().unwrap() == d,
        })
}

const ICMPV6_NAMES: [(u8, &str); 5] = [
    (2, "packet-too-big"),
    (133, "nd-router-solicit"),
    (134, "nd-router-advert"),
    (135, "nd-neighbor-solicit"),
    (136, "nd-neighbor-advert"),
];

impl Nft {
    /// Applies an update script (`Update::script`) to the parsed table as the kernel would,
    /// panicking where the kernel refuses one: a chain declared that exists (its rules would be
    /// appended), a chain deleted while a map element or another chain still jumps to it, an
    /// element added that is there or deleted that is not.
    pub fn apply_update(&mut self, script: &str) {
        let mut lines = script.lines();
        while let Some(line) = lines.next() {
            if line == "table inet flock_policy {" {
                let mut head = lines.next().expect("a set or a chain").trim();
                if head.starts_with('#') {
                    head = lines.next().expect("a set after its comment").trim();
                }
                if let Some(name) = head.strip_prefix("set ").and_then(|h| h.strip_suffix(" {")) {
                    assert!(!self.has_set(name), "set {name} declared again\n{script}");
                    self.read_set(name, &mut lines);
                    assert_eq!(lines.next(), Some("}"), "one set per table block");
                    continue;
                }
                let name = head
                    .strip_prefix("chain ")
                    .and_then(|h| h.strip_suffix(" {"))
                    .unwrap_or_else(|| panic!("unknown update line {head:?}"));
                assert!(
                    !self.chains.contains_key(name),
                    "chain {name} declared again: its rules would be appended\n{script}"
                );
                let mut rules = Vec::new();
                loop {
                    let l = lines.next().expect("the chain ends").trim();
                    if l == "}" {
                        break;
                    }
                    rules.push(tokens(l));
                }
                assert_eq!(lines.next(), Some("}"), "one chain per table block");
                for set in rules.iter().flatten().filter_map(|t| t.strip_prefix('@')) {
                    assert!(
                        self.has_set(set),
                        "chain {name} names a missing set {set}\n{script}"
                    );
                }
                self.chains.insert(name.to_owned(), rules);
            } else if let Some(name) = line.strip_prefix("delete set inet flock_policy ") {
                let at = format!("@{name}");
                let used = self
                    .chains
                    .values()
                    .flatten()
                    .any(|rule| rule.contains(&at));
                assert!(
                    !used,
                    "set {name} deleted while a rule names it: busy\n{script}"
                );
                assert!(
                    self.addr_sets.remove(name).is_some() || self.pair_sets.remove(name).is_some(),
                    "no set {name} to delete"
                );
            } else if let Some(name) = line.strip_prefix("delete chain inet flock_policy ") {
                let jumped = self.maps.values().any(|m| m.values().any(|c| c == name))
                    || self.chains.values().flatten().any(|rule| {
                        rule.windows(2)
                            .any(|w| (w[0] == "goto" || w[0] == "jump") && w[1] == name)
                    });
                assert!(!jumped, "chain {name} deleted while in use: busy\n{script}");
                assert!(
                    self.chains.remove(name).is_some(),
                    "no chain {name} to delete"
                );
            } else if let Some((add, rest)) = line
                .strip_prefix("add element inet flock_policy ")
                .map(|r| (true, r))
                .or_else(|| {
                    line.strip_prefix("delete element inet flock_policy ")
                        .map(|r| (false, r))
                })
            {
                let (set, list) = rest.split_once(" { ").expect("set { elements }");
                let list = list.strip_suffix(" }").expect("elements }");
                for e in list.split(", ") {
                    self.element(set, e, add);
                }
            } else if !line.is_empty() {
                panic!("unknown update line {line:?}");
            }
        }
    }

    fn element(&mut self, set: &str, e: &str, add: bool) {
        if let Some(map) = self.maps.get_mut(set) {
            let w: Vec<&str> = e.split_whitespace().collect();
            let key = w[0].trim_matches('"').to_owned();
            if add {
                let [_, ":", "jump", chain] = w.as_slice() else {
                    panic!("unknown map element {e:?}")
                };
                assert!(
                    self.chains.contains_key(*chain),
                    "{key} jumps to a missing chain {chain}"
                );
                assert!(map.insert(key, (*chain).to_owned()).is_none(), "{e} exists");
            } else {
                assert!(map.remove(&key).is_some(), "no element {e} in {set}");
            }
        } else if let Some(pairs) = self.pair_sets.get_mut(set) {
            let (a, p) = e.split_once(" . ").expect("addr . port");
            let pair = (a.parse().unwrap(), p.parse().unwrap());
            if add {
                assert!(!pairs.contains(&pair), "{e} exists in {set}");
                pairs.push(pair);
            } else {
                let before = pairs.len();
                pairs.retain(|x| *x != pair);
                assert_eq!(pairs.len() + 1, before, "no element {e} in {set}");
            }
        } else {
            let ranges = self
                .addr_sets
                .get_mut(set)
                .unwrap_or_else(|| panic!("no set {set}"));
            let r = addr_range(e);
            if add {
                assert!(!ranges.contains(&r), "{e} exists in {set}");
                ranges.push(r);
            } else {
                let before = ranges.len();
                ranges.retain(|x| *x != r);
                assert_eq!(ranges.len() + 1, before, "no element {e} in {set}");
            }
        }
    }

    /// Whether both hold the same sets (in any order), maps and chains.
    pub fn same_as(&self, other: &Nft) -> bool {
        let sorted = |n: &Nft| {
            let mut a = n.addr_sets.clone();
            a.values_mut().for_each(|v| v.sort());
            let mut p = n.pair_sets.clone();
            p.values_mut().for_each(|v| v.sort());
            (a, p)
        };
        sorted(self) == sorted(other) && self.maps == other.maps && self.chains == other.chains
    }

    /// Reads the body of set `name` (after its `set NAME {` line, through its `}`).
    fn read_set<'a>(&mut self, name: &str, lines: &mut impl Iterator<Item = &'a str>) {
        let mut concat = false;
        let mut elements = Vec::new();
        loop {
            match lines.next().expect("set ends").trim() {
                "}" => break,
                "flags interval" | "type ipv6_addr" | "type ipv4_addr" => {}
                "type ipv6_addr . inet_service" | "type ipv4_addr . inet_service" => {
                    concat = true;
                }
                "elements = {" => loop {
                    let e = lines.next().expect("elements end").trim();
                    if e == "}" {
                        break;
                    }
                    elements.push(e.trim_end_matches(',').to_owned());
                },
                other => panic!("unknown set line {other:?}"),
            }
        }
        if concat {
            let pairs = elements
                .iter()
                .map(|e| {
                    let (a, p) = e.split_once(" . ").expect("addr . port");
                    (a.parse().unwrap(), p.parse().unwrap())
                })
                .collect();
            self.pair_sets.insert(name.to_owned(), pairs);
        } else {
            let ranges = elements.iter().map(|e| addr_range(e)).collect();
            self.addr_sets.insert(name.to_owned(), ranges);
        }
    }

    /// Whether set `name` exists.
    fn has_set(&self, name: &str) -> bool {
        self.addr_sets.contains_key(name) || self.pair_sets.contains_key(name)
    }

    pub fn parse(script: &str) -> Nft {
        let mut nft = Nft::default();
        let mut lines = script.lines().map(str::trim);
        while let Some(line) = lines.next() {
            if line.is_empty()
                || line.starts_with('#')
                || line == "table inet flock_policy {}"
                || line == "delete table inet flock_policy"
                || line == "table inet flock_policy {"
                || line == "}"
            {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["set", name, "{"] => nft.read_set(name, &mut lines),
                ["map", name, "{"] => {
                    let mut m = BTreeMap::new();
                    loop {
                        match lines.next().expect("map ends") {
                            "}" => break,
                            "type ifname : verdict" | "elements = {" => {}
                            e => {
                                let w: Vec<&str> =
                                    e.trim_end_matches(',').split_whitespace().collect();
                                match w.as_slice() {
                                    [ifname, ":", "jump", chain] => {
                                        m.insert(
                                            ifname.trim_matches('"').to_owned(),
                                            (*chain).to_owned(),
                                        );
                                    }
                                    _ => panic!("unknown map line {e:?}"),
                                }
                            }
                        }
                    }
                    nft.maps.insert((*name).to_owned(), m);
                }
                ["chain", name, "{"] => {
                    let mut rules = Vec::new();
                    loop {
                        let l = lines.next().expect("chain ends");
                        if l == "}" {
                            break;
                        }
                        if l == "type filter hook forward priority filter; policy accept;" {
                            continue;
                        }
                        rules.push(tokens(l));
                    }
                    nft.chains.insert((*name).to_owned(), rules);
                }
                _ => panic!("unknown line {line:?}"),
            }
        }
        nft
    }

    /// The prefixes the last [`accepts`](Self::accepts) logged, in order.
    pub fn logged(&self) -> Vec<String> {
        self.logged.borrow().clone()
    }

    /// Whether the packet (the first of its connection) passes the table.
    pub fn accepts(&self, p: &Packet) -> bool {
        self.logged.borrow_mut().clear();
        let (Hop::Link(iif), Hop::Link(oif)) = (&p.from, &p.to) else {
            return true; // not forwarded: the table's only hook is forward
        };
        if self.chains.is_empty() {
            return true;
        }
        // the forward chain's policy is accept
        !matches!(self.run("forward", p, iif, oif), Outcome::Drop)
    }

    fn run(&self, chain: &str, p: &Packet, iif: &str, oif: &str) -> Outcome {
        for rule in &self.chains[chain] {
            if let [dir, vmap, map] = rule.as_slice()
                && vmap == "vmap"
            {
                let ifname = match dir.as_str() {
                    "iifname" => iif,
                    "oifname" => oif,
                    d => panic!("unknown vmap key {d:?}"),
                };
                // a key the map lacks: no verdict, next rule
                if let Some(target) = self.maps[&map[1..]].get(ifname) {
                    match self.run(target, p, iif, oif) {
                        Outcome::Return => continue,
                        o => return o,
                    }
                }
                continue;
            }
            // `goto CHAIN`: CHAIN's outcome is this chain's (its return goes to our caller)
            if let [matches @ .., goto, target] = rule.as_slice()
                && goto == "goto"
            {
                if self.matches(matches, p) {
                    return self.run(target, p, iif, oif);
                }
                continue;
            }
            let (verdict, matches) = rule.split_last().expect("a rule has a verdict");
            if !self.matches(matches, p) {
                continue;
            }
            match verdict.as_str() {
                "accept" => return Outcome::Accept,
                "drop" => return Outcome::Drop,
                "return" => return Outcome::Return,
                v => panic!("unknown verdict {v:?}"),
            }
        }
        Outcome::Return
    }

    fn matches(&self, t: &[String], p: &Packet) -> bool {
        let v6 = p.src.is_ipv6();
        let (proto, dport) = match p.transport {
            Transport::Tcp(d) => ("tcp", Some(d)),
            Transport::Udp(d) => ("udp", Some(d)),
            Transport::Sctp(d) => ("sctp", Some(d)),
            Transport::Icmp { .. } => ("icmp", None),
            Transport::Icmpv6 { .. } => ("ipv6-icmp", None),
            Transport::Other(_) => ("other", None),
        };
        let tok = |i: usize| t.get(i).map(String::as_str).unwrap_or("");
        let mut i = 0;
        while i < t.len() {
            match (tok(i), tok(i + 1), tok(i + 2)) {
                ("ct", "state", "established,related") => return false, // first packets only
                ("log", "prefix", first) if first.starts_with('"') => {
                    // a statement: the rule's matches before it matched
                    let mut words = Vec::new();
                    let mut j = i + 2;
                    loop {
                        let w = tok(j);
                        assert!(!w.is_empty(), "an unterminated log prefix in {t:?}");
                        words.push(w);
                        j += 1;
                        if w.ends_with('"') && (w.len() > 1 || words.len() > 1) {
                            break;
                        }
                    }
                    assert_eq!(tok(j), "group", "a log statement without its group: {t:?}");
                    assert!(tok(j + 1).parse::<u16>().is_ok(), "group {:?}", tok(j + 1));
                    let prefix = words.join(" ");
                    self.logged
                        .borrow_mut()
                        .push(prefix.trim_matches('"').to_owned());
                    i = j + 2;
                }
                (ip @ ("ip6" | "ip"), "daddr", ".") => {
                    // ip6 daddr . tcp dport @set
                    let (l4, set) = (tok(i + 3), tok(i + 5));
                    assert_eq!(tok(i + 4), "dport");
                    if (ip == "ip6") != v6 || l4 != proto {
                        return false;
                    }
                    let Some(d) = dport else { return false };
                    if !self.pair_sets[&set[1..]].contains(&(p.dst, d)) {
                        return false;
                    }
                    i += 6;
                }
                (ip @ ("ip6" | "ip"), dir @ ("saddr" | "daddr"), set) if set.starts_with('@') => {
                    if (ip == "ip6") != v6 {
                        return false;
                    }
                    let a = if dir == "saddr" { p.src } else { p.dst };
                    let inside = self.addr_sets[&set[1..]]
                        .iter()
                        .any(|(f, l)| f.is_ipv6() == a.is_ipv6() && *f <= a && a <= *l);
                    if !inside {
                        return false;
                    }
                    i += 3;
                }
                ("meta", "nfproto", fam) => {
                    if (fam == "ipv6") != v6 {
                        return false;
                    }
                    i += 3;
                }
                ("meta", "l4proto", l4) => {
                    if l4 != proto {
                        return false;
                    }
                    i += 3;
                }
                (l4 @ ("tcp" | "udp" | "sctp"), "dport", list) => {
                    match dport.filter(|_| l4 == proto) {
                        Some(d) if port_in(list, d) => {}
                        _ => return false,
                    }
                    i += 3;
                }
                ("icmpv6", "type", list) => {
                    let Transport::Icmpv6 { kind, .. } = p.transport else {
                        return false;
                    };
                    let names: Vec<&str> = list
                        .trim_matches(|c| c == '{' || c == '}')
                        .split(',')
                        .collect();
                    if !ICMPV6_NAMES
                        .iter()
                        .any(|(k, n)| *k == kind && names.contains(n))
                    {
                        return false;
                    }
                    i += 3;
                }
                ("icmp", "type", "destination-unreachable") => {
                    assert_eq!(
                        (tok(i + 3), tok(i + 4), tok(i + 5)),
                        ("icmp", "code", "frag-needed")
                    );
                    if p.transport != (Transport::Icmp { kind: 3, code: 4 }) {
                        return false;
                    }
                    i += 6;
                }
                other => panic!("unknown match {other:?} in {t:?}"),
            }
        }
        true
    }
}
