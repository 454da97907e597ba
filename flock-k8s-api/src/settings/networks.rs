//! `spec.networks`: a node's secondary networks, validated. Each is an address space of its
//! own (never overlapping the cluster network's CIDRs or another network's), the routes its
//! pods take through it, and whether the node announces it.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::{invalid, node_cidrs};
use crate::Result;
use crate::nodeconfig::NetworkSpec;

/// One secondary network of the node, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecondaryNetwork {
    /// Its name (what a network configuration's `network` names).
    pub name: String,
    /// This node's IPv6 CIDR of it.
    pub cidr6: Option<Ipv6Net>,
    /// This node's IPv4 CIDR of it.
    pub cidr4: Option<Ipv4Net>,
    /// What a pod routes through its interface on it (default: the node's CIDRs of it).
    pub routes: Vec<IpNet>,
    /// Whether the node announces its CIDRs over BGP.
    pub announce: bool,
}

impl SecondaryNetwork {
    /// Its CIDRs on this node.
    pub fn cidrs(&self) -> Vec<IpNet> {
        let mut v = Vec::new();
        v.extend(self.cidr6.map(IpNet::V6));
        v.extend(self.cidr4.map(IpNet::V4));
        v
    }
}

/// Validates `spec.networks` beside the cluster network's CIDRs (`cluster`); every error
/// names the field and the value.
pub(super) fn networks(specs: &[NetworkSpec], cluster: &[IpNet]) -> Result<Vec<SecondaryNetwork>> {
    let mut out: Vec<SecondaryNetwork> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let at = format!("spec.networks[{i}]");
        let name = &spec.name;
        if !is_dns_label(name) {
            return Err(invalid(
                &format!("{at}.name"),
                name,
                "a network's name is a DNS label: 1 to 63 of a-z, 0-9 and '-', \
                 starting and ending with a letter or digit",
            ));
        }
        if out.iter().any(|n| &n.name == name) {
            return Err(invalid(
                &format!("{at}.name"),
                name,
                "another network of this node has the same name",
            ));
        }
        let cidrs = node_cidrs(&at, spec.cidr6.as_deref(), spec.cidr4.as_deref())?;
        let (cidr6, cidr4) = (cidrs.cidr6(), cidrs.cidr4());
        if cidr6.is_none() && cidr4.is_none() {
            return Err(invalid(
                &at,
                name,
                "a network needs an address space: cidr6, cidr4 or both",
            ));
        }
        let mine: Vec<(&str, IpNet)> = [
            cidr6.map(|c| ("cidr6", IpNet::V6(c))),
            cidr4.map(|c| ("cidr4", IpNet::V4(c))),
        ]
        .into_iter()
        .flatten()
        .collect();
        for (field, net) in &mine {
            if let Some(c) = cluster.iter().find(|c| overlap(c, net)) {
                return Err(invalid(
                    &format!("{at}.{field}"),
                    &net.to_string(),
                    &format!("overlaps the cluster network's node CIDR {c}"),
                ));
            }
            if let Some((other, c)) = out
                .iter()
                .flat_map(|n| n.cidrs().into_iter().map(move |c| (n, c)))
                .find(|(_, c)| overlap(c, net))
            {
                return Err(invalid(
                    &format!("{at}.{field}"),
                    &net.to_string(),
                    &format!("overlaps network {:?}'s {c}", other.name),
                ));
            }
        }
        let routes = if spec.routes.is_empty() {
            mine.iter().map(|(_, c)| *c).collect()
        } else {
            spec.routes
                .iter()
                .enumerate()
                .map(|(j, text)| route(&format!("{at}.routes[{j}]"), text, cluster))
                .collect::<Result<Vec<_>>>()?
        };
        out.push(SecondaryNetwork {
            name: name.clone(),
            cidr6,
            cidr4,
            routes,
            announce: spec.announce.unwrap_or(true),
        });
    }
    Ok(out)
}

/// One route of a secondary network: a CIDR without host bits, not a default route, and not
/// covering the cluster network's node CIDRs (the pod would send cluster traffic through the
/// secondary interface).
pub fn route(field: &str, text: &str, cluster: &[IpNet]) -> Result<IpNet> {
    let net: IpNet = text.trim().parse().map_err(|_| {
        invalid(
            field,
            text,
            "not a CIDR such as 2001:db8:5::/48 or 10.245.0.0/16",
        )
    })?;
    if net.trunc() != net {
        return Err(invalid(
            field,
            text,
            &format!("host bits set; did you mean {}?", net.trunc()),
        ));
    }
    if net.prefix_len() == 0 {
        return Err(invalid(
            field,
            text,
            "a default route stays the cluster network's",
        ));
    }
    if let Some(c) = cluster.iter().find(|c| overlap(c, &net)) {
        return Err(invalid(
            field,
            text,
            &format!("overlaps the cluster network's node CIDR {c}"),
        ));
    }
    Ok(net)
}

/// Whether two CIDRs share an address.
pub(super) fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

fn is_dns_label(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use crate::Error;
    use crate::nodeconfig::NodeConfig;

    fn node(networks: &str) -> Result<crate::NodeSettings, Error> {
        let yaml = format!(
            "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: {{ name: host001 }}
spec:
  cidr6: 2001:db8:0:1::/64
  cidr4: 10.244.1.0/24
  bgp:
    asn: 64512
    routerId: 10.0.0.1
    neighbors: [ {{ address: \"2001:db8::fe\", asn: 65000 }} ]
  networks:
{networks}"
        );
        serde_yaml::from_str::<NodeConfig>(&yaml)
            .expect("yaml")
            .settings()
    }

    fn refused(networks: &str) -> (String, String, String) {
        match node(networks) {
            Err(Error::InvalidNodeConfig {
                field,
                value,
                reason,
            }) => (field, value, reason),
            other => panic!("expected an invalid NodeConfig, got {other:?}"),
        }
    }

    #[test]
    fn a_secondary_network_is_its_space_its_routes_and_its_announcement() {
        let s = node(
            "    - { name: storage, cidr6: \"2001:db8:5:1::/64\", cidr4: 10.245.1.0/24,
        routes: [\"2001:db8:5::/48\", 10.245.0.0/16] }
    - { name: backup, cidr6: \"2001:db8:6:1::/64\", announce: false }",
        )
        .unwrap();
        let storage = s.network("storage").unwrap();
        assert_eq!(
            storage.cidrs(),
            [
                "2001:db8:5:1::/64".parse().unwrap(),
                "10.245.1.0/24".parse().unwrap()
            ] as [ipnet::IpNet; 2]
        );
        assert_eq!(storage.routes.len(), 2);
        assert!(storage.announce);
        // routes default to the node's CIDRs of the network
        let backup = s.network("backup").unwrap();
        assert_eq!(
            backup.routes,
            ["2001:db8:6:1::/64".parse().unwrap()] as [ipnet::IpNet; 1]
        );
        assert!(s.network("other").is_none());
        // the announced one joins BIRD's aggregates, the other does not
        let cidrs = s.bgp.unwrap().cidrs;
        assert!(cidrs.contains(&"2001:db8:5:1::/64".parse().unwrap()));
        assert!(cidrs.contains(&"10.245.1.0/24".parse().unwrap()));
        assert!(!cidrs.contains(&"2001:db8:6:1::/64".parse().unwrap()));
    }

    #[test]
    fn each_wrong_network_is_named_by_field_and_value() {
        let cases = [
            (
                "    - { name: Storage, cidr6: \"2001:db8:5:1::/64\" }",
                "spec.networks[0].name",
                "Storage",
                "DNS label",
            ),
            (
                "    - { name: a, cidr6: \"2001:db8:5:1::/64\" }\n    - { name: a, cidr6: \"2001:db8:6:1::/64\" }",
                "spec.networks[1].name",
                "a",
                "same name",
            ),
            (
                "    - { name: a }",
                "spec.networks[0]",
                "a",
                "cidr6, cidr4 or both",
            ),
            (
                "    - { name: a, cidr6: \"2001:db8:0:1::/80\" }",
                "spec.networks[0].cidr6",
                "2001:db8:0:1::/80",
                "cluster network's node CIDR 2001:db8:0:1::/64",
            ),
            (
                "    - { name: a, cidr4: 10.0.0.0/8 }",
                "spec.networks[0].cidr4",
                "10.0.0.0/8",
                "cluster network's node CIDR 10.244.1.0/24",
            ),
            (
                "    - { name: a, cidr6: \"2001:db8:5:1::/64\" }\n    - { name: b, cidr6: \"2001:db8:5::/48\" }",
                "spec.networks[1].cidr6",
                "2001:db8:5::/48",
                "network \"a\"'s 2001:db8:5:1::/64",
            ),
            (
                "    - { name: a, cidr6: \"2001:db8:5:1::/64\", routes: [\"2001:db8::/32\"] }",
                "spec.networks[0].routes[0]",
                "2001:db8::/32",
                "cluster network's node CIDR",
            ),
            (
                "    - { name: a, cidr6: \"2001:db8:5:1::/64\", routes: [\"::/0\"] }",
                "spec.networks[0].routes[0]",
                "::/0",
                "default route",
            ),
            (
                "    - { name: a, cidr6: \"2001:db8:5:1::/64\", routes: [\"2001:db8:5::1/48\"] }",
                "spec.networks[0].routes[0]",
                "2001:db8:5::1/48",
                "host bits",
            ),
            (
                "    - { name: a, cidr6: \"2001:db8:5:1::/64\", routes: [nonsense] }",
                "spec.networks[0].routes[0]",
                "nonsense",
                "not a CIDR",
            ),
            (
                "    - { name: a, cidr6: \"2001:db8:5:1::/200\" }",
                "spec.networks[0].cidr6",
                "2001:db8:5:1::/200",
                "",
            ),
        ];
        for (networks, field, value, reason) in cases {
            let (f, v, r) = refused(networks);
            assert_eq!((f.as_str(), v.as_str()), (field, value), "{networks}: {r}");
            assert!(r.contains(reason), "{networks}: {r}");
        }
    }
}
