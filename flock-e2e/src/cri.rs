//! A CRI v1 client (crate `k8s-cri`, tonic) on containerd's Unix socket:
//! the sandbox calls kubelet makes, and what a test reads back.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListPodSandboxRequest, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, PortMapping,
    Protocol, RemovePodSandboxRequest, RunPodSandboxRequest, StatusRequest, StopPodSandboxRequest,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::{Error, Result};

/// What kubelet would put in a sandbox's config, reduced to what matters
/// to a CNI plugin: the pod's identity (it reaches the plugin as `CNI_ARGS`
/// `K8S_POD_NAME`, `K8S_POD_NAMESPACE`, `K8S_POD_UID`) and its annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSandboxSpec {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// Restart attempt (kubelet counts from 0).
    pub attempt: u32,
    /// Pod annotations (containerd passes them to CNI as
    /// `io.kubernetes.cri.pod-annotations` when a plugin asks for them).
    pub annotations: HashMap<String, String>,
    /// The cgroup parent; empty lets containerd choose.
    pub cgroup_parent: String,
    /// TCP `hostPort`s as (host port, container port): containerd passes them to CNI as the
    /// `portMappings` capability.
    pub host_ports: Vec<(u16, u16)>,
}

impl PodSandboxSpec {
    /// A pod `namespace/name` with `uid`, attempt 0, no annotations.
    pub fn new(name: &str, namespace: &str, uid: &str) -> PodSandboxSpec {
        PodSandboxSpec {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            uid: uid.to_owned(),
            attempt: 0,
            annotations: HashMap::new(),
            cgroup_parent: String::new(),
            host_ports: Vec::new(),
        }
    }

    /// The RunPodSandbox request kubelet would send: pod network, IPC and
    /// PID namespaces (PID per container, as v1 pods default to).
    pub fn to_request(&self) -> RunPodSandboxRequest {
        RunPodSandboxRequest {
            config: Some(PodSandboxConfig {
                metadata: Some(PodSandboxMetadata {
                    name: self.name.clone(),
                    uid: self.uid.clone(),
                    namespace: self.namespace.clone(),
                    attempt: self.attempt,
                }),
                hostname: self.name.clone(),
                labels: HashMap::from([
                    ("io.kubernetes.pod.name".to_owned(), self.name.clone()),
                    (
                        "io.kubernetes.pod.namespace".to_owned(),
                        self.namespace.clone(),
                    ),
                    ("io.kubernetes.pod.uid".to_owned(), self.uid.clone()),
                ]),
                annotations: self.annotations.clone(),
                port_mappings: self
                    .host_ports
                    .iter()
                    .map(|&(host, container)| PortMapping {
                        protocol: Protocol::Tcp as i32,
                        container_port: i32::from(container),
                        host_port: i32::from(host),
                        host_ip: String::new(),
                    })
                    .collect(),
                linux: Some(LinuxPodSandboxConfig {
                    cgroup_parent: self.cgroup_parent.clone(),
                    security_context: Some(LinuxSandboxSecurityContext {
                        namespace_options: Some(NamespaceOption {
                            network: NamespaceMode::Pod as i32,
                            pid: NamespaceMode::Container as i32,
                            ipc: NamespaceMode::Pod as i32,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            runtime_handler: String::new(),
        }
    }

    fn target(&self) -> String {
        format!("pod {}/{}", self.namespace, self.name)
    }
}

/// A sandbox that RunPodSandbox created, and how long the call took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRun {
    /// The sandbox id.
    pub id: String,
    /// Wall time of the RunPodSandbox call (netns, CNI ADD, pause start).
    pub elapsed: Duration,
}

/// A sandbox's network as PodSandboxStatus (verbose) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxNetwork {
    /// The pinned network namespace (a mount in containerd's mount
    /// namespace; see [`crate::Containerd::command_in_netns`]).
    pub netns_path: PathBuf,
    /// The pause process.
    pub pid: u32,
    /// The pod IPs, primary first.
    pub ips: Vec<IpAddr>,
    /// The sandbox state (`SANDBOX_READY`, `SANDBOX_NOTREADY`).
    pub state: String,
}

/// RuntimeReady and NetworkReady from the CRI Status call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunConditions {
    /// The runtime can run sandboxes.
    pub runtime_ready: bool,
    /// The network is ready: the CRI plugin has loaded a CNI config and, for a network of CNI
    /// 1.1.0 or later (containerd 2), the plugin's STATUS succeeded.
    pub network_ready: bool,
    /// The CRI plugin has loaded a CNI config (whatever the plugin's STATUS says).
    pub cni_loaded: bool,
    /// The reasons and messages of conditions that are not met.
    pub not_ready: Vec<String>,
}

/// A CRI runtime-service client on a Unix socket.
#[derive(Debug, Clone)]
pub struct CriClient {
    runtime: RuntimeServiceClient<Channel>,
}

impl CriClient {
    /// Opens a gRPC channel over the Unix socket at `socket`.
    pub async fn connect(socket: &Path) -> Result<CriClient> {
        let path = socket.to_owned();
        // The URI is required by tonic and ignored by the connector.
        let channel =
            Endpoint::from_static("http://[::1]:50051")
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await
                .map_err(|source| Error::Connect {
                    socket: socket.to_owned(),
                    source,
                })?;
        Ok(CriClient {
            runtime: RuntimeServiceClient::new(channel),
        })
    }

    /// The runtime's readiness conditions.
    pub async fn status(&mut self) -> Result<RunConditions> {
        let resp = self
            .runtime
            .status(StatusRequest { verbose: false })
            .await
            .map_err(|s| rpc_error("Status", "runtime", s))?
            .into_inner();
        let conditions = resp.status.map(|s| s.conditions).unwrap_or_default();
        let met = |kind: &str| conditions.iter().any(|c| c.r#type == kind && c.status);
        // go-cni's error before a config is loaded; any other NetworkReady failure is the
        // plugin's own STATUS.
        let unloaded = conditions.iter().any(|c| {
            c.r#type == "NetworkReady"
                && !c.status
                && c.message.contains("cni plugin not initialized")
        });
        Ok(RunConditions {
            runtime_ready: met("RuntimeReady"),
            network_ready: met("NetworkReady"),
            cni_loaded: !unloaded,
            not_ready: conditions
                .iter()
                .filter(|c| !c.status)
                .map(|c| format!("{}: {} {}", c.r#type, c.reason, c.message))
                .collect(),
        })
    }

    /// Polls Status until RuntimeReady holds and the CRI plugin has loaded a conflist, or
    /// `timeout`. The network may still be not ready: a CNI 1.1 plugin's STATUS fails while
    /// its agent does not run (containerd 2).
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            let last = match self.status().await {
                Ok(c) if c.runtime_ready && c.cni_loaded => return Ok(()),
                Ok(c) => c.not_ready.join("; "),
                Err(e) => e.to_string(),
            };
            if started.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: format!("CRI runtime and network ready (last: {last})"),
                    waited: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// RunPodSandbox; returns the sandbox id and the call's wall time.
    pub async fn run_pod_sandbox(&mut self, pod: &PodSandboxSpec) -> Result<SandboxRun> {
        let started = Instant::now();
        let resp = self
            .runtime
            .run_pod_sandbox(pod.to_request())
            .await
            .map_err(|s| rpc_error("RunPodSandbox", &pod.target(), s))?
            .into_inner();
        let elapsed = started.elapsed();
        if resp.pod_sandbox_id.is_empty() {
            return Err(Error::BadAnswer {
                rpc: "RunPodSandbox",
                target: pod.target(),
                reason: "empty pod_sandbox_id".into(),
            });
        }
        Ok(SandboxRun {
            id: resp.pod_sandbox_id,
            elapsed,
        })
    }

    /// PodSandboxStatus (verbose): the netns path and pause pid from
    /// containerd's info JSON, the IPs from the network status.
    pub async fn sandbox_network(&mut self, id: &str) -> Result<SandboxNetwork> {
        let target = format!("sandbox {id}");
        let resp = self
            .runtime
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.to_owned(),
                verbose: true,
            })
            .await
            .map_err(|s| rpc_error("PodSandboxStatus", &target, s))?
            .into_inner();
        let bad = |reason: String| Error::BadAnswer {
            rpc: "PodSandboxStatus",
            target: target.clone(),
            reason,
        };
        let status = resp.status.ok_or_else(|| bad("no status".into()))?;
        let mut ips = Vec::new();
        if let Some(net) = &status.network {
            for text in std::iter::once(&net.ip).chain(net.additional_ips.iter().map(|p| &p.ip)) {
                if text.is_empty() {
                    continue;
                }
                ips.push(
                    text.parse()
                        .map_err(|e| bad(format!("pod IP {text:?}: {e}")))?,
                );
            }
        }
        let info = resp
            .info
            .get("info")
            .ok_or_else(|| bad("verbose info has no \"info\" key".into()))?;
        let (netns_path, pid) = parse_info(info).map_err(bad)?;
        let state = k8s_cri::v1::PodSandboxState::try_from(status.state)
            .map(|s| s.as_str_name().to_owned())
            .unwrap_or_else(|_| status.state.to_string());
        Ok(SandboxNetwork {
            netns_path,
            pid,
            ips,
            state,
        })
    }

    /// StopPodSandbox: kills the pause process and runs CNI DEL with the
    /// netns and the cached result.
    pub async fn stop_pod_sandbox(&mut self, id: &str) -> Result<()> {
        self.runtime
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await
            .map_err(|s| rpc_error("StopPodSandbox", &format!("sandbox {id}"), s))?;
        Ok(())
    }

    /// RemovePodSandbox: CNI DEL again (no netns), then forgets the sandbox.
    pub async fn remove_pod_sandbox(&mut self, id: &str) -> Result<()> {
        self.runtime
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await
            .map_err(|s| rpc_error("RemovePodSandbox", &format!("sandbox {id}"), s))?;
        Ok(())
    }

    /// The ids of every sandbox containerd knows.
    pub async fn list_pod_sandbox_ids(&mut self) -> Result<Vec<String>> {
        let resp = self
            .runtime
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await
            .map_err(|s| rpc_error("ListPodSandbox", "all sandboxes", s))?
            .into_inner();
        Ok(resp.items.into_iter().map(|s| s.id).collect())
    }
}

fn rpc_error(rpc: &'static str, target: &str, status: tonic::Status) -> Error {
    Error::Rpc {
        rpc,
        target: target.to_owned(),
        source: Box::new(status),
    }
}

/// The network namespace path and pause pid in containerd 1.6's verbose
/// sandbox info (`pid`, `runtimeSpec.linux.namespaces[type=network].path`).
fn parse_info(info: &str) -> Result<(PathBuf, u32), String> {
    let v: serde_json::Value =
        serde_json::from_str(info).map_err(|e| format!("info is not JSON: {e}"))?;
    let pid = v["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .ok_or("info has no numeric \"pid\"")?;
    let path = v["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|ns| ns["type"] == "network")
        .and_then(|ns| ns["path"].as_str())
        .filter(|p| !p.is_empty())
        .ok_or("info has no network namespace path in runtimeSpec.linux.namespaces")?;
    Ok((PathBuf::from(path), pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_request_snapshot() {
        let mut pod =
            PodSandboxSpec::new("web-0", "default", "0f1e2d3c-0000-4000-8000-000000000001");
        pod.annotations
            .insert("flock.dev/ip-algo".into(), "workload".into());
        let request = serde_json::to_value(pod.to_request()).expect("request serialises");
        insta::assert_json_snapshot!(sorted(request));
    }

    /// Map keys in order, whatever the map type behind the JSON.
    fn sorted(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(m) => {
                let mut entries: Vec<_> = m.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Object(
                    entries.into_iter().map(|(k, v)| (k, sorted(v))).collect(),
                )
            }
            serde_json::Value::Array(a) => a.into_iter().map(sorted).collect(),
            other => other,
        }
    }

    #[test]
    fn info_parsing() {
        let info = r#"{"pid":4242,"runtimeSpec":{"linux":{"namespaces":[
            {"type":"pid"},{"type":"network","path":"/s/netns/cni-1"}]}}}"#;
        assert_eq!(
            parse_info(info),
            Ok((PathBuf::from("/s/netns/cni-1"), 4242))
        );
        assert!(parse_info(r#"{"pid":1,"runtimeSpec":{}}"#).is_err());
        assert!(parse_info(r#"{"runtimeSpec":{}}"#).is_err());
        assert!(parse_info("not json").is_err());
    }
}
