//! `kubectl flock status` and `bgp`: each node's health from its agent's report, its pods'
//! and its NodeConfig — a pure function of those ([`node_status`]), so what counts as a
//! problem is tested without a cluster.

use std::net::IpAddr;

use flock_agent::inspect::{NodeReport, Read};
use flock_k8s_api::NodeConfig;
use ipnet::IpNet;
use serde::Serialize;

use crate::cluster::FlockPod;

/// One BGP session of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStatus {
    /// BIRD's protocol name.
    pub name: String,
    /// The neighbor (`2001:db8::fe`, `fe80::1%uplink`).
    pub neighbor: String,
    /// The BGP state (`Established`, `Active`, …); the NodeConfig's last known one, with
    /// `known` false, when BIRD does not answer.
    pub state: String,
    /// Whether `state` is BIRD's answer now (false: the NodeConfig status's last write).
    pub known: bool,
    /// Since when, as BIRD writes it.
    pub since: String,
    /// The last error or BIRD's Info beyond the state.
    pub info: String,
    /// Prefixes announced.
    pub sent: Option<u64>,
    /// Prefixes learned.
    pub received: Option<u64>,
    /// BFD's state for the neighbor, when BFD runs for it.
    pub bfd: Option<String>,
    /// What the node announces on it (`bgp` only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub announced: Vec<IpNet>,
    /// What it learned (`bgp` only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub learned: Vec<IpNet>,
}

/// Addresses of one family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Family {
    /// The node's CIDR.
    pub cidr: IpNet,
    /// Addresses held by pods.
    pub used: u64,
    /// Addresses left: the CIDR's size less `used`, as text (`2^64-3` for a /64).
    pub free: String,
}

/// One of flock's pods on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodHealth {
    /// The pod.
    pub name: String,
    /// Ready.
    pub ready: bool,
    /// Its image.
    pub image: String,
    /// Container restarts.
    pub restarts: i32,
}

/// One node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// The node.
    pub node: String,
    /// The agent's pod.
    pub agent: Option<PodHealth>,
    /// The agent's version, from its report.
    pub version: Option<String>,
    /// BIRD's pod.
    pub bird: Option<PodHealth>,
    /// Whether the node has a NodeConfig.
    pub node_config: bool,
    /// The NodePool it came from, if one.
    pub pool: Option<String>,
    /// IPv6.
    pub ipv6: Option<Family>,
    /// IPv4.
    pub ipv4: Option<Family>,
    /// BGP sessions.
    pub sessions: Vec<SessionStatus>,
    /// NetworkPolicy enforcement: the NodeConfig's `NetworkPolicy` condition (`applied`, or
    /// its reason and message).
    pub policy: Option<String>,
    /// What is wrong, one line each.
    pub problems: Vec<String>,
}

/// What one node's status is computed from.
#[derive(Debug, Clone, Copy)]
pub struct NodeInputs<'a> {
    /// The node.
    pub node: &'a str,
    /// Its agent's pod.
    pub agent: Option<&'a FlockPod>,
    /// Its BIRD's pod.
    pub bird: Option<&'a FlockPod>,
    /// Its NodeConfig.
    pub config: Option<&'a NodeConfig>,
    /// Its agent's report, or why there is none.
    pub report: Result<&'a NodeReport, &'a str>,
}

fn health(p: &FlockPod) -> PodHealth {
    PodHealth {
        name: p.name.clone(),
        ready: p.ready,
        image: p.image.clone(),
        restarts: p.restarts,
    }
}

/// The node's status and its problems.
pub fn node_status(i: NodeInputs<'_>) -> NodeStatus {
    let mut problems = Vec::new();
    let node = i.node;
    match i.agent {
        None => problems.push(format!("{node}: no flock agent pod on the node")),
        Some(a) if !a.ready => {
            let why = i
                .report
                .ok()
                .and_then(|r| r.readiness.ok())
                .map(|r| r.body.clone())
                .unwrap_or_else(|| a.phase.clone());
            problems.push(format!("{node}: agent pod {} is not ready ({why})", a.name));
        }
        Some(_) => {}
    }
    let report = match i.report {
        Ok(r) => Some(r),
        Err(why) => {
            if i.agent.is_some() {
                problems.push(format!("{node}: {why}"));
            }
            None
        }
    };
    // the agent's own answer, which the pod's readiness learns only at its next probe
    if let (Some(r), Some(a)) = (report, i.agent)
        && a.ready
    {
        match &r.readiness {
            Read::Error(e) => problems.push(format!("{node}: the agent does not answer ({e})")),
            Read::Ok(r) if !r.ready => {
                problems.push(format!("{node}: the agent is not ready: {}", r.body))
            }
            Read::Ok(_) => {}
        }
    }
    let bgp = i.config.and_then(|c| c.spec.bgp.as_ref()).is_some();
    if bgp {
        match i.bird {
            None => problems.push(format!("{node}: no BIRD pod on the node")),
            Some(b) if !b.ready => {
                problems.push(format!("{node}: BIRD pod {} is not ready", b.name))
            }
            Some(_) => {}
        }
    }
    let config_status = i.config.and_then(|c| c.status.as_ref());
    let condition =
        |t: &str| config_status.and_then(|s| s.conditions.iter().find(|c| c.type_ == t));
    match i.config {
        None => problems.push(format!(
            "{node}: no NodeConfig: new pods cannot get addresses"
        )),
        Some(_) => {
            if let Some(c) = condition("NodeConfigValid").filter(|c| c.status != "True") {
                problems.push(format!("{node}: NodeConfig not valid: {}", c.message));
            }
        }
    }
    if let Some(r) = report
        && let Some(e) = r.store.error()
    {
        problems.push(format!("{node}: {e}"));
    }

    let records = report.and_then(|r| r.store.ok());
    let used = |v6: bool| -> u64 {
        records
            .into_iter()
            .flatten()
            .map(|a| {
                a.record
                    .pooled_addresses()
                    .iter()
                    .filter(|x| x.is_ipv6() == v6)
                    .count() as u64
            })
            .sum()
    };
    let family = |cidr: Option<&String>, v6: bool| -> Option<Family> {
        let cidr: IpNet = cidr?.parse().ok()?;
        let used = used(v6);
        Some(Family {
            cidr,
            used,
            free: free(&cidr, used),
        })
    };
    let spec = i.config.map(|c| &c.spec);
    let ipv6 = family(spec.and_then(|s| s.cidr6.as_ref()), true);
    let ipv4 = family(spec.and_then(|s| s.cidr4.as_ref()), false);

    let mut sessions = Vec::new();
    if bgp {
        match report.map(|r| &r.bird) {
            Some(Read::Ok(bird)) => {
                for s in &bird.sessions {
                    let d = &s.detail;
                    let neighbor = d.neighbor_address.clone().unwrap_or_default();
                    let state = d
                        .bgp_state
                        .clone()
                        .or_else(|| d.row.bgp_state().map(str::to_owned))
                        .unwrap_or_else(|| d.row.state.clone());
                    let info = d.last_error.clone().unwrap_or_else(|| {
                        d.row
                            .info
                            .strip_prefix(&state)
                            .unwrap_or(&d.row.info)
                            .trim()
                            .to_owned()
                    });
                    let bfd = bird.bfd.ok().and_then(|b| {
                        let addr: IpAddr = neighbor.split('%').next()?.parse().ok()?;
                        b.iter()
                            .find(|b| b.address == addr)
                            .map(|b| b.state.clone())
                    });
                    let session = SessionStatus {
                        name: d.row.name.clone(),
                        neighbor: neighbor.clone(),
                        state: state.clone(),
                        known: true,
                        since: d.row.since.clone(),
                        info,
                        sent: Some(d.exported()),
                        received: Some(d.imported()),
                        bfd,
                        announced: s.announced.ok().cloned().unwrap_or_default(),
                        learned: s.learned.ok().cloned().unwrap_or_default(),
                    };
                    if state != "Established" {
                        problems.push(format!(
                            "{node}: BGP session {} to {neighbor} is {state}{}",
                            session.name,
                            match session.info.as_str() {
                                "" => String::new(),
                                i => format!(" ({i})"),
                            }
                        ));
                    } else if session.bfd.as_deref().is_some_and(|b| b != "Up") {
                        problems.push(format!(
                            "{node}: BFD to {neighbor} is {}",
                            session.bfd.as_deref().unwrap_or_default()
                        ));
                    }
                    sessions.push(session);
                }
            }
            Some(Read::Error(e)) => {
                let last: Vec<String> = config_status
                    .map(|s| {
                        s.bgp
                            .iter()
                            .map(|n| format!("{} (last known {})", n.neighbor, n.state))
                            .collect()
                    })
                    .unwrap_or_default();
                problems.push(format!(
                    "{node}: BIRD does not answer ({e}); its sessions: {}",
                    if last.is_empty() {
                        "none known".to_owned()
                    } else {
                        last.join(", ")
                    }
                ));
                for n in config_status.map(|s| s.bgp.as_slice()).unwrap_or_default() {
                    sessions.push(SessionStatus {
                        name: String::new(),
                        neighbor: n.neighbor.clone(),
                        state: n.state.clone(),
                        known: false,
                        since: String::new(),
                        info: "BIRD does not answer; the NodeConfig's last known state".into(),
                        sent: None,
                        received: None,
                        bfd: None,
                        announced: Vec::new(),
                        learned: Vec::new(),
                    });
                }
            }
            None => {}
        }
    }

    let policy = condition("NetworkPolicy").map(|c| match c.status.as_str() {
        "True" => "applied".to_owned(),
        _ => format!("{}: {}", c.reason, c.message),
    });
    if let Some(c) = condition("NetworkPolicy").filter(|c| c.status != "True") {
        problems.push(format!("{node}: NetworkPolicy not applied: {}", c.message));
    }
    if let Some(c) = condition("PoliciesValid").filter(|c| c.status != "True") {
        problems.push(format!("{node}: {}", c.message));
    }

    NodeStatus {
        node: node.to_owned(),
        agent: i.agent.map(health),
        version: report.map(|r| r.version.clone()),
        bird: i.bird.map(health),
        node_config: i.config.is_some(),
        pool: i.config.and_then(|c| {
            c.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(flock_k8s_api::POOL_LABEL).cloned())
        }),
        ipv6,
        ipv4,
        sessions,
        policy,
        problems,
    }
}

/// The addresses of `cidr` less `used`: a number up to 2^32, `2^N-used` beyond.
pub fn free(cidr: &IpNet, used: u64) -> String {
    let bits = u32::from(cidr.max_prefix_len() - cidr.prefix_len());
    if bits <= 32 {
        (1u64 << bits).saturating_sub(used).to_string()
    } else if used == 0 {
        format!("2^{bits}")
    } else {
        format!("2^{bits}-{used}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, record, stored};
    use flock_agent::inspect::{Bird, Session};
    use flock_bird::{BfdSession, ChannelDetail, ProtocolDetail, ProtocolRow};
    use flock_k8s_api::{NeighborStatus, NodeConfigSpec, NodeConfigStatus};

    fn pod(name: &str, ready: bool) -> FlockPod {
        FlockPod {
            name: name.into(),
            node: "node1".into(),
            ready,
            image: "flock:test".into(),
            restarts: 0,
            phase: "Running".into(),
        }
    }

    fn config(status: Option<NodeConfigStatus>) -> NodeConfig {
        let spec: NodeConfigSpec = serde_json::from_value(serde_json::json!({
            "cidr6": "2001:db8:a1::/64",
            "cidr4": "10.101.1.0/24",
            "bgp": { "asn": 64601, "routerId": "10.0.0.1", "neighbors": [{ "address": "2001:db8:f1:1::1", "asn": 65000 }] }
        }))
        .unwrap();
        let mut c = NodeConfig::new("node1", spec);
        c.status = status;
        c
    }

    fn session(state: &str, info: &str) -> Session {
        Session {
            detail: ProtocolDetail {
                row: ProtocolRow {
                    name: "peer6_x".into(),
                    proto: "BGP".into(),
                    table: "---".into(),
                    state: "up".into(),
                    since: "00:27:43.941".into(),
                    info: format!("{state} {info}").trim().to_owned(),
                },
                description: None,
                bgp_state: Some(state.into()),
                neighbor_address: Some("2001:db8:f1:1::1".into()),
                neighbor_as: Some(65000),
                local_as: Some(64601),
                last_error: (!info.is_empty()).then(|| info.to_owned()),
                channels: vec![ChannelDetail {
                    name: "ipv6".into(),
                    state: "UP".into(),
                    imported: 2,
                    exported: 3,
                }],
            },
            announced: Read::Ok(vec!["2001:db8:a1::/64".parse().unwrap()]),
            learned: Read::Ok(vec![]),
        }
    }

    fn report(bird: Read<Bird>) -> NodeReport {
        let r = record(
            "c1",
            "default/web-1",
            "",
            "2001:db8:a1::5",
            "10.101.1.5",
            "flock01234567",
        );
        fixtures::report(vec![stored(r, true)], &["flock01234567"], &[], bird)
    }

    fn bfd(state: &str) -> Read<Vec<BfdSession>> {
        Read::Ok(vec![BfdSession {
            protocol: "flock_bfd".into(),
            address: "2001:db8:f1:1::1".parse().unwrap(),
            interface: "uplink".into(),
            state: state.into(),
            since: "00:27:43.902".into(),
        }])
    }

    fn inputs<'a>(
        agent: &'a FlockPod,
        bird: &'a FlockPod,
        config: &'a NodeConfig,
        report: &'a NodeReport,
    ) -> NodeInputs<'a> {
        NodeInputs {
            node: "node1",
            agent: Some(agent),
            bird: Some(bird),
            config: Some(config),
            report: Ok(report),
        }
    }

    #[test]
    fn a_healthy_node_has_no_problem_and_counts_its_addresses() {
        let (a, b, c) = (
            pod("flock-a", true),
            pod("flock-bird-a", true),
            config(None),
        );
        let r = report(Read::Ok(Bird {
            sessions: vec![session("Established", "")],
            bfd: bfd("Up"),
        }));
        let s = node_status(inputs(&a, &b, &c, &r));
        assert_eq!(s.problems, Vec::<String>::new());
        assert_eq!(s.ipv6.as_ref().unwrap().used, 1);
        assert_eq!(s.ipv6.as_ref().unwrap().free, "2^64-1");
        assert_eq!(s.ipv4.as_ref().unwrap().free, "255");
        assert_eq!(s.sessions[0].sent, Some(3));
        assert_eq!(s.sessions[0].bfd.as_deref(), Some("Up"));
    }

    #[test]
    fn a_session_down_or_bfd_down_is_a_problem_naming_the_node_and_neighbor() {
        let (a, b, c) = (
            pod("flock-a", true),
            pod("flock-bird-a", true),
            config(None),
        );
        let r = report(Read::Ok(Bird {
            sessions: vec![session("Active", "Socket: Connection refused")],
            bfd: bfd("Down"),
        }));
        let s = node_status(inputs(&a, &b, &c, &r));
        assert_eq!(
            s.problems,
            [
                "node1: BGP session peer6_x to 2001:db8:f1:1::1 is Active (Socket: Connection refused)"
            ]
        );
        let r = report(Read::Ok(Bird {
            sessions: vec![session("Established", "")],
            bfd: bfd("Down"),
        }));
        let s = node_status(inputs(&a, &b, &c, &r));
        assert_eq!(s.problems, ["node1: BFD to 2001:db8:f1:1::1 is Down"]);
    }

    #[test]
    fn a_frozen_bird_names_the_node_and_the_sessions_it_last_had() {
        let status = NodeConfigStatus {
            bgp: vec![NeighborStatus {
                neighbor: "2001:db8:f1:1::1".into(),
                state: "Established".into(),
                info: None,
            }],
            ..NodeConfigStatus::default()
        };
        let (a, b, c) = (
            pod("flock-a", true),
            pod("flock-bird-a", true),
            config(Some(status)),
        );
        let r = report(Read::Error(
            "birdc … show protocols all: no answer in 3 s".into(),
        ));
        let s = node_status(inputs(&a, &b, &c, &r));
        assert_eq!(s.problems.len(), 1, "{:?}", s.problems);
        assert!(s.problems[0].starts_with("node1: BIRD does not answer"));
        assert!(s.problems[0].contains("2001:db8:f1:1::1 (last known Established)"));
        assert!(!s.sessions[0].known);
    }

    #[test]
    fn an_agent_that_does_not_answer_is_a_problem_before_its_pod_is_unready() {
        let (a, b, c) = (
            pod("flock-a", true),
            pod("flock-bird-a", true),
            config(None),
        );
        let mut r = report(Read::Ok(Bird {
            sessions: vec![session("Established", "")],
            bfd: bfd("Up"),
        }));
        r.readiness = Read::Error("GET http://127.0.0.1:9641/readyz: no answer in 3 s".into());
        let s = node_status(inputs(&a, &b, &c, &r));
        assert_eq!(
            s.problems,
            [
                "node1: the agent does not answer (GET http://127.0.0.1:9641/readyz: no answer in 3 s)"
            ]
        );
    }

    #[test]
    fn missing_pieces_are_problems() {
        let r = report(Read::Ok(Bird {
            sessions: vec![],
            bfd: Read::Ok(vec![]),
        }));
        let s = node_status(NodeInputs {
            node: "node1",
            agent: None,
            bird: None,
            config: None,
            report: Err("unused"),
        });
        assert_eq!(
            s.problems,
            [
                "node1: no flock agent pod on the node",
                "node1: no NodeConfig: new pods cannot get addresses"
            ]
        );
        let (a, b, c) = (
            pod("flock-a", false),
            pod("flock-bird-a", false),
            config(None),
        );
        let s = node_status(inputs(&a, &b, &c, &r));
        assert!(
            s.problems[0].contains("agent pod flock-a is not ready (ok)"),
            "{:?}",
            s.problems
        );
        assert!(s.problems[1].contains("BIRD pod flock-bird-a is not ready"));
    }

    #[test]
    fn free_addresses_read_for_every_size() {
        assert_eq!(free(&"10.0.0.0/24".parse().unwrap(), 3), "253");
        assert_eq!(free(&"2001:db8::/64".parse().unwrap(), 0), "2^64");
        assert_eq!(free(&"2001:db8::/96".parse().unwrap(), 1), "4294967295");
    }
}
