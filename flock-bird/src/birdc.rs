//! Parsing what `birdc` prints.

use crate::error::{Error, Result};

/// One row of `birdc show protocols`: BIRD's six columns.
///
/// ```text
/// Name       Proto      Table      State  Since         Info
/// peer6_2001_db8__fe BGP        ---        start  09:10:36.285  Active        Socket: Connection refused
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "camelCase"))]
pub struct ProtocolRow {
    /// The protocol's name (`flock_device`, `peer6_2001_db8__fe`).
    pub name: String,
    /// Its kind as BIRD writes it: `BGP`, `Device`, `Kernel`, `Static`, `BFD`, …
    pub proto: String,
    /// Its table (`master6`), or `---` for protocols without one.
    pub table: String,
    /// BIRD's protocol state: `up`, `down`, `start`, `stop`.
    pub state: String,
    /// Since when it is in that state, as BIRD formats it (`09:10:22.336` today,
    /// `2026-11-21` before, or `2026-11-21 09:10:22` with `timeformat protocol iso long`).
    pub since: String,
    /// The Info column, runs of spaces collapsed: for BGP the session state and the last
    /// error (`Established`, `Active Socket: Connection refused`); often empty otherwise.
    pub info: String,
}

impl ProtocolRow {
    /// Whether this is a BGP session.
    pub fn is_bgp(&self) -> bool {
        self.proto == "BGP"
    }

    /// A BGP session's state — the first word of Info (`Established`, `Active`, `Connect`,
    /// `Idle`, `OpenSent`, `OpenConfirm`) — or `None` for other protocols and for a session
    /// BIRD shows without one (a disabled protocol, state `down`).
    pub fn bgp_state(&self) -> Option<&str> {
        if !self.is_bgp() {
            return None;
        }
        self.info.split(' ').next().filter(|s| !s.is_empty())
    }

    /// The one word that says how the protocol is doing: a BGP session's state when BIRD
    /// shows one, the State column otherwise.
    pub fn summary_state(&self) -> &str {
        self.bgp_state().unwrap_or(&self.state)
    }
}

const HEADER: [&str; 6] = ["Name", "Proto", "Table", "State", "Since", "Info"];

/// Parses the output of `birdc show protocols` (BIRD 2): the `BIRD … ready.` banner, the
/// header, then one row per protocol.
///
/// Fails with [`Error::ShowProtocols`] when the text holds no protocol table — `birdc`
/// printed an error instead, such as `Unable to connect to server control socket` — or a
/// row has fewer than five columns.
///
/// ```
/// let text = "BIRD 2.0.12 ready.
/// Name       Proto      Table      State  Since         Info
/// flock_device Device     ---        up     09:10:22.336
/// peer6_2001_db8__fe BGP        ---        start  09:10:36.285  Active        Socket: Connection refused
/// ";
/// let rows = flock_bird::parse_show_protocols(text)?;
/// assert_eq!(rows[0].summary_state(), "up");
/// assert_eq!(rows[1].bgp_state(), Some("Active"));
/// assert_eq!(rows[1].info, "Active Socket: Connection refused");
/// assert!(flock_bird::parse_show_protocols("Unable to connect to server control socket").is_err());
/// # Ok::<(), flock_bird::Error>(())
/// ```
pub fn parse_show_protocols(text: &str) -> Result<Vec<ProtocolRow>> {
    let lines = table_lines(text)?;
    let mut rows = Vec::new();
    for line in lines {
        if let Some(row) = parse_row(line)? {
            rows.push(row);
        }
    }
    Ok(rows)
}

/// One row of the protocol table; `None` for a blank line.
pub(crate) fn parse_row(line: &str) -> Result<Option<ProtocolRow>> {
    let cols: Vec<&str> = line.split_whitespace().collect();
    if cols.is_empty() {
        return Ok(None);
    }
    let [name, proto, table, state, since, rest @ ..] = &cols[..] else {
        return Err(Error::ShowProtocols {
            reason: "a row has fewer than the five columns Name, Proto, Table, State and Since",
            line: line.trim().to_owned(),
        });
    };
    let (since, info) = match rest {
        [time, info @ ..] if is_date(since) && is_time(time) => (format!("{since} {time}"), info),
        info => ((*since).to_owned(), info),
    };
    Ok(Some(ProtocolRow {
        name: (*name).to_owned(),
        proto: (*proto).to_owned(),
        table: (*table).to_owned(),
        state: (*state).to_owned(),
        since,
        info: info.join(" "),
    }))
}

/// The lines of `text` after the protocol table's header; an error when there is none
/// (`birdc` printed an error instead).
pub(crate) fn table_lines(text: &str) -> Result<std::str::Lines<'_>> {
    let mut lines = text.lines();
    if lines.any(|l| l.split_whitespace().eq(HEADER.iter().copied())) {
        Ok(lines)
    } else {
        Err(Error::ShowProtocols {
            reason: "no protocol table (no \"Name Proto Table State Since Info\" header)",
            line: text.trim().to_owned(),
        })
    }
}

/// `2026-11-21`.
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        })
}

/// `09:10:22` or `09:10:22.336`.
fn is_time(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 8
        && b[2] == b':'
        && b[5] == b':'
        && b.iter()
            .all(|c| c.is_ascii_digit() || *c == b':' || *c == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node running flock's configuration next to a peer, BIRD 2.0.12 (Debian bookworm):
    /// one session Established, one connecting, one refused, one idle, one disabled.
    const NODE: &str = "BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
flock_device Device     ---        up     09:10:22.336  
flock_routes6 Static     master6    up     09:10:22.336  
flock_routes4 Static     master4    up     09:10:22.336  
flock_kernel6 Kernel     master6    up     09:10:22.336  
flock_kernel4 Kernel     master4    up     09:10:22.336  
flock_bfd  BFD        ---        up     09:10:22.336  
peer6_2001_db8_ab__2 BGP        ---        up     09:10:23.112  Established   
peer6_2001_db8_ab__99 BGP        ---        start  09:10:22.336  Connect       
peer4_10_0_0_9 BGP        ---        start  09:10:22.336  Idle          
tor_off    BGP        ---        down   09:10:36.285  
peer6_refused BGP        ---        start  09:10:36.285  Active        Socket: Connection refused
";

    fn row(
        name: &str,
        proto: &str,
        table: &str,
        state: &str,
        since: &str,
        info: &str,
    ) -> ProtocolRow {
        ProtocolRow {
            name: name.into(),
            proto: proto.into(),
            table: table.into(),
            state: state.into(),
            since: since.into(),
            info: info.into(),
        }
    }

    #[test]
    fn parses_every_row_of_a_real_node() {
        let rows = parse_show_protocols(NODE).unwrap();
        assert_eq!(rows.len(), 11);
        assert_eq!(
            rows[0],
            row("flock_device", "Device", "---", "up", "09:10:22.336", "")
        );
        assert_eq!(
            rows[1],
            row(
                "flock_routes6",
                "Static",
                "master6",
                "up",
                "09:10:22.336",
                ""
            )
        );
        assert_eq!(
            rows[6],
            row(
                "peer6_2001_db8_ab__2",
                "BGP",
                "---",
                "up",
                "09:10:23.112",
                "Established"
            )
        );
        assert_eq!(
            rows[10],
            row(
                "peer6_refused",
                "BGP",
                "---",
                "start",
                "09:10:36.285",
                "Active Socket: Connection refused"
            )
        );
        let summary: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r.name.as_str(), r.summary_state()))
            .collect();
        assert_eq!(
            summary,
            [
                ("flock_device", "up"),
                ("flock_routes6", "up"),
                ("flock_routes4", "up"),
                ("flock_kernel6", "up"),
                ("flock_kernel4", "up"),
                ("flock_bfd", "up"),
                ("peer6_2001_db8_ab__2", "Established"),
                ("peer6_2001_db8_ab__99", "Connect"),
                ("peer4_10_0_0_9", "Idle"),
                ("tor_off", "down"),
                ("peer6_refused", "Active"),
            ]
        );
        let bgp: Vec<Option<&str>> = rows
            .iter()
            .filter(|r| r.is_bgp())
            .map(|r| r.bgp_state())
            .collect();
        assert_eq!(
            bgp,
            [
                Some("Established"),
                Some("Connect"),
                Some("Idle"),
                None,
                Some("Active")
            ]
        );
        assert_eq!(rows[0].bgp_state(), None, "not BGP");
    }

    #[test]
    fn a_peer_that_reset_the_session_and_a_single_protocol() {
        // the other end of `birdc disable` on the node above
        let peer = "BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
flock_device Device     ---        up     09:10:22.343  
peer6_2001_db8_ab__1 BGP        ---        start  09:10:56.170  Active        Socket: Connection reset by peer
";
        let rows = parse_show_protocols(peer).unwrap();
        assert_eq!(rows[1].info, "Active Socket: Connection reset by peer");
        assert_eq!(rows[1].summary_state(), "Active");
        // `birdc show protocols NAME`
        let one = "BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
peer6_2001_db8_ab__2 BGP        ---        down   09:10:56.169  
";
        let rows = parse_show_protocols(one).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].summary_state(), "down");
    }

    #[test]
    fn long_iso_times_and_older_dates() {
        // `timeformat protocol iso long;`
        let long = "BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
flock_device Device     ---        up     2026-11-23 09:10:22  
peer6_2001_db8_ab__2 BGP        ---        up     2026-11-23 09:10:23  Established   
";
        let rows = parse_show_protocols(long).unwrap();
        assert_eq!(rows[0].since, "2026-11-23 09:10:22");
        assert_eq!(rows[0].info, "");
        assert_eq!(rows[1].since, "2026-11-23 09:10:23");
        assert_eq!(rows[1].bgp_state(), Some("Established"));
        // the default format shows the date alone for a state entered before today
        let old = "Name       Proto      Table      State  Since         Info
n_10_0_0_8 BGP        ---        start  2026-11-21    Idle          
";
        let rows = parse_show_protocols(old).unwrap();
        assert_eq!(
            (rows[0].since.as_str(), rows[0].info.as_str()),
            ("2026-11-21", "Idle")
        );
    }

    #[test]
    fn an_empty_table_is_no_protocols_but_no_table_is_an_error() {
        let empty =
            "BIRD 2.0.12 ready.\nName       Proto      Table      State  Since         Info\n";
        assert_eq!(parse_show_protocols(empty).unwrap(), vec![]);
        for text in [
            "",
            "Unable to connect to server control socket (/run/flock/bird.ctl): No such file or directory",
            "BIRD 2.0.12 ready.\nsyntax error, unexpected CF_SYM_UNDEFINED, expecting END or CF_SYM_KNOWN or TEXT or ALL",
        ] {
            let e = parse_show_protocols(text).unwrap_err();
            assert!(matches!(e, Error::ShowProtocols { .. }), "{e:?}");
        }
        let e = parse_show_protocols(
            "Name       Proto      Table      State  Since         Info\nflock_device Device ---\n",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "birdc show protocols: a row has fewer than the five columns Name, Proto, Table, State and Since: \"flock_device Device ---\""
        );
        let e = parse_show_protocols("Unable to connect to server control socket").unwrap_err();
        assert_eq!(
            e.to_string(),
            "birdc show protocols: no protocol table (no \"Name Proto Table State Since Info\" header): \"Unable to connect to server control socket\""
        );
    }
}
