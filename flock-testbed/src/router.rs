//! The BGP router of the lab and of the cluster: one BIRD 2 configuration for both.
//!
//! The router is not a flock node. It learns every node's pod prefixes, anycast and Service
//! addresses over BGP, installs them in its kernel (equal-cost paths merged, so an anycast
//! address has a next hop per node) and passes them on to the other nodes. It announces its
//! own addresses (on its `lo`) so that pods can answer it. Fast timers: a session is up in
//! about a second, and a node that stops answering is dropped at the hold time (6 s), or by BFD
//! when the peer asks for it.

use std::fmt::Write as _;

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
                conf.push_str("  bfd on;\n");
            }
            if let Some(password) = peer.password {
                let _ = writeln!(conf, "  password \"{password}\";");
            }
            conf.push_str("}\n");
        }
        conf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_peer_with_its_options() {
        let router = Router {
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
        };
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
    }
}
