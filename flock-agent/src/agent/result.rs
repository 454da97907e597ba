//! What a record looks like to the kernel ([`pod_spec`]) and to the runtime ([`cni_result`]).

use std::net::IpAddr;
use std::path::PathBuf;

use flock_cni_proto::{CniResult, Interface, IpConfig, IpPrefix, Route};
use flock_netns::PodSpec;
use ipnet::IpNet;

use crate::store::AllocationRecord;

/// The kernel layout of a record (DESIGN §5); `netns` overrides the recorded path.
pub fn pod_spec(record: &AllocationRecord, netns: Option<&str>) -> PodSpec {
    let mut addresses: Vec<IpNet> = Vec::new();
    addresses.extend(record.ipv6.map(|a| IpNet::from(IpAddr::V6(a))));
    addresses.extend(record.ipv4.map(|a| IpNet::from(IpAddr::V4(a))));
    addresses.extend(record.addresses.iter().map(|a| IpNet::from(*a)));
    PodSpec {
        container_id: record.container_id.clone(),
        netns: PathBuf::from(netns.unwrap_or(&record.netns)),
        if_name: record.if_name.clone(),
        host_if: record.host_if.clone(),
        mtu: record.mtu,
        addresses,
        anycast: record.anycast.clone(),
        default_route: record.default_route,
        routes: record.routes.clone(),
    }
}

/// The CNI result of a record: host veth and pod interface, every address on the pod
/// interface, gateways `fe80::1` and `169.254.1.1`, default routes.
pub fn cni_result(record: &AllocationRecord) -> CniResult {
    let mac = |m: &str| (!m.is_empty()).then(|| m.to_owned());
    let interfaces = vec![
        Interface {
            name: record.host_if.clone(),
            mac: mac(&record.host_mac),
            mtu: Some(record.mtu),
            ..Interface::default()
        },
        Interface {
            name: record.if_name.clone(),
            mac: mac(&record.pod_mac),
            mtu: Some(record.mtu),
            sandbox: Some(record.netns.clone()),
            ..Interface::default()
        },
    ];
    let gw6 = IpAddr::V6(flock_netns::GATEWAY6);
    let gw4 = IpAddr::V4(flock_netns::GATEWAY4);
    let mut ips = Vec::new();
    let mut routes = Vec::new();
    let host = |addr: IpAddr| {
        IpPrefix::new(addr, if addr.is_ipv4() { 32 } else { 128 }).expect("a host prefix is valid")
    };
    let ip = |addr: IpAddr, gateway: Option<IpAddr>| IpConfig {
        address: host(addr),
        gateway,
        interface: Some(1),
    };
    // a secondary network's attachment names no gateway for its addresses (a runtime or
    // Multus takes an interface with a gateway for the pod's default)
    let gateway = |gw: IpAddr| record.default_route.then_some(gw);
    if let Some(a) = record.ipv6 {
        ips.push(ip(IpAddr::V6(a), gateway(gw6)));
    }
    if let Some(a) = record.ipv4 {
        ips.push(ip(IpAddr::V4(a), gateway(gw4)));
    }
    // the routes are the kernel's (pod_spec's), as the runtime would write them
    for r in pod_spec(record, None).pod_routes() {
        if let Some(gw) = r.gateway {
            let dst = IpPrefix::new(r.dst.addr(), r.dst.prefix_len()).expect("a route's prefix");
            routes.push(Route::via(dst, Some(gw)));
        }
    }
    for a in &record.addresses {
        ips.push(ip(*a, None));
    }
    CniResult {
        interfaces,
        ips,
        routes,
        ..CniResult::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RecordState, STORE_FORMAT};

    #[test]
    fn result_lists_host_and_pod_interfaces_and_gateways() {
        let record = AllocationRecord {
            format: STORE_FORMAT,
            state: RecordState::Committed,
            network: "flock".into(),
            container_id: "abc".into(),
            if_name: "eth0".into(),
            netns: "/run/netns/pod".into(),
            boot_id: String::new(),
            pod: None,
            ipv6: Some("2001:db8:1::7".parse().unwrap()),
            ipv4: Some("10.1.0.7".parse().unwrap()),
            addresses: vec!["2001:db8:ff::1".parse().unwrap()],
            anycast: vec![],
            mtu: 1500,
            host_if: "flockabc".into(),
            host_mac: "aa:bb:cc:dd:ee:ff".into(),
            pod_mac: "aa:bb:cc:dd:ee:00".into(),
            flock_network: None,
            default_route: true,
            routes: Vec::new(),
        };
        let v = cni_result(&record).to_value(flock_cni_proto::CniVersion::V1_1_0);
        insta::assert_json_snapshot!(v);

        // a secondary network's attachment: no gateway, no default route, its own space
        let net1 = AllocationRecord {
            if_name: "net1".into(),
            ipv6: Some("2001:db8:5:1::7".parse().unwrap()),
            ipv4: Some("10.245.1.7".parse().unwrap()),
            addresses: vec![],
            flock_network: Some("storage".into()),
            default_route: false,
            routes: vec![
                "2001:db8:5::/48".parse().unwrap(),
                "10.245.0.0/16".parse().unwrap(),
            ],
            ..record
        };
        let v = cni_result(&net1).to_value(flock_cni_proto::CniVersion::V1_1_0);
        assert!(
            v["ips"]
                .as_array()
                .unwrap()
                .iter()
                .all(|ip| ip.get("gateway").is_none()),
            "{v}"
        );
        assert_eq!(
            v["routes"],
            serde_json::json!([
                { "dst": "2001:db8:5::/48", "gw": "fe80::1" },
                { "dst": "10.245.0.0/16", "gw": "169.254.1.1" }
            ])
        );
        let spec = pod_spec(&net1, None);
        assert!(!spec.default_route);
        assert_eq!(spec.routes, net1.routes);
    }
}
