//! The CNI Result of ADD (and `prevResult`), one model for 0.4.0, 1.0.0 and
//! 1.1.0: parsed from any of them, written in the shape each version's spec
//! gives it (fields a version lacks are omitted; 0.4.0 ips carry `version`).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::{CniError, ErrorCode};
use crate::prefix::IpPrefix;
use crate::version::CniVersion;

/// A CNI result, independent of the version it is written in.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CniResult {
    /// Interfaces created (host side without `sandbox`, container side with).
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    /// Routes installed in the container.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// DNS settings.
    #[serde(default)]
    pub dns: Dns,
}

/// One interface of a result.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Hardware address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The network namespace path for container interfaces; absent on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// vhost-user socket path (1.1.0).
    #[serde(
        default,
        rename = "socketPath",
        skip_serializing_if = "Option::is_none"
    )]
    pub socket_path: Option<String>,
    /// PCI ID of a device (1.1.0).
    #[serde(default, rename = "pciID", skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

/// One address of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Address with prefix length.
    pub address: IpPrefix,
    /// Default gateway for this address, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces` of the interface carrying the address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<u32>,
}

/// One route of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination.
    pub dst: IpPrefix,
    /// Next hop; absent means the runtime's default gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// Route MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Advertised MSS (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// Priority / metric (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Routing table (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Scope (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

impl Route {
    /// A route to `dst` via `gw` with no 1.1.0 attributes.
    pub fn via(dst: IpPrefix, gw: Option<IpAddr>) -> Route {
        Route {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

/// DNS settings of a result.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == Dns::default()
    }
}

impl CniResult {
    /// Parses a result written in any supported version (`cniVersion` is
    /// read but not required; 0.4.0's `version` on ips is checked against the
    /// address family). Error 6 names what could not be decoded.
    pub fn from_value(value: &Value) -> Result<CniResult, CniError> {
        let decode = |e: serde_json::Error| {
            CniError::new(
                ErrorCode::DecodingFailure,
                format!("invalid CNI result: {e}"),
            )
        };
        let result = CniResult::deserialize(value).map_err(decode)?;
        if let Some(ips) = value.get("ips").and_then(Value::as_array) {
            for (ip, parsed) in ips.iter().zip(&result.ips) {
                if let Some(v) = ip.get("version") {
                    let want = if parsed.address.is_ipv4() { "4" } else { "6" };
                    if v.as_str() != Some(want) {
                        return Err(CniError::new(
                            ErrorCode::DecodingFailure,
                            format!(
                                "invalid CNI result: ip {} has version {v}, expected \"{want}\"",
                                parsed.address
                            ),
                        ));
                    }
                }
            }
        }
        Ok(result)
    }

    /// The result as `version`'s spec writes it, with `cniVersion`.
    /// Fields that `version` lacks are dropped: before 1.1.0 interface
    /// `mtu`/`socketPath`/`pciID` and route `mtu`/`advmss`/`priority`/
    /// `table`/`scope`; before 1.0.0 ips gain `"version": "4"|"6"`.
    pub fn to_value(&self, version: CniVersion) -> Value {
        let v11 = version >= CniVersion::V1_1_0;
        let v10 = version >= CniVersion::V1_0_0;
        let mut out = Map::new();
        out.insert("cniVersion".into(), json!(version.to_string()));
        if !self.interfaces.is_empty() {
            let ifaces = self
                .interfaces
                .iter()
                .map(|i| {
                    let mut o = Map::new();
                    o.insert("name".into(), json!(i.name));
                    put(&mut o, "mac", &i.mac);
                    if v11 {
                        put(&mut o, "mtu", &i.mtu);
                    }
                    put(&mut o, "sandbox", &i.sandbox);
                    if v11 {
                        put(&mut o, "socketPath", &i.socket_path);
                        put(&mut o, "pciID", &i.pci_id);
                    }
                    Value::Object(o)
                })
                .collect();
            out.insert("interfaces".into(), Value::Array(ifaces));
        }
        if !self.ips.is_empty() {
            let ips = self
                .ips
                .iter()
                .map(|ip| {
                    let mut o = Map::new();
                    if !v10 {
                        let fam = if ip.address.is_ipv4() { "4" } else { "6" };
                        o.insert("version".into(), json!(fam));
                    }
                    o.insert("address".into(), json!(ip.address.to_string()));
                    put(&mut o, "gateway", &ip.gateway.map(|g| g.to_string()));
                    put(&mut o, "interface", &ip.interface);
                    Value::Object(o)
                })
                .collect();
            out.insert("ips".into(), Value::Array(ips));
        }
        if !self.routes.is_empty() {
            let routes = self
                .routes
                .iter()
                .map(|r| {
                    let mut o = Map::new();
                    o.insert("dst".into(), json!(r.dst.to_string()));
                    put(&mut o, "gw", &r.gw.map(|g| g.to_string()));
                    if v11 {
                        put(&mut o, "mtu", &r.mtu);
                        put(&mut o, "advmss", &r.advmss);
                        put(&mut o, "priority", &r.priority);
                        put(&mut o, "table", &r.table);
                        put(&mut o, "scope", &r.scope);
                    }
                    Value::Object(o)
                })
                .collect();
            out.insert("routes".into(), Value::Array(routes));
        }
        if !self.dns.is_empty() {
            // Dns serialises with every empty field omitted; it cannot fail.
            let dns = serde_json::to_value(&self.dns).unwrap_or(Value::Null);
            out.insert("dns".into(), dns);
        }
        Value::Object(out)
    }

    /// What survives a round trip through `version`: this result with the
    /// fields `version` lacks cleared.
    pub fn restricted_to(&self, version: CniVersion) -> CniResult {
        let mut r = self.clone();
        if version < CniVersion::V1_1_0 {
            for i in &mut r.interfaces {
                i.mtu = None;
                i.socket_path = None;
                i.pci_id = None;
            }
            for rt in &mut r.routes {
                *rt = Route::via(rt.dst, rt.gw);
            }
        }
        r
    }

    /// Rewrites a result from whatever version it is in to `to`.
    pub fn convert(value: &Value, to: CniVersion) -> Result<Value, CniError> {
        Ok(CniResult::from_value(value)?.to_value(to))
    }
}

fn put<T: Serialize>(o: &mut Map<String, Value>, key: &str, v: &Option<T>) {
    if let Some(v) = v {
        // Only strings and integers reach here: serialisation cannot fail.
        if let Ok(v) = serde_json::to_value(v) {
            o.insert(key.into(), v);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A flock-shaped dual-stack result using every 1.1.0 field.
    pub(crate) fn dual_stack() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "flk3f2a9c1d0b7e".into(),
                    mac: Some("ee:ee:ee:ee:ee:ee".into()),
                    mtu: Some(1500),
                    sandbox: None,
                    socket_path: None,
                    pci_id: None,
                },
                Interface {
                    name: "eth0".into(),
                    mac: Some("0a:58:64:40:00:05".into()),
                    mtu: Some(1500),
                    sandbox: Some("/var/run/netns/cni-1234".into()),
                    socket_path: Some("/run/vhost/sock0".into()),
                    pci_id: Some("0000:00:1f.6".into()),
                },
            ],
            ips: vec![
                IpConfig {
                    address: "2001:db8:42::5/128".parse().unwrap(),
                    gateway: Some("fe80::1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig {
                    address: "100.64.0.5/32".parse().unwrap(),
                    gateway: Some("169.254.1.1".parse().unwrap()),
                    interface: Some(1),
                },
            ],
            routes: vec![
                Route {
                    mtu: Some(1500),
                    advmss: Some(1440),
                    priority: Some(100),
                    table: Some(254),
                    scope: Some(0),
                    ..Route::via("::/0".parse().unwrap(), Some("fe80::1".parse().unwrap()))
                },
                Route::via(
                    "0.0.0.0/0".parse().unwrap(),
                    Some("169.254.1.1".parse().unwrap()),
                ),
            ],
            dns: Dns {
                nameservers: vec!["2001:db8::53".into()],
                domain: Some("cluster.local".into()),
                search: vec!["default.svc.cluster.local".into()],
                options: vec!["ndots:5".into()],
            },
        }
    }

    #[test]
    fn snapshot_each_version() {
        let r = dual_stack();
        insta::assert_json_snapshot!("result_0_4_0", r.to_value(CniVersion::V0_4_0));
        insta::assert_json_snapshot!("result_1_0_0", r.to_value(CniVersion::V1_0_0));
        insta::assert_json_snapshot!("result_1_1_0", r.to_value(CniVersion::V1_1_0));
    }

    #[test]
    fn parses_go_style_result_with_empty_dns_and_version() {
        let v = serde_json::json!({
            "cniVersion": "0.4.0",
            "interfaces": [{"name": "eth0", "sandbox": "/proc/1/ns/net"}],
            "ips": [{"version": "4", "address": "10.1.2.3/24", "interface": 0}],
            "dns": {}
        });
        let r = CniResult::from_value(&v).unwrap();
        assert_eq!(r.ips[0].address.to_string(), "10.1.2.3/24");
        let bad = serde_json::json!({"ips": [{"version": "6", "address": "10.1.2.3/24"}]});
        let e = CniResult::from_value(&bad).unwrap_err();
        assert!(e.msg.contains("10.1.2.3/24"), "{}", e.msg);
        let e =
            CniResult::from_value(&serde_json::json!({"ips": [{"address": "nope"}]})).unwrap_err();
        assert_eq!(e.code, ErrorCode::DecodingFailure);
        assert!(e.msg.contains("nope"), "{}", e.msg);
    }
}
