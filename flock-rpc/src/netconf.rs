//! flock's own view of its network configuration ([`FlockNetConf`]), shared by the shim and
//! the agent so the rules live in one place.

use std::collections::BTreeMap;
use std::path::PathBuf;

use flock_cni_proto::error::{CniError, ErrorCode};
use flock_cni_proto::{CniVersion, NetConf};
use serde_json::Value;

use crate::defaults::{
    DEFAULT_AGENT_SOCKET, DEFAULT_AGENT_WAIT_SECONDS, DEFAULT_DEL_QUEUE_DIR, MAX_AGENT_WAIT_SECONDS,
};

/// The `type` flock's shim is installed as.
pub const FLOCK_TYPE: &str = "flock";
/// The `runtimeConfig` key under which CRI runtimes pass pod annotations.
pub const POD_ANNOTATIONS_KEY: &str = "io.kubernetes.cri.pod-annotations";

/// flock's reading of its own network configuration (DESIGN §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlockNetConf {
    /// The call's CNI version.
    pub cni_version: CniVersion,
    /// The network's name (GC scope, record ownership).
    pub name: String,
    /// `agentSocket`: where the agent listens.
    pub agent_socket: PathBuf,
    /// `mtu`: the pod interfaces' MTU, 68..=65535; absent: the agent takes the MTU of the
    /// node's uplink (the interface its route to the BGP neighbor leaves through).
    pub mtu: Option<u32>,
    /// `delQueueDir`: where undeliverable DELs wait for the agent.
    pub del_queue_dir: PathBuf,
    /// `agentWaitSeconds`: how long ADD and CHECK wait for an agent that does not listen.
    pub agent_wait: std::time::Duration,
    /// `args.flock.annotations` (standalone mode), empty when absent.
    pub annotations: BTreeMap<String, String>,
    /// `runtimeConfig["io.kubernetes.cri.pod-annotations"]` when the runtime
    /// passed it.
    pub pod_annotations: Option<BTreeMap<String, String>>,
    /// `network`: the secondary network (a NodeConfig's `spec.networks[].name`) this
    /// attachment's addresses come from; absent: the cluster network.
    pub network: Option<String>,
    /// `routes`: more destinations a secondary network's attachment routes, as written (the
    /// agent checks them against the node's CIDRs).
    pub routes: Vec<String>,
}

impl FlockNetConf {
    /// Validates flock's keys. Every problem is error 7 naming the field and
    /// the value: a `type` other than `flock`, an `mtu` outside 68..=65535 or
    /// not an integer, an `agentSocket`/`delQueueDir` that is not an absolute
    /// path, annotations that are not a map of strings.
    pub fn from_netconf(conf: &NetConf) -> Result<FlockNetConf, CniError> {
        let invalid = |msg: String| CniError::new(ErrorCode::InvalidNetworkConfig, msg);
        if conf.plugin_type != FLOCK_TYPE {
            return Err(invalid(format!(
                "network configuration type is {:?}, expected {FLOCK_TYPE:?}",
                conf.plugin_type
            )));
        }
        let path = |key: &str, default: &str| -> Result<PathBuf, CniError> {
            match conf.extra.get(key) {
                None => Ok(PathBuf::from(default)),
                Some(Value::String(s)) if s.starts_with('/') => Ok(PathBuf::from(s)),
                Some(other) => Err(invalid(format!(
                    "invalid {key} {other}: expected an absolute path"
                ))),
            }
        };
        let agent_socket = path("agentSocket", DEFAULT_AGENT_SOCKET)?;
        let del_queue_dir = path("delQueueDir", DEFAULT_DEL_QUEUE_DIR)?;
        let mtu = match conf.extra.get("mtu") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n @ 68..=65535) => Some(n as u32),
                _ => {
                    return Err(invalid(format!(
                        "invalid mtu {v}: expected an integer in 68..=65535"
                    )));
                }
            },
        };
        let agent_wait = match conf.extra.get("agentWaitSeconds") {
            None => DEFAULT_AGENT_WAIT_SECONDS,
            Some(v) => match v.as_u64() {
                Some(n @ 0..=MAX_AGENT_WAIT_SECONDS) => n,
                _ => {
                    return Err(invalid(format!(
                        "invalid agentWaitSeconds {v}: expected an integer in \
                         0..={MAX_AGENT_WAIT_SECONDS}"
                    )));
                }
            },
        };
        let agent_wait = std::time::Duration::from_secs(agent_wait);
        let annotations = match conf
            .args
            .as_ref()
            .and_then(|a| a.get("flock"))
            .and_then(|f| f.get("annotations"))
        {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(v) => string_map(v)
                .map_err(|why| invalid(format!("invalid args.flock.annotations {v}: {why}")))?,
        };
        let pod_annotations = match conf
            .runtime_config
            .as_ref()
            .and_then(|rc| rc.get(POD_ANNOTATIONS_KEY))
        {
            None | Some(Value::Null) => None,
            Some(v) => Some(string_map(v).map_err(|why| {
                invalid(format!(
                    "invalid runtimeConfig[{POD_ANNOTATIONS_KEY:?}] {v}: {why}"
                ))
            })?),
        };
        let network = match conf.extra.get("network") {
            None | Some(Value::Null) => None,
            // whether the node has it is the agent's to say
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(other) => {
                return Err(invalid(format!(
                    "invalid network {other}: expected the name of one of the node's \
                     networks (a NodeConfig's spec.networks[].name)"
                )));
            }
        };
        let routes = match conf.extra.get("routes") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) if network.is_some() => list
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(invalid(format!(
                        "invalid routes[{i}] {other}: expected a CIDR string"
                    ))),
                })
                .collect::<Result<_, _>>()?,
            Some(Value::Array(_)) => {
                return Err(invalid(
                    "routes is for a secondary network (with \"network\"): the cluster \
                     network's pods route everything through it already"
                        .into(),
                ));
            }
            Some(other) => {
                return Err(invalid(format!(
                    "invalid routes {other}: expected a list of CIDRs"
                )));
            }
        };
        Ok(FlockNetConf {
            cni_version: conf.cni_version,
            name: conf.name.clone(),
            agent_socket,
            mtu,
            del_queue_dir,
            agent_wait,
            annotations,
            pod_annotations,
            network,
            routes,
        })
    }
}

fn string_map(v: &Value) -> Result<BTreeMap<String, String>, String> {
    let obj = v.as_object().ok_or("expected an object")?;
    obj.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            other => Err(format!("value of {k:?} is {other}, expected a string")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(v: Value) -> NetConf {
        NetConf::from_value(&v).unwrap()
    }

    #[test]
    fn flock_defaults_and_validation() {
        let f = FlockNetConf::from_netconf(&conf(
            json!({"cniVersion": "1.0.0", "name": "n", "type": "flock"}),
        ))
        .unwrap();
        assert_eq!(f.agent_socket, PathBuf::from(DEFAULT_AGENT_SOCKET));
        assert_eq!(f.del_queue_dir, PathBuf::from(DEFAULT_DEL_QUEUE_DIR));
        assert_eq!(f.mtu, None);
        assert!(f.annotations.is_empty() && f.pod_annotations.is_none());

        let f = FlockNetConf::from_netconf(&conf(json!({
            "cniVersion": "1.0.0", "name": "n", "type": "flock", "mtu": 68,
            "agentSocket": "/tmp/a.sock", "delQueueDir": "/tmp/q",
            "args": {"flock": {"annotations": {"flock.fritzlab.net/ip": "2001:db8::7"}}},
            "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"a": "b"}}
        })))
        .unwrap();
        assert_eq!(f.mtu, Some(68));
        assert_eq!(f.agent_socket, PathBuf::from("/tmp/a.sock"));
        assert_eq!(f.annotations["flock.fritzlab.net/ip"], "2001:db8::7");
        assert_eq!(f.pod_annotations.unwrap()["a"], "b");

        for (bad, needle) in [
            (json!({"type": "ptp"}), "\"ptp\""),
            (json!({"mtu": 67}), "mtu 67"),
            (json!({"mtu": 65536}), "mtu 65536"),
            (json!({"mtu": "1500"}), "mtu \"1500\""),
            (
                json!({"agentSocket": "rel.sock"}),
                "agentSocket \"rel.sock\"",
            ),
            (
                json!({"args": {"flock": {"annotations": {"k": 1}}}}),
                "\"k\"",
            ),
            (
                json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations": []}}),
                "pod-annotations",
            ),
        ] {
            let mut v = json!({"cniVersion": "1.0.0", "name": "n", "type": "flock"});
            for (k, x) in bad.as_object().unwrap() {
                v[k] = x.clone();
            }
            let e = FlockNetConf::from_netconf(&conf(v)).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidNetworkConfig);
            assert!(e.msg.contains(needle), "{} lacks {needle}", e.msg);
        }
    }
}
