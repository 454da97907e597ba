//! Network configuration: one plugin's config ([`NetConf`]) and the list a
//! runtime reads from disk ([`Conflist`]).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{CniError, ErrorCode};
use crate::result::CniResult;
use crate::version::CniVersion;

/// One attachment in a GC call's list.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Attachment {
    /// The container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name inside the container.
    pub ifname: String,
}

/// The configuration of one plugin, as a runtime writes it on stdin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetConf {
    /// The version the runtime speaks for this call.
    #[serde(rename = "cniVersion")]
    pub cni_version: CniVersion,
    /// The network's name.
    pub name: String,
    /// The plugin binary's name.
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// The previous plugin's result (chained ADD, CHECK, DEL).
    #[serde(
        rename = "prevResult",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prev_result: Option<Value>,
    /// Capability arguments injected by the runtime.
    #[serde(
        rename = "runtimeConfig",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub runtime_config: Option<Map<String, Value>>,
    /// The `args` convention (`args.cni`, `args.flock`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Map<String, Value>>,
    /// GC (1.1.0): the attachments still in use.
    #[serde(
        rename = "cni.dev/valid-attachments",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub valid_attachments: Option<Vec<Attachment>>,
    /// GC's list under its older name.
    #[serde(
        rename = "cni.dev/attachments",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub attachments: Option<Vec<Attachment>>,
    /// Every other key (plugin-specific settings, `capabilities`, `ipam`, `dns`…).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl NetConf {
    /// Parses a config from stdin bytes. Not JSON, or a missing or invalid
    /// field: error 6; a malformed `cniVersion`: error 1. Whether the version
    /// is *supported* is the caller's decision (see [`crate::skel`]).
    pub fn from_slice(bytes: &[u8]) -> Result<(NetConf, Value), CniError> {
        let raw: Value = serde_json::from_slice(bytes).map_err(|e| {
            CniError::new(
                ErrorCode::DecodingFailure,
                format!("invalid network configuration on stdin: {e}"),
            )
        })?;
        Ok((NetConf::from_value(&raw)?, raw))
    }

    /// Parses a config already decoded as JSON (see [`NetConf::from_slice`]).
    pub fn from_value(raw: &Value) -> Result<NetConf, CniError> {
        let Some(obj) = raw.as_object() else {
            return Err(CniError::new(
                ErrorCode::DecodingFailure,
                "invalid network configuration: not a JSON object",
            ));
        };
        match obj.get("cniVersion") {
            Some(Value::String(s)) => {
                s.parse::<CniVersion>()?;
            }
            Some(other) => {
                return Err(CniError::new(
                    ErrorCode::IncompatibleCniVersion,
                    format!("invalid cniVersion {other}: expected a string"),
                ));
            }
            None => {
                return Err(CniError::new(
                    ErrorCode::IncompatibleCniVersion,
                    "network configuration has no cniVersion",
                ));
            }
        }
        // From the borrowed value: no copy of the whole document (a DEL's carries its
        // `prevResult`) before the fields take what they keep.
        NetConf::deserialize(raw).map_err(|e| {
            CniError::new(
                ErrorCode::DecodingFailure,
                format!("invalid network configuration: {e}"),
            )
        })
    }

    /// The previous result, parsed (error 6 when it is not a valid result).
    pub fn prev_result(&self) -> Result<Option<CniResult>, CniError> {
        self.prev_result
            .as_ref()
            .map(CniResult::from_value)
            .transpose()
    }

    /// GC's attachment list from `cni.dev/valid-attachments`, or else the
    /// older `cni.dev/attachments`; `None` when the config carries neither.
    pub fn gc_attachments(&self) -> Option<&[Attachment]> {
        self.valid_attachments
            .as_deref()
            .or(self.attachments.as_deref())
    }
}

/// A network configuration list (`*.conflist`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conflist {
    /// The version of the list.
    #[serde(rename = "cniVersion")]
    pub cni_version: CniVersion,
    /// Other versions the list is valid for (CNI 1.1): a runtime picks the
    /// highest it supports, see [`Conflist::version_for`].
    #[serde(
        rename = "cniVersions",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cni_versions: Option<Vec<CniVersion>>,
    /// The network's name.
    pub name: String,
    /// Whether the runtime must skip CHECK.
    #[serde(rename = "disableCheck", default, skip_serializing_if = "is_false")]
    pub disable_check: bool,
    /// Whether the runtime must skip GC (1.1.0).
    #[serde(rename = "disableGC", default, skip_serializing_if = "is_false")]
    pub disable_gc: bool,
    /// The plugins, in order, without `cniVersion`/`name`.
    pub plugins: Vec<Map<String, Value>>,
    /// Every other key.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Conflist {
    /// Parses a conflist (error 6 when malformed, 7 when it has no plugins).
    pub fn from_slice(bytes: &[u8]) -> Result<Conflist, CniError> {
        let list: Conflist = serde_json::from_slice(bytes).map_err(|e| {
            CniError::new(
                ErrorCode::DecodingFailure,
                format!("invalid network configuration list: {e}"),
            )
        })?;
        if list.plugins.is_empty() {
            return Err(CniError::new(
                ErrorCode::InvalidNetworkConfig,
                format!("network configuration list {:?} has no plugins", list.name),
            ));
        }
        Ok(list)
    }

    /// The version a runtime supporting `supported` runs this list in (CNI
    /// 1.1's version selection, as libcni does it): the highest of
    /// `cniVersions` and `cniVersion` that it supports. When it supports none
    /// of them, `cniVersion`, which the plugins then refuse with error 1
    /// naming it.
    ///
    /// So the list flock installs, `"cniVersion": "1.0.0", "cniVersions":
    /// ["1.0.0", "1.1.0"]`, runs in 1.1.0 where the runtime knows it and in
    /// 1.0.0 under containerd 1.6/1.7, whose libcni ignores `cniVersions`.
    pub fn version_for(&self, supported: &[CniVersion]) -> CniVersion {
        self.cni_versions
            .iter()
            .flatten()
            .chain([&self.cni_version])
            .filter(|v| supported.contains(v))
            .max()
            .copied()
            .unwrap_or(self.cni_version)
    }

    /// The config a runtime speaking every version of
    /// [`CniVersion::SUPPORTED`] hands plugin `index` (as libcni builds it):
    /// the plugin's keys plus the list's `name`, the `cniVersion` chosen by
    /// [`Conflist::version_for`], and `prevResult` when given. `None` when
    /// there is no such plugin.
    pub fn plugin_config(&self, index: usize, prev_result: Option<&Value>) -> Option<Value> {
        let mut obj = self.plugins.get(index)?.clone();
        obj.insert(
            "cniVersion".into(),
            Value::String(self.version_for(&CniVersion::SUPPORTED).to_string()),
        );
        obj.insert("name".into(), Value::String(self.name.clone()));
        if let Some(prev) = prev_result {
            obj.insert("prevResult".into(), prev.clone());
        }
        Some(Value::Object(obj))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(v: Value) -> NetConf {
        NetConf::from_value(&v).unwrap()
    }

    #[test]
    fn keeps_unknown_keys_and_reads_attachments() {
        let c = conf(json!({
            "cniVersion": "1.1.0", "name": "n", "type": "flock", "mtu": 9000,
            "cni.dev/attachments": [{"containerID": "c1", "ifname": "eth0"}],
            "capabilities": {"io.kubernetes.cri.pod-annotations": true}
        }));
        assert_eq!(c.extra["mtu"], json!(9000));
        assert!(c.extra.contains_key("capabilities"));
        assert_eq!(c.gc_attachments().unwrap()[0].container_id, "c1");
        let c = conf(json!({
            "cniVersion": "1.1.0", "name": "n", "type": "flock",
            "cni.dev/valid-attachments": [{"containerID": "c2", "ifname": "eth1"}],
            "cni.dev/attachments": [{"containerID": "c1", "ifname": "eth0"}]
        }));
        assert_eq!(c.gc_attachments().unwrap()[0].container_id, "c2");
    }

    #[test]
    fn version_errors_are_code_1() {
        for v in [
            json!({"name": "n", "type": "t"}),
            json!({"cniVersion": 1, "name": "n", "type": "t"}),
            json!({"cniVersion": "x", "name": "n", "type": "t"}),
        ] {
            assert_eq!(
                NetConf::from_value(&v).unwrap_err().code,
                ErrorCode::IncompatibleCniVersion
            );
        }
        assert_eq!(
            NetConf::from_slice(b"{").unwrap_err().code,
            ErrorCode::DecodingFailure
        );
    }

    #[test]
    fn conflist_builds_plugin_config() {
        let l = Conflist::from_slice(br#"{"cniVersion":"1.1.0","name":"k8s","plugins":[{"type":"flock"},{"type":"bandwidth"}]}"#).unwrap();
        let prev = json!({"cniVersion": "1.1.0"});
        let c = l.plugin_config(1, Some(&prev)).unwrap();
        let c = NetConf::from_value(&c).unwrap();
        assert_eq!(
            (c.name.as_str(), c.plugin_type.as_str()),
            ("k8s", "bandwidth")
        );
        assert_eq!(c.prev_result, Some(prev));
        assert!(l.plugin_config(2, None).is_none());
        let e = Conflist::from_slice(br#"{"cniVersion":"1.1.0","name":"k8s","plugins":[]}"#)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidNetworkConfig);
    }

    #[test]
    fn conflist_runs_in_the_highest_version_of_cni_versions_the_runtime_supports() {
        let list = |versions: &str| {
            Conflist::from_slice(
                format!(r#"{{"cniVersion":"1.0.0",{versions}"name":"flock","plugins":[{{"type":"flock"}}]}}"#)
                    .as_bytes(),
            )
            .unwrap()
        };
        let v = |s: &str| s.parse::<CniVersion>().unwrap();
        // What install-cni writes.
        let installed = list(r#""cniVersions":["1.0.0","1.1.0"],"#);
        assert_eq!(
            installed.cni_versions,
            Some(vec![CniVersion::V1_0_0, CniVersion::V1_1_0])
        );
        assert_eq!(
            installed.version_for(&CniVersion::SUPPORTED),
            CniVersion::V1_1_0
        );
        // A runtime without 1.1.0 (containerd 1.6) runs it in 1.0.0.
        let old = [CniVersion::V0_4_0, CniVersion::V1_0_0];
        assert_eq!(installed.version_for(&old), CniVersion::V1_0_0);
        assert_eq!(
            installed.plugin_config(0, None).unwrap()["cniVersion"],
            "1.1.0"
        );
        // Without cniVersions: cniVersion.
        assert_eq!(list("").version_for(&CniVersion::SUPPORTED), v("1.0.0"));
        // Versions from the future are skipped, not an error; order does not matter.
        let future = list(r#""cniVersions":["1.3.0","0.4.0","1.1.0","2.0.0"],"#);
        assert_eq!(future.version_for(&CniVersion::SUPPORTED), v("1.1.0"));
        // None supported: cniVersion, for the plugin to refuse by name.
        let none = Conflist::from_slice(
            br#"{"cniVersion":"0.3.1","cniVersions":["0.2.0"],"name":"n","plugins":[{"type":"flock"}]}"#,
        )
        .unwrap();
        assert_eq!(none.version_for(&CniVersion::SUPPORTED), v("0.3.1"));
        // A malformed entry makes the list invalid, as in libcni.
        let e = Conflist::from_slice(
            br#"{"cniVersion":"1.0.0","cniVersions":["1.1"],"name":"n","plugins":[{"type":"flock"}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::DecodingFailure);
        assert!(e.msg.contains("\"1.1\""), "{}", e.msg);
    }
}
