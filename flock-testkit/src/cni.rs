//! A CNI runtime stand-in that execs plugins exactly as libcni does.
//!
//! There is no `cnitool` on the test machine, and tests and the benchmark
//! need a client that behaves like the one kubelet's runtime embeds
//! (containerd → go-cni → libcni). [`Runtime`] reproduces libcni's
//! `AddNetworkList`, `CheckNetworkList`, `DelNetworkList`,
//! `GetStatusNetworkList`, `GCNetworkList` and `GetVersionInfo`:
//!
//! - each plugin of the list is found by its `type` in the search path
//!   (`CNI_PATH`) and exec'd with `CNI_COMMAND`, `CNI_CONTAINERID`,
//!   `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS` (`K=V;K=V`) and `CNI_PATH`;
//! - its stdin is the plugin's object with `cniVersion` and `name` of the
//!   list injected, `prevResult` (the previous plugin's result on ADD, the
//!   cached result on CHECK and DEL) and `runtimeConfig` holding only the
//!   capability arguments the plugin declares in `capabilities`;
//! - ADD runs the chain in order and caches the final result in
//!   `<cache>/results/<network>-<containerID>-<ifname>` (libcni's
//!   `cniCacheV1` record, with the list's bytes, the netns, the args and the
//!   capability args); CHECK runs in order (CNI ≥ 0.4.0); DEL runs in
//!   reverse order and removes the record; STATUS and the GC command are sent
//!   only for CNI ≥ 1.1.0, GC first DELs every cached attachment of the
//!   network that is not in the valid list and passes that list as
//!   `cni.dev/valid-attachments` (and `cni.dev/attachments`, as libcni does);
//! - a plugin that exits non-zero yields [`Error::Plugin`] with the CNI
//!   error object it printed (code, msg, details) and its stderr.
//!
//! Plugins can run inside a stand-in node namespace ([`Runtime::in_netns`]):
//! each exec happens from a short-lived thread that entered that namespace,
//! so the machine's own namespace is never touched and no `ip netns exec`
//! process sits between the runtime and the plugin. A calling thread that is
//! already in that namespace ([`enter_netns`], as a real runtime lives in its
//! node's) execs directly, and pays neither the thread nor the `setns`: what a
//! benchmark times around a call is then the runtime's work and the plugin's.
//! Nothing here sleeps or measures: callers time around calls.
//!
//! ```no_run
//! use flock_testkit::cni::{Attachment, Runtime};
//! use serde_json::json;
//!
//! let conflist = json!({
//!     "cniVersion": "1.0.0",
//!     "name": "demo",
//!     "plugins": [{
//!         "type": "ptp",
//!         "ipam": { "type": "host-local", "dataDir": "/tmp/demo-ipam",
//!                   "ranges": [[{ "subnet": "10.88.0.0/16" }]] }
//!     }]
//! });
//! let node = flock_testkit::Netns::new("node");
//! let pod = flock_testkit::Netns::new("pod");
//! let rt = Runtime::new(conflist, ["/usr/lib/cni"], "/tmp/demo-cache")?.in_netns(node.path());
//! let att = Attachment::new("c0ffee", pod.path(), "eth0").with_arg("IgnoreUnknown", "1");
//! let result = rt.add(&att)?;
//! println!("{}", result["ips"][0]["address"]);
//! rt.check(&att)?;
//! rt.del(&att)?;
//! # Ok::<(), flock_testkit::cni::Error>(())
//! ```

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use nix::sched::CloneFlags;
use serde_json::{Map, Value, json};

/// What can go wrong while driving plugins.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The network configuration list is unusable.
    #[error("invalid network configuration list: {reason}")]
    Config {
        /// What is wrong with it.
        reason: String,
    },
    /// An attachment parameter fails libcni's validation.
    #[error("invalid {what} {value:?}: {reason}")]
    Invalid {
        /// `container ID`, `interface name` or `network name`.
        what: &'static str,
        /// The rejected value.
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// No executable named after the plugin's `type` in the search path.
    #[error("failed to find plugin {plugin:?} in path {dirs:?}")]
    PluginNotFound {
        /// The plugin type.
        plugin: String,
        /// The directories searched.
        dirs: Vec<PathBuf>,
    },
    /// The node namespace could not be opened or entered.
    #[error("enter node network namespace {path}: {source}")]
    EnterNetns {
        /// The namespace file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The plugin could not be started or talked to.
    #[error("exec plugin {path} ({command}): {source}")]
    Spawn {
        /// The plugin's path.
        path: PathBuf,
        /// The CNI command.
        command: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The plugin exited non-zero.
    #[error("plugin {plugin} failed ({command}): {}", describe_failure(.error, .stderr, .status))]
    Plugin {
        /// The plugin type.
        plugin: String,
        /// The CNI command.
        command: &'static str,
        /// The exit status as text.
        status: String,
        /// The CNI error object the plugin printed, if it printed one.
        error: Option<Box<CniError>>,
        /// What the plugin wrote to stderr.
        stderr: String,
    },
    /// The plugin succeeded but its stdout is not the JSON it must print.
    #[error("plugin {plugin} ({command}) printed invalid JSON {stdout:?}: {source}")]
    BadOutput {
        /// The plugin type.
        plugin: String,
        /// The CNI command.
        command: &'static str,
        /// What it printed.
        stdout: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The result cache could not be read or written.
    #[error("{op} cached result {path}: {source}")]
    Cache {
        /// `read`, `write` or `remove`.
        op: &'static str,
        /// The cache file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A cached result is not valid JSON.
    #[error("corrupt cached result {path}: {source}")]
    CorruptCache {
        /// The cache file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The list's `cniVersion` does not have this command.
    #[error("configuration version {version:?} does not support the {command} command")]
    Unsupported {
        /// The list's version.
        version: String,
        /// The command.
        command: &'static str,
    },
    /// GC kept going past failures; these are all of them.
    #[error("gc of network {network}: {}", .errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Gc {
        /// The network.
        network: String,
        /// Every failure, in order.
        errors: Vec<Error>,
    },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The address (without its prefix length) of the first `ips` entry of the CNI result
/// `result` in the family asked for (`v6`: IPv6, else IPv4); panics if there is none.
pub fn result_ip(result: &Value, v6: bool) -> String {
    result["ips"]
        .as_array()
        .expect("ips")
        .iter()
        .filter_map(|ip| ip["address"].as_str())
        .find(|a| a.contains(':') == v6)
        .and_then(|a| a.split('/').next())
        .unwrap_or_else(|| {
            panic!(
                "no {} address in {result}",
                if v6 { "IPv6" } else { "IPv4" }
            )
        })
        .to_owned()
}

fn describe_failure(error: &Option<Box<CniError>>, stderr: &str, status: &str) -> String {
    match error {
        Some(e) if e.details.is_empty() => format!("code {}: {}", e.code, e.msg),
        Some(e) => format!("code {}: {}; {}", e.code, e.msg, e.details),
        None if stderr.trim().is_empty() => format!("{status}, no error printed"),
        None => format!("{status}: {}", stderr.trim()),
    }
}

/// The error object a plugin prints on failure (CNI spec, "Error").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    /// The error code (1–99 are the spec's, 100+ the plugin's).
    pub code: u64,
    /// The short message.
    pub msg: String,
    /// The longer explanation, empty when absent.
    pub details: String,
}

impl CniError {
    fn parse(stdout: &[u8]) -> Option<CniError> {
        let v: Value = serde_json::from_slice(stdout).ok()?;
        let msg = v.get("msg")?.as_str()?.to_owned();
        if msg.is_empty() {
            return None;
        }
        Some(CniError {
            code: v.get("code").and_then(Value::as_u64).unwrap_or(0),
            msg,
            details: v
                .get("details")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        })
    }
}

impl Error {
    /// The plugin's CNI error object, when this is a plugin failure that printed one.
    pub fn cni_error(&self) -> Option<&CniError> {
        match self {
            Error::Plugin { error, .. } => error.as_deref(),
            _ => None,
        }
    }
}

/// One attachment of a container to the network (libcni's `RuntimeConf`).
#[derive(Debug, Clone, PartialEq)]
pub struct Attachment {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`; `None` sends an empty value, as containerd does on its
    /// second DEL.
    pub netns_path: Option<PathBuf>,
    /// `CNI_IFNAME`.
    pub if_name: String,
    /// `CNI_ARGS`, joined as `K=V;K=V`.
    pub args: Vec<(String, String)>,
    /// Capability arguments; each plugin receives in `runtimeConfig` only
    /// those it declares in its `capabilities`.
    pub capability_args: Map<String, Value>,
}

impl Attachment {
    /// An attachment with no `CNI_ARGS` and no capability arguments.
    pub fn new(
        container_id: impl Into<String>,
        netns_path: impl Into<PathBuf>,
        if_name: impl Into<String>,
    ) -> Attachment {
        Attachment {
            container_id: container_id.into(),
            netns_path: Some(netns_path.into()),
            if_name: if_name.into(),
            args: Vec::new(),
            capability_args: Map::new(),
        }
    }

    /// Adds a `CNI_ARGS` pair.
    pub fn with_arg(mut self, key: impl Into<String>, value: impl Into<String>) -> Attachment {
        self.args.push((key.into(), value.into()));
        self
    }

    /// Adds a capability argument (`portMappings`, `bandwidth`, …).
    pub fn with_capability(mut self, key: impl Into<String>, value: Value) -> Attachment {
        self.capability_args.insert(key.into(), value);
        self
    }

    /// The same attachment with an empty `CNI_NETNS`.
    pub fn without_netns(mut self) -> Attachment {
        self.netns_path = None;
        self
    }

    /// `CNI_ARGS` as libcni builds it.
    pub fn cni_args(&self) -> String {
        self.args
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";")
    }
}

/// An attachment that GC must keep (`cni.dev/valid-attachments` entry).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GcAttachment {
    /// The container ID.
    pub container_id: String,
    /// The interface name.
    pub if_name: String,
}

/// An attachment recorded in the result cache.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedAttachment {
    /// The network's name.
    pub network: String,
    /// `CNI_CONTAINERID` of the ADD.
    pub container_id: String,
    /// `CNI_IFNAME` of the ADD.
    pub if_name: String,
    /// `CNI_NETNS` of the ADD (empty when none).
    pub netns: String,
    /// `CNI_ARGS` pairs of the ADD.
    pub args: Vec<(String, String)>,
    /// Capability arguments of the ADD.
    pub capability_args: Map<String, Value>,
    /// The cached result (the last plugin's ADD result).
    pub result: Option<Value>,
}

impl CachedAttachment {
    /// The attachment to replay a DEL with, as libcni's GC does.
    pub fn attachment(&self) -> Attachment {
        Attachment {
            container_id: self.container_id.clone(),
            netns_path: (!self.netns.is_empty()).then(|| PathBuf::from(&self.netns)),
            if_name: self.if_name.clone(),
            args: self.args.clone(),
            capability_args: self.capability_args.clone(),
        }
    }
}

/// A network configuration list bound to a plugin search path, a result
/// cache and optionally a node namespace the plugins run in.
#[derive(Debug, Clone)]
pub struct Runtime {
    list: Value,
    list_bytes: Vec<u8>,
    name: String,
    version: String,
    bin_dirs: Vec<PathBuf>,
    cache_dir: PathBuf,
    node_netns: Option<PathBuf>,
}

impl Runtime {
    /// Binds `conflist` (`cniVersion`, `name`, `plugins` each with a `type`)
    /// to the plugin directories `bin_dirs` (searched in order, like
    /// `CNI_PATH`) and the cache directory `cache_dir` (like `/var/lib/cni`).
    pub fn new<I, P>(conflist: Value, bin_dirs: I, cache_dir: impl Into<PathBuf>) -> Result<Runtime>
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        let config = |reason: String| Error::Config { reason };
        let obj = conflist
            .as_object()
            .ok_or_else(|| config("not a JSON object".into()))?;
        let name = obj
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| config("missing string \"name\"".into()))?
            .to_owned();
        validate_id("network name", &name)?;
        let version = obj
            .get("cniVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| config("missing string \"cniVersion\"".into()))?
            .to_owned();
        parse_version(&version).ok_or_else(|| config(format!("bad cniVersion {version:?}")))?;
        let plugins = obj
            .get("plugins")
            .and_then(Value::as_array)
            .ok_or_else(|| config("missing array \"plugins\"".into()))?;
        if plugins.is_empty() {
            return Err(config("\"plugins\" is empty".into()));
        }
        for (i, p) in plugins.iter().enumerate() {
            if p.get("type").and_then(Value::as_str).is_none() {
                return Err(config(format!("plugin {i} has no string \"type\"")));
            }
        }
        let list_bytes = serde_json::to_vec(&conflist).map_err(|e| config(e.to_string()))?;
        Ok(Runtime {
            list: conflist,
            list_bytes,
            name,
            version,
            bin_dirs: bin_dirs.into_iter().map(Into::into).collect(),
            cache_dir: cache_dir.into(),
            node_netns: None,
        })
    }

    /// Like [`Runtime::new`] from the conflist's text.
    pub fn from_text<I, P>(
        conflist: &str,
        bin_dirs: I,
        cache_dir: impl Into<PathBuf>,
    ) -> Result<Runtime>
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        let value = serde_json::from_str(conflist).map_err(|e| Error::Config {
            reason: e.to_string(),
        })?;
        Runtime::new(value, bin_dirs, cache_dir)
    }

    /// Runs every plugin inside the network namespace at `path` (a stand-in
    /// node), not in the namespace of the calling process.
    pub fn in_netns(mut self, path: impl Into<PathBuf>) -> Runtime {
        self.node_netns = Some(path.into());
        self
    }

    /// The network's `name`.
    pub fn network_name(&self) -> &str {
        &self.name
    }

    /// The list's `cniVersion`.
    pub fn cni_version(&self) -> &str {
        &self.version
    }

    /// The configuration list.
    pub fn conflist(&self) -> &Value {
        &self.list
    }

    fn plugins(&self) -> &[Value] {
        self.list["plugins"].as_array().map_or(&[], Vec::as_slice)
    }

    fn flag(&self, key: &str) -> bool {
        self.list.get(key).and_then(Value::as_bool).unwrap_or(false)
    }

    /// ADD: runs the chain in order, each plugin receiving the previous
    /// one's result as `prevResult`, caches and returns the final result.
    pub fn add(&self, att: &Attachment) -> Result<Value> {
        validate_attachment(att)?;
        let mut prev: Option<Value> = None;
        for plugin in self.plugins() {
            let stdin = self.plugin_config(plugin, prev.as_ref(), &att.capability_args);
            let out = self.exec_plugin(plugin, "ADD", &self.env_for(att), &stdin)?;
            prev = Some(parse_output(plugin, "ADD", &out.stdout)?);
        }
        let result = prev.unwrap_or(Value::Null);
        self.cache_write(att, &result)?;
        Ok(result)
    }

    /// CHECK: runs the chain in order with the cached result as
    /// `prevResult`. Errors for a list older than 0.4.0; does nothing when
    /// the list sets `disableCheck`.
    pub fn check(&self, att: &Attachment) -> Result<()> {
        if !version_at_least(&self.version, (0, 4, 0)) {
            return Err(Error::Unsupported {
                version: self.version.clone(),
                command: "CHECK",
            });
        }
        if self.flag("disableCheck") {
            return Ok(());
        }
        validate_attachment(att)?;
        let cached = self.cached_result(att)?;
        for plugin in self.plugins() {
            let stdin = self.plugin_config(plugin, cached.as_ref(), &att.capability_args);
            self.exec_plugin(plugin, "CHECK", &self.env_for(att), &stdin)?;
        }
        Ok(())
    }

    /// DEL: runs the chain in reverse order with the cached result (if any)
    /// as `prevResult`, then removes the cache entry.
    pub fn del(&self, att: &Attachment) -> Result<()> {
        validate_attachment(att)?;
        let cached = if version_at_least(&self.version, (0, 4, 0)) {
            // libcni drops an unreadable entry and goes on without it.
            self.cached_result(att).unwrap_or_else(|_| {
                let _ = std::fs::remove_file(self.cache_path(att));
                None
            })
        } else {
            None
        };
        for plugin in self.plugins().iter().rev() {
            let stdin = self.plugin_config(plugin, cached.as_ref(), &att.capability_args);
            self.exec_plugin(plugin, "DEL", &self.env_for(att), &stdin)?;
        }
        let path = self.cache_path(att);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Cache {
                op: "remove",
                path,
                source,
            }),
        }
    }

    /// STATUS (CNI 1.1): asks each plugin in order whether it can serve ADDs.
    /// A list older than 1.1.0 has no STATUS: success, as in libcni.
    pub fn status(&self) -> Result<()> {
        if !version_at_least(&self.version, (1, 1, 0)) {
            return Ok(());
        }
        for plugin in self.plugins() {
            let stdin = self.plugin_config(plugin, None, &Map::new());
            self.exec_plugin(plugin, "STATUS", &self.empty_env(), &stdin)?;
        }
        Ok(())
    }

    /// GC as libcni does it: DEL every cached attachment of this network that
    /// is not in `valid`, then (CNI ≥ 1.1.0, unless `disableGC`) send GC to
    /// every plugin with the list as `cni.dev/valid-attachments`. Keeps going
    /// past failures and reports them all.
    pub fn gc(&self, valid: &[GcAttachment]) -> Result<()> {
        if self.flag("disableGC") {
            return Ok(());
        }
        let mut errors = Vec::new();
        match self.cached_attachments() {
            Ok(cached) => {
                for c in cached {
                    let key = GcAttachment {
                        container_id: c.container_id.clone(),
                        if_name: c.if_name.clone(),
                    };
                    if c.network != self.name || valid.contains(&key) {
                        continue;
                    }
                    if let Err(e) = self.del(&c.attachment()) {
                        errors.push(e);
                    }
                }
            }
            Err(e) => errors.push(e),
        }
        if version_at_least(&self.version, (1, 1, 0)) {
            let list: Vec<Value> = valid
                .iter()
                .map(|a| json!({"containerID": a.container_id, "ifname": a.if_name}))
                .collect();
            for plugin in self.plugins() {
                let mut stdin = self.plugin_config(plugin, None, &Map::new());
                if let Some(obj) = stdin.as_object_mut() {
                    obj.insert(
                        "cni.dev/valid-attachments".into(),
                        Value::Array(list.clone()),
                    );
                    obj.insert("cni.dev/attachments".into(), Value::Array(list.clone()));
                }
                if let Err(e) = self.exec_plugin(plugin, "GC", &self.empty_env(), &stdin) {
                    errors.push(e);
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Gc {
                network: self.name.clone(),
                errors,
            })
        }
    }

    /// VERSION of the plugin named `plugin_type`: its `supportedVersions`
    /// answer, asked as libcni asks (placeholder `CNI_NETNS`, `CNI_IFNAME`
    /// and `CNI_PATH` for plugins built on an old `skel`).
    pub fn version(&self, plugin_type: &str) -> Result<Value> {
        let plugin = json!({ "type": plugin_type });
        let env = [
            ("CNI_CONTAINERID", String::new()),
            ("CNI_NETNS", "dummy".to_owned()),
            ("CNI_IFNAME", "dummy".to_owned()),
            ("CNI_ARGS", String::new()),
            ("CNI_PATH", "dummy".to_owned()),
        ];
        let stdin = json!({ "cniVersion": self.version });
        let out = self.exec_plugin(&plugin, "VERSION", &env, &stdin)?;
        parse_output(&plugin, "VERSION", &out.stdout)
    }

    /// The stdin libcni builds for `plugin` (one object of the list's
    /// `plugins`): `cniVersion` and `name` of the list, `prevResult` when
    /// given, `runtimeConfig` with the capability arguments it declares.
    pub fn plugin_config(
        &self,
        plugin: &Value,
        prev_result: Option<&Value>,
        capability_args: &Map<String, Value>,
    ) -> Value {
        let mut conf = plugin.as_object().cloned().unwrap_or_default();
        conf.insert("cniVersion".into(), Value::String(self.version.clone()));
        conf.insert("name".into(), Value::String(self.name.clone()));
        if let Some(prev) = prev_result {
            conf.insert("prevResult".into(), prev.clone());
        }
        let mut runtime_config = Map::new();
        if let Some(caps) = plugin.get("capabilities").and_then(Value::as_object) {
            for (cap, enabled) in caps {
                if enabled.as_bool() == Some(true)
                    && let Some(arg) = capability_args.get(cap)
                {
                    runtime_config.insert(cap.clone(), arg.clone());
                }
            }
        }
        if !runtime_config.is_empty() {
            conf.insert("runtimeConfig".into(), Value::Object(runtime_config));
        }
        Value::Object(conf)
    }

    /// The path of the executable for `plugin_type` in the search path.
    pub fn find_plugin(&self, plugin_type: &str) -> Result<PathBuf> {
        if !plugin_type.is_empty() && !plugin_type.contains('/') {
            for dir in &self.bin_dirs {
                let path = dir.join(plugin_type);
                if path.is_file() {
                    return Ok(path);
                }
            }
        }
        Err(Error::PluginNotFound {
            plugin: plugin_type.to_owned(),
            dirs: self.bin_dirs.clone(),
        })
    }

    /// The cache file of an attachment:
    /// `<cache>/results/<network>-<containerID>-<ifname>`.
    pub fn cache_path(&self, att: &Attachment) -> PathBuf {
        self.cache_dir.join("results").join(format!(
            "{}-{}-{}",
            self.name, att.container_id, att.if_name
        ))
    }

    /// The cached ADD result of an attachment, `None` when there is none.
    pub fn cached_result(&self, att: &Attachment) -> Result<Option<Value>> {
        let path = self.cache_path(att);
        Ok(read_cache_file(&path)?.and_then(|c| c.result))
    }

    /// Every attachment in the cache (of every network), as GC sees them.
    pub fn cached_attachments(&self) -> Result<Vec<CachedAttachment>> {
        let dir = self.cache_dir.join("results");
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(Error::Cache {
                    op: "read",
                    path: dir,
                    source,
                });
            }
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            // `.<name>.tmp`: a write in progress (no network name starts with a dot).
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if let Some(c) = read_cache_file(&path)? {
                out.push(c);
            }
        }
        out.sort_by(|a, b| {
            (&a.network, &a.container_id, &a.if_name).cmp(&(
                &b.network,
                &b.container_id,
                &b.if_name,
            ))
        });
        Ok(out)
    }

    fn cache_write(&self, att: &Attachment, result: &Value) -> Result<()> {
        let path = self.cache_path(att);
        let err = |source| Error::Cache {
            op: "write",
            path: path.clone(),
            source,
        };
        let mut record = json!({
            "kind": "cniCacheV1",
            "containerId": att.container_id,
            "config": base64(&self.list_bytes),
            "ifName": att.if_name,
            "networkName": self.name,
            "result": result,
        });
        let netns = netns_str(att);
        if !netns.is_empty() {
            record["netns"] = Value::String(netns);
        }
        if !att.args.is_empty() {
            record["cniArgs"] = json!(att.args.iter().map(|(k, v)| [k, v]).collect::<Vec<_>>());
        }
        if !att.capability_args.is_empty() {
            record["capabilityArgs"] = Value::Object(att.capability_args.clone());
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        // Not `with_extension`: container IDs may contain dots, and two
        // attachments must never share a temporary file.
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{file_name}.tmp"));
        let bytes = serde_json::to_vec(&record).map_err(|e| err(e.into()))?;
        std::fs::write(&tmp, bytes).map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)
    }

    fn env_for(&self, att: &Attachment) -> [(&'static str, String); 5] {
        [
            ("CNI_CONTAINERID", att.container_id.clone()),
            ("CNI_NETNS", netns_str(att)),
            ("CNI_IFNAME", att.if_name.clone()),
            ("CNI_ARGS", att.cni_args()),
            ("CNI_PATH", self.cni_path()),
        ]
    }

    fn empty_env(&self) -> [(&'static str, String); 5] {
        [
            ("CNI_CONTAINERID", String::new()),
            ("CNI_NETNS", String::new()),
            ("CNI_IFNAME", String::new()),
            ("CNI_ARGS", String::new()),
            ("CNI_PATH", self.cni_path()),
        ]
    }

    fn cni_path(&self) -> String {
        self.bin_dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// Execs one plugin with `CNI_COMMAND=command`, the given `CNI_*`
    /// variables (any inherited `CNI_*` removed) and `stdin`, inside the node
    /// namespace when there is one. Non-zero exit → [`Error::Plugin`].
    fn exec_plugin(
        &self,
        plugin: &Value,
        command: &'static str,
        env: &[(&'static str, String)],
        stdin: &Value,
    ) -> Result<Output> {
        let plugin_type = plugin
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let path = self.find_plugin(plugin_type)?;
        let mut cmd = Command::new(&path);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CNI_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("CNI_COMMAND", command)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let input = serde_json::to_vec(stdin).unwrap_or_default();
        let output = match &self.node_netns {
            None => run_with_stdin(cmd, &input),
            Some(ns) => run_in_netns(ns, cmd, &input)?,
        }
        .map_err(|source| Error::Spawn {
            path: path.clone(),
            command,
            source,
        })?;
        if output.status.success() {
            return Ok(output);
        }
        Err(Error::Plugin {
            plugin: plugin_type.to_owned(),
            command,
            status: output.status.to_string(),
            error: CniError::parse(&output.stdout).map(Box::new),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

fn run_with_stdin(mut cmd: Command, input: &[u8]) -> std::io::Result<Output> {
    let mut child = cmd.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        // A plugin that exits without reading its config closes the pipe;
        // its exit status tells what happened.
        match stdin.write_all(input) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            Err(e) => return Err(e),
        }
    }
    child.wait_with_output()
}

/// Moves the calling thread into the network namespace at `path` for the rest of its life;
/// threads it spawns afterwards start there too. The rest of the process keeps its own
/// namespace. For a thread that stands in for a runtime living in its node's namespace.
pub fn enter_netns(path: &Path) -> Result<()> {
    let enter = |source| Error::EnterNetns {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(enter)?;
    nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| enter(std::io::Error::from(e)))
}

/// Whether the calling thread's network namespace is the one at `ns` (same inode).
fn in_netns_already(ns: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        std::fs::metadata(ns),
        std::fs::metadata("/proc/thread-self/ns/net"),
    ) {
        (Ok(want), Ok(have)) => want.dev() == have.dev() && want.ino() == have.ino(),
        _ => false,
    }
}

/// Spawns `cmd` inside the namespace at `ns`: directly when the calling thread is already
/// there, else from a thread that entered it (the child inherits the thread's network
/// namespace, the rest of the process keeps its own).
fn run_in_netns(ns: &Path, cmd: Command, input: &[u8]) -> Result<std::io::Result<Output>> {
    if in_netns_already(ns) {
        return Ok(run_with_stdin(cmd, input));
    }
    std::thread::scope(|s| {
        s.spawn(move || {
            enter_netns(ns)?;
            Ok(run_with_stdin(cmd, input))
        })
        .join()
        .unwrap_or_else(|_| {
            Err(Error::EnterNetns {
                path: ns.to_owned(),
                source: std::io::Error::other("namespace thread panicked"),
            })
        })
    })
}

fn parse_output(plugin: &Value, command: &'static str, stdout: &[u8]) -> Result<Value> {
    serde_json::from_slice(stdout).map_err(|source| Error::BadOutput {
        plugin: plugin
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        command,
        stdout: String::from_utf8_lossy(stdout).into_owned(),
        source,
    })
}

fn read_cache_file(path: &Path) -> Result<Option<CachedAttachment>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Cache {
                op: "read",
                path: path.to_owned(),
                source,
            });
        }
    };
    let v: Value = serde_json::from_slice(&bytes).map_err(|source| Error::CorruptCache {
        path: path.to_owned(),
        source,
    })?;
    let s = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let args = v
        .get("cniArgs")
        .and_then(Value::as_array)
        .map(|pairs| {
            pairs
                .iter()
                .filter_map(|p| {
                    Some((
                        p.get(0)?.as_str()?.to_owned(),
                        p.get(1)?.as_str()?.to_owned(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Some(CachedAttachment {
        network: s("networkName"),
        container_id: s("containerId"),
        if_name: s("ifName"),
        netns: s("netns"),
        args,
        capability_args: v
            .get("capabilityArgs")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        result: v.get("result").filter(|r| !r.is_null()).cloned(),
    }))
}

fn netns_str(att: &Attachment) -> String {
    att.netns_path
        .as_ref()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// libcni's `ValidateContainerID` / `ValidateNetworkName`:
/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
fn validate_id(what: &'static str, value: &str) -> Result<()> {
    let mut chars = value.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid {
            what,
            value: value.to_owned(),
            reason: "must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$",
        })
    }
}

/// libcni's `ValidateInterfaceName`.
fn validate_if_name(value: &str) -> Result<()> {
    let invalid = |reason| Error::Invalid {
        what: "interface name",
        value: value.to_owned(),
        reason,
    };
    if value.is_empty() {
        return Err(invalid("is empty"));
    }
    if value.len() > 15 {
        return Err(invalid("is longer than 15 bytes"));
    }
    if value == "." || value == ".." {
        return Err(invalid("is . or .."));
    }
    if value
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(invalid("contains '/', ':' or whitespace"));
    }
    Ok(())
}

fn validate_attachment(att: &Attachment) -> Result<()> {
    validate_id("container ID", &att.container_id)?;
    validate_if_name(&att.if_name)
}

fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let mut parts = v.split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next().unwrap_or(Some(0))?;
    let patch = parts.next().unwrap_or(Some(0))?;
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

fn version_at_least(v: &str, min: (u64, u64, u64)) -> bool {
    parse_version(v).is_some_and(|v| v >= min)
}

/// Standard base64 with padding: Go's JSON encoding of the cache's `config` bytes.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
