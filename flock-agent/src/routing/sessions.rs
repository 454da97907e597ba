//! BGP sessions as BIRD shows them: `birdc show protocols` read into each session's state and
//! BIRD's reason when it is down, for the NodeConfig status and `/readyz`.

use std::collections::BTreeMap;

use super::BirdError;
use super::bird::BirdTarget;
use flock_k8s_api::{NeighborStatus, NodeConfigStatus};

/// Protocol name → state, from `birdc show protocols` (parsed by `flock-bird`): a BGP
/// session's state (`Established`, `Active`, `Idle`, …) followed by the rest of BIRD's Info
/// column, which says why a session is down (`Active Socket: Connection refused`), when BIRD
/// shows one; the State column (`up`, `down`, `start`) otherwise
/// ([`flock_bird::ProtocolRow::summary_state`]).
///
/// A dynamic link-local neighbor (`interface` without `address`) is listed by BIRD as its
/// listener `NAME` (`Passive`) and one `NAME_1`, `NAME_2`, … per connected peer: the
/// neighbor's state is that of its first spawned session, if any.
pub fn protocol_states(text: &str) -> Result<BTreeMap<String, String>, flock_bird::Error> {
    let rows = flock_bird::parse_show_protocols(text)?;
    let mut states: BTreeMap<String, String> = BTreeMap::new();
    for row in &rows {
        let state = match row.bgp_state() {
            Some(_) => row.info.clone(),
            None => row.summary_state().to_owned(),
        };
        states.insert(row.name.clone(), state);
    }
    for row in rows.iter().rev() {
        if let Some((listener, n)) = row.name.rsplit_once('_')
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
            && states
                .get(listener)
                .is_some_and(|s| s.starts_with("Passive"))
            && row.is_bgp()
        {
            states.insert(listener.to_owned(), row.info.clone());
        }
    }
    Ok(states)
}

/// Runs `birdc -s SOCK show protocols`: each protocol's state.
pub async fn show_protocols(target: &BirdTarget) -> Result<BTreeMap<String, String>, BirdError> {
    const COMMAND: &str = "show protocols";
    let out = target.birdc(&["show", "protocols"]).await?;
    if !out.status.success() {
        return Err(target.refused(COMMAND, &out));
    }
    protocol_states(&String::from_utf8_lossy(&out.stdout)).map_err(|source| BirdError::Reply {
        program: target.birdc.clone(),
        socket: target.socket.clone(),
        command: COMMAND,
        source: Box::new(source),
    })
}

/// `1 of 2 BGP sessions established; 2001:db8::fd Active (Socket: Connection refused)`.
pub(crate) fn established_message(up: usize, bgp: &[NeighborStatus]) -> String {
    let mut message = format!("{up} of {} BGP sessions established", bgp.len());
    for n in bgp.iter().filter(|n| n.state != "Established") {
        message.push_str(&format!("; {} {}", n.neighbor, n.state));
        if let Some(info) = &n.info {
            message.push_str(&format!(" ({info})"));
        }
    }
    message
}

/// The BGP sessions of `status` that are not Established, and why (`None`: all are, or the
/// node has no BGP); what `/readyz` reports as its `bgp` problem.
pub fn sessions_down(status: &NodeConfigStatus) -> Option<String> {
    let down: Vec<String> = status
        .bgp
        .iter()
        .filter(|n| n.state != "Established")
        .map(|n| match &n.info {
            Some(info) => format!("{} {} ({info})", n.neighbor, n.state),
            None => format!("{} {}", n.neighbor, n.state),
        })
        .collect();
    (!down.is_empty()).then(|| format!("sessions not Established: {}", down.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOW: &str = "BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
device1    Device     ---        up     03:10:39.588  
kernel6    Kernel     master6    up     03:10:39.588  
n_2001_db8__fe BGP        ---        up     03:10:40.101  Established   
n_10_0_0_9 BGP        ---        start  03:10:39.588  Active        Socket: Connection refused
n_10_0_0_8 BGP        ---        start  2026-11-21    Idle          
peer6_eth1 BGP        ---        start  03:10:39.588  Passive       
peer6_eth1_1 BGP        ---        up     03:10:40.201  Established   
peer6_eth2 BGP        ---        start  03:10:39.588  Passive       
";

    #[test]
    fn protocol_states_are_bgp_session_states_or_protocol_states() {
        let p = protocol_states(SHOW).expect("a protocol table");
        assert_eq!(p["device1"], "up");
        assert_eq!(p["kernel6"], "up");
        assert_eq!(p["n_2001_db8__fe"], "Established");
        // The reason follows the state: the status shows it.
        assert_eq!(p["n_10_0_0_9"], "Active Socket: Connection refused");
        assert_eq!(p["n_10_0_0_8"], "Idle");
        // A dynamic link-local neighbor takes the state of its spawned session.
        assert_eq!(p["peer6_eth1"], "Established");
        assert_eq!(p["peer6_eth2"], "Passive");
        assert_eq!(p.len(), 8);
        assert!(protocol_states("Unable to connect to server control socket").is_err());
    }

    #[test]
    fn readyz_names_the_sessions_that_are_down() {
        let mut status = NodeConfigStatus::default();
        assert_eq!(sessions_down(&status), None);
        status.bgp = vec![
            NeighborStatus {
                neighbor: "2001:db8::fe".into(),
                state: "Established".into(),
                info: None,
            },
            NeighborStatus {
                neighbor: "10.0.0.254".into(),
                state: "Active".into(),
                info: Some("Socket: Connection refused".into()),
            },
        ];
        assert_eq!(
            sessions_down(&status).as_deref(),
            Some("sessions not Established: 10.0.0.254 Active (Socket: Connection refused)")
        );
    }
}
