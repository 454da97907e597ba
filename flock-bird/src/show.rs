//! Reading what `birdc` prints for an operator's questions: each BGP session in detail
//! (`show protocols all`), the routes a session sends and learns (`show route export P`,
//! `show route protocol P`) and BFD's sessions (`show bfd sessions`). BIRD 2.0's formats.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::birdc::{ProtocolRow, parse_row, table_lines};
use crate::error::{Error, Result};

/// One channel (address family) of a protocol, from `show protocols all`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "camelCase"))]
pub struct ChannelDetail {
    /// `ipv6` or `ipv4`.
    pub name: String,
    /// The channel's state (`UP`, `DOWN`, `START`, …).
    pub state: String,
    /// Routes accepted from the protocol (for BGP: prefixes received and kept).
    pub imported: u64,
    /// Routes sent to the protocol (for BGP: prefixes announced).
    pub exported: u64,
}

/// One protocol of `birdc show protocols all`: its row and what the detail lines say.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "camelCase"))]
pub struct ProtocolDetail {
    /// The row, as `show protocols` prints it.
    pub row: ProtocolRow,
    /// `Description:` (flock writes `flock neighbor ADDRESS ASN`).
    pub description: Option<String>,
    /// `BGP state:` (BGP only).
    pub bgp_state: Option<String>,
    /// `Neighbor address:`, with `%IFACE` for a link-local one (BGP only).
    pub neighbor_address: Option<String>,
    /// `Neighbor AS:` (BGP only).
    pub neighbor_as: Option<u32>,
    /// `Local AS:` (BGP only).
    pub local_as: Option<u32>,
    /// `Last error:`, when the session has one.
    pub last_error: Option<String>,
    /// The protocol's channels.
    pub channels: Vec<ChannelDetail>,
}

impl ProtocolDetail {
    /// Routes imported over every channel.
    pub fn imported(&self) -> u64 {
        self.channels.iter().map(|c| c.imported).sum()
    }

    /// Routes exported over every channel.
    pub fn exported(&self) -> u64 {
        self.channels.iter().map(|c| c.exported).sum()
    }
}

/// Parses `birdc show protocols all` (BIRD 2): each protocol's row followed by indented
/// detail lines. Fails as [`parse_show_protocols`](crate::parse_show_protocols) does when
/// there is no protocol table, or when a `Routes:` line does not read as BIRD writes it.
pub fn parse_show_protocols_all(text: &str) -> Result<Vec<ProtocolDetail>> {
    let lines = table_lines(text)?;
    let mut out: Vec<ProtocolDetail> = Vec::new();
    for line in lines {
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(char::is_whitespace) {
            let Some(row) = parse_row(line)? else {
                continue;
            };
            out.push(ProtocolDetail {
                row,
                description: None,
                bgp_state: None,
                neighbor_address: None,
                neighbor_as: None,
                local_as: None,
                last_error: None,
                channels: Vec::new(),
            });
            continue;
        }
        let Some(p) = out.last_mut() else { continue };
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix("Channel ") {
            p.channels.push(ChannelDetail {
                name: name.trim().to_owned(),
                ..ChannelDetail::default()
            });
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "Description" => p.description = Some(value.to_owned()),
            "BGP state" => p.bgp_state = Some(value.to_owned()),
            "Neighbor address" => p.neighbor_address = Some(value.to_owned()),
            "Neighbor AS" => p.neighbor_as = value.parse().ok(),
            "Local AS" => p.local_as = value.parse().ok(),
            "Last error" => p.last_error = Some(value.to_owned()),
            "State" => {
                if let Some(c) = p.channels.last_mut() {
                    c.state = value.to_owned();
                }
            }
            "Routes" => {
                if let Some(c) = p.channels.last_mut() {
                    let (imported, exported) =
                        route_counts(value).ok_or_else(|| Error::ShowProtocols {
                            reason: "a Routes line is not \"N imported, M exported, …\"",
                            line: trimmed.to_owned(),
                        })?;
                    c.imported = imported;
                    c.exported = exported;
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// `2 imported, 2 exported, 2 preferred` (also with `N filtered` after imported).
fn route_counts(value: &str) -> Option<(u64, u64)> {
    let mut imported = None;
    let mut exported = None;
    for part in value.split(',') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            return None;
        };
        let n: u64 = n.parse().ok()?;
        match what {
            "imported" => imported = Some(n),
            "exported" => exported = Some(n),
            _ => {}
        }
    }
    Some((imported?, exported?))
}

/// The prefixes of `birdc show route …` (`show route export P`, `show route protocol P`),
/// each once, in BIRD's order (its tables one after the other). Fails when the text is
/// neither a route listing nor BIRD's empty answer (only the banner).
pub fn parse_show_route(text: &str) -> Result<Vec<IpNet>> {
    let mut out: Vec<IpNet> = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with(char::is_whitespace) {
            continue;
        }
        if (line.starts_with("BIRD ") && line.ends_with(" ready.")) || line.starts_with("Table ") {
            continue;
        }
        let first = line.split_whitespace().next().unwrap_or_default();
        let net: IpNet = first.parse().map_err(|_| Error::Show {
            command: "show route",
            reason: "a line is neither a table's name nor a route",
            line: line.to_owned(),
        })?;
        if !out.contains(&net) {
            out.push(net);
        }
    }
    Ok(out)
}

/// One session of `birdc show bfd sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "camelCase"))]
pub struct BfdSession {
    /// The BFD protocol (`flock_bfd`).
    pub protocol: String,
    /// The peer's address.
    pub address: IpAddr,
    /// The interface, or `---`.
    pub interface: String,
    /// `Up`, `Down`, `Init`, `AdminDown`.
    pub state: String,
    /// Since when.
    pub since: String,
}

impl BfdSession {
    /// Whether BFD sees the peer.
    pub fn is_up(&self) -> bool {
        self.state == "Up"
    }
}

/// Parses `birdc show bfd sessions`: for each BFD protocol a `NAME:` line, a header, and
/// its sessions. Fails on a session row that does not read.
pub fn parse_show_bfd_sessions(text: &str) -> Result<Vec<BfdSession>> {
    let mut protocol = String::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        match cols.as_slice() {
            [] => {}
            [b, ..] if *b == "BIRD" => {}
            ["IP", "address", ..] => {}
            [name] if name.ends_with(':') => protocol = name.trim_end_matches(':').to_owned(),
            [address, interface, state, since, ..] => out.push(BfdSession {
                protocol: protocol.clone(),
                address: address.parse().map_err(|_| Error::Show {
                    command: "show bfd sessions",
                    reason: "a session's first column is not an address",
                    line: line.trim().to_owned(),
                })?,
                interface: (*interface).to_owned(),
                state: (*state).to_owned(),
                since: (*since).to_owned(),
            }),
            _ => {
                return Err(Error::Show {
                    command: "show bfd sessions",
                    reason: "a line is neither a protocol, a header nor a session",
                    line: line.trim().to_owned(),
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real output of BIRD 2.0.12 running flock's configuration (the lab's node1: a numbered
    // IPv6 session carrying both families, BFD on).
    const ALL: &str = include_str!("testdata/show_protocols_all.txt");
    const EXPORT: &str = include_str!("testdata/show_route_export.txt");
    const LEARNED: &str = include_str!("testdata/show_route_protocol.txt");
    const BFD: &str = include_str!("testdata/show_bfd_sessions.txt");

    #[test]
    fn reads_a_bgp_session_and_its_channels() {
        let all = parse_show_protocols_all(ALL).unwrap();
        assert_eq!(all.len(), 9);
        let bgp: Vec<&ProtocolDetail> = all.iter().filter(|p| p.row.is_bgp()).collect();
        assert_eq!(bgp.len(), 1);
        let s = bgp[0];
        assert_eq!(s.row.name, "peer6_2001_db8_f1_1__1");
        assert_eq!(s.row.bgp_state(), Some("Established"));
        assert_eq!(s.bgp_state.as_deref(), Some("Established"));
        assert_eq!(s.neighbor_address.as_deref(), Some("2001:db8:f1:1::1"));
        assert_eq!(s.neighbor_as, Some(65000));
        assert_eq!(s.local_as, Some(64601));
        assert_eq!(
            s.description.as_deref(),
            Some("flock neighbor 2001:db8:f1:1::1 AS65000")
        );
        let names: Vec<&str> = s.channels.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["ipv6", "ipv4"]);
        assert!(s.channels.iter().all(|c| c.state == "UP"));
        assert_eq!((s.imported(), s.exported()), (4, 4));
        // the kernel protocol's counts are its own, not the session's
        let kernel = all.iter().find(|p| p.row.name == "flock_kernel6").unwrap();
        assert_eq!((kernel.imported(), kernel.exported()), (0, 2));
        assert_eq!(kernel.neighbor_address, None);
    }

    #[test]
    fn a_session_that_is_down_keeps_its_last_error() {
        let text = "BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
peer6_x    BGP        ---        start  09:10:36.285  Active        Socket: Connection refused
  Description:    flock neighbor 2001:db8::fe AS65000
  BGP state:          Active
    Neighbor address: 2001:db8::fe
    Neighbor AS:      65000
    Local AS:         64601
    Connect delay:    2.163/5
    Last error:       Socket: Connection refused
  Channel ipv6
    State:          DOWN
    Table:          master6
    Preference:     100
    Input filter:   flock_import6
    Output filter:  flock_export6
";
        let all = parse_show_protocols_all(text).unwrap();
        assert_eq!(all[0].bgp_state.as_deref(), Some("Active"));
        assert_eq!(
            all[0].last_error.as_deref(),
            Some("Socket: Connection refused")
        );
        assert_eq!(all[0].channels[0].state, "DOWN");
        assert_eq!(all[0].imported(), 0);
    }

    #[test]
    fn refuses_what_is_not_a_protocol_table() {
        let e = parse_show_protocols_all("Unable to connect to server control socket").unwrap_err();
        assert!(e.to_string().contains("no protocol table"), "{e}");
        let bad_routes = "Name Proto Table State Since Info
p  BGP  ---  up  09:10:36.285  Established
  Channel ipv6
    Routes:         many imported
";
        let e = parse_show_protocols_all(bad_routes).unwrap_err();
        assert!(e.to_string().contains("many imported"), "{e}");
    }

    #[test]
    fn reads_the_routes_a_session_sends_and_learns() {
        let sent: Vec<String> = parse_show_route(EXPORT)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            sent,
            [
                "2001:db8:a1::/64",
                "2001:db8:53::53/128",
                "10.53.0.53/32",
                "10.101.1.0/24"
            ]
        );
        let learned = parse_show_route(LEARNED).unwrap();
        assert_eq!(learned.len(), 4);
        assert!(learned.contains(&"2001:db8:a2::/64".parse().unwrap()));
        assert_eq!(parse_show_route("BIRD 2.0.12 ready.\n").unwrap(), []);
        let e = parse_show_route("Unable to connect to server control socket").unwrap_err();
        assert!(e.to_string().contains("show route"), "{e}");
    }

    #[test]
    fn reads_bfd_sessions() {
        let s = parse_show_bfd_sessions(BFD).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].protocol, "flock_bfd");
        assert_eq!(s[0].address, "2001:db8:f1:1::1".parse::<IpAddr>().unwrap());
        assert_eq!(s[0].interface, "uplink");
        assert!(s[0].is_up());
        assert!(
            parse_show_bfd_sessions("BIRD 2.0.12 ready.\nflock_bfd:\n")
                .unwrap()
                .is_empty()
        );
        assert!(parse_show_bfd_sessions("garbage here").is_err());
    }
}
