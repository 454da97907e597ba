//! Objects for the unit tests: stored records, node reports.

use flock_agent::inspect::{Bird, NodeReport, PodRoute, Read, Readiness, StoredAttachment};
use flock_agent::store::AllocationRecord;

/// A committed record of `pod` (`namespace/name`) on eth0.
pub fn record(
    cid: &str,
    pod: &str,
    uid: &str,
    v6: &str,
    v4: &str,
    host_if: &str,
) -> AllocationRecord {
    let (ns, name) = pod.split_once('/').unwrap();
    serde_json::from_value(serde_json::json!({
        "format": 1, "state": "committed", "network": "flock", "containerId": cid,
        "ifName": "eth0", "netns": format!("/var/run/netns/{cid}"), "bootId": "b",
        "pod": { "namespace": ns, "name": name, "uid": uid },
        "ipv6": v6, "ipv4": v4, "mtu": 1500, "hostIf": host_if
    }))
    .unwrap()
}

/// `record` as the store holds it, on the node (its namespace and veth there) or not.
pub fn stored(record: AllocationRecord, on_node: bool) -> StoredAttachment {
    StoredAttachment {
        host_if_exists: on_node,
        netns_exists: on_node,
        on_node,
        record,
    }
}

/// node1's report: its store, links, routes (`(dst, link)`) and BIRD, its agent ready.
pub fn report(
    store: Vec<StoredAttachment>,
    links: &[&str],
    routes: &[(&str, &str)],
    bird: Read<Bird>,
) -> NodeReport {
    NodeReport {
        node: "node1".into(),
        version: "0.1.0".into(),
        boot_id: "b".into(),
        readiness: Read::Ok(Readiness {
            ready: true,
            body: "ok".into(),
        }),
        store: Read::Ok(store),
        host_ifs: Read::Ok(links.iter().map(|l| (*l).to_owned()).collect()),
        routes: Read::Ok(
            routes
                .iter()
                .map(|(d, l)| PodRoute {
                    dst: d.parse().unwrap(),
                    host_ifs: vec![(*l).to_owned()],
                })
                .collect(),
        ),
        bird,
        dump: None,
    }
}

/// BIRD without sessions.
pub fn no_bgp() -> Read<Bird> {
    Read::Ok(Bird {
        sessions: vec![],
        bfd: Read::Ok(vec![]),
    })
}
