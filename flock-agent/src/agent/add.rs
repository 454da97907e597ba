//! ADD (DESIGN §7.1): return an existing allocation unchanged; otherwise resolve the pod,
//! allocate, persist **pending**, program the kernel, wait for the pod's NetworkPolicy rules,
//! persist **committed**, refresh BIRD.
//!
//! Decided here, purely: the host veth's name ([`choose_host_if`]) and the record
//! ([`new_record`]).

use flock_cni_proto::CniArgs;
use flock_netns::PodSpec;
use flock_rpc::FlockNetConf;
use flock_rpc::rpc::Request;
use serde_json::Value;
use tracing::warn;

use crate::trace::Phases;

use super::{
    Agent, HandlerError, Outcome, attachment_key, cni_result, error, parse_conf, pod_spec,
};
use crate::pods::PodInfo;
use crate::store::{AllocationRecord, AttachmentKey, PodRef, RecordState, STORE_FORMAT};
use flock_k8s_api::NodeSettings;

/// How long the uplink's MTU is taken as read ([`Agent::uplink_mtu`]).
pub const UPLINK_MTU_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// How many host veth names an attachment may try before ADD gives up (each a different
/// FNV-1a 32 hash: a collision with a live attachment is about one in 4·10⁹ per pair).
pub const HOST_IF_ATTEMPTS: u32 = 16;

/// The host veth name of a new attachment: the first of its names
/// ([`flock_netns::host_ifname`]) that no other attachment owns, committed or in progress.
/// A veth another record owns is never reused, so a hash collision never tears down a
/// neighbour.
pub fn choose_host_if(
    key: &AttachmentKey,
    owned: impl Fn(&str) -> bool,
) -> Result<String, HandlerError> {
    (0..HOST_IF_ATTEMPTS)
        .map(|attempt| flock_netns::host_ifname(&key.container_id, &key.if_name, attempt))
        .find(|name| !owned(name))
        .ok_or_else(|| HandlerError::HostIfNames {
            container_id: key.container_id.clone(),
            if_name: key.if_name.clone(),
            tried: HOST_IF_ATTEMPTS,
        })
}

/// Everything an ADD records, before the kernel is touched.
pub struct NewAttachment<'a> {
    /// The request.
    pub request: &'a Request,
    /// Its network configuration.
    pub conf: &'a FlockNetConf,
    /// The pod, when the runtime named it (`K8S_POD_NAME`).
    pub pod: Option<PodRef>,
    /// The addresses allocated.
    pub allocation: flock_ipam::Allocation,
    /// Anycast addresses (not pooled).
    pub anycast: Vec<std::net::IpAddr>,
    /// The host veth.
    pub host_if: String,
    /// The kernel's boot ID.
    pub boot_id: &'a str,
    /// The MTU of the veth pair.
    pub mtu: u32,
    /// Where the addresses come from and what the pod routes through the attachment.
    pub routing: Routing,
}

/// The network an attachment is on, and what the pod routes through it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routing {
    /// The cluster network: the pod's default routes.
    Cluster,
    /// A secondary network (its name): only these destinations.
    Secondary {
        /// `spec.networks[].name`.
        network: String,
        /// The network's routes, then the configuration's.
        routes: Vec<ipnet::IpNet>,
    },
}

/// The network a configuration names, resolved against the node's settings: the cluster
/// network, or one of `spec.networks` with its routes and the configuration's own `routes`
/// (each refused when it overlaps the cluster network's node CIDRs). Errors are CNI error 7
/// naming the field and the value.
pub fn routing(conf: &FlockNetConf, settings: &NodeSettings) -> Result<Routing, HandlerError> {
    let invalid = |msg: String| {
        HandlerError::Request(flock_cni_proto::CniError::new(
            flock_cni_proto::ErrorCode::InvalidNetworkConfig,
            msg,
        ))
    };
    let Some(name) = &conf.network else {
        return Ok(Routing::Cluster);
    };
    let Some(network) = settings.network(name) else {
        let known: Vec<&str> = settings.networks.iter().map(|n| n.name.as_str()).collect();
        return Err(invalid(format!(
            "network {name:?}: node {}'s NodeConfig has no network of that name (it has: {})",
            settings.node,
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        )));
    };
    let cluster = settings.cluster_cidrs();
    let mut routes = network.routes.clone();
    for (i, text) in conf.routes.iter().enumerate() {
        let route =
            flock_k8s_api::settings::secondary_route(&format!("routes[{i}]"), text, &cluster)
                .map_err(|e| invalid(e.to_string()))?;
        if !routes.contains(&route) {
            routes.push(route);
        }
    }
    Ok(Routing::Secondary {
        network: name.clone(),
        routes,
    })
}

/// The allocation request of a secondary network's attachment: the families the network has
/// CIDRs of, the pod's `ip-algo` (a workload keeps its prefix on every network), nothing
/// else of its annotations (anycast and fixed addresses are the cluster network's).
pub fn secondary_request(
    network: &flock_k8s_api::SecondaryNetwork,
    settings: &NodeSettings,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<flock_ipam::PodRequest, flock_ipam::Error> {
    let ip_algo: std::collections::BTreeMap<String, String> = annotations
        .iter()
        .filter(|(k, _)| k.as_str() == flock_k8s_api::IP_ALGO_ANNOTATION)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    flock_ipam::PodRequest::from_annotations(
        &ip_algo,
        &flock_ipam::NodeDefaults {
            ipv6: network.cidr6.is_some(),
            ipv4: network.cidr4.is_some(),
            ip_algo: settings.ip_algo.clone(),
            has_cidr6: network.cidr6.is_some(),
            has_cidr4: network.cidr4.is_some(),
        },
    )
}

/// The pending record of a new attachment.
pub fn new_record(a: NewAttachment<'_>) -> AllocationRecord {
    let (flock_network, default_route, routes) = match a.routing {
        Routing::Cluster => (None, true, Vec::new()),
        Routing::Secondary { network, routes } => (Some(network), false, routes),
    };
    AllocationRecord {
        format: STORE_FORMAT,
        state: RecordState::Pending,
        network: a.conf.name.clone(),
        container_id: a.request.container_id.clone(),
        if_name: a.request.if_name.clone(),
        netns: a.request.netns.clone(),
        boot_id: a.boot_id.to_owned(),
        pod: a.pod,
        ipv6: a.allocation.ipv6,
        ipv4: a.allocation.ipv4,
        addresses: a.allocation.addresses,
        anycast: a.anycast,
        mtu: a.mtu,
        host_if: a.host_if,
        host_mac: String::new(),
        pod_mac: String::new(),
        flock_network,
        default_route,
        routes,
    }
}

/// The node's family defaults and ip-algo, as the annotation parser takes them.
pub fn node_defaults(settings: &NodeSettings) -> flock_ipam::NodeDefaults {
    flock_ipam::NodeDefaults {
        ipv6: settings.default_ipv6,
        ipv4: settings.default_ipv4,
        ip_algo: settings.ip_algo.clone(),
        has_cidr6: settings.cidr6.is_some(),
        has_cidr4: settings.cidr4.is_some(),
    }
}

impl Agent {
    pub(super) async fn add(&self, req: &Request, phases: &mut Phases) -> Outcome<Value> {
        let conf = parse_conf(req)?;
        let key = attachment_key(req)?;
        let _guard = self.lock_container(&req.container_id).await;
        phases.mark("lock");
        if let Some(existing) = self.state().record(&key) {
            // kubelet retries ADD: the same attachment gets the same result.
            return Ok(cni_result(existing).to_value(conf.cni_version));
        }
        if req.netns.is_empty() {
            return Err(HandlerError::MissingNetns);
        }
        let settings = self
            .settings_for_add()
            .await
            .ok_or(HandlerError::NoNodeConfig)?;
        let routing = routing(&conf, &settings)?;
        let args = CniArgs::parse(&req.args)?;
        let pod = self.resolve_pod(&args, &conf, &req.container_id).await?;
        let request = match &routing {
            Routing::Cluster => flock_ipam::PodRequest::from_annotations(
                &pod.annotations,
                &node_defaults(&settings),
            )?,
            Routing::Secondary { network, .. } => secondary_request(
                settings.network(network).expect("resolved by routing()"),
                &settings,
                &pod.annotations,
            )?,
        };
        let mtu = match conf.mtu {
            Some(mtu) => mtu,
            None => self.uplink_mtu(&settings).await,
        };
        let identity = flock_embed::Identity {
            namespace: &pod.pod.namespace,
            workload: &pod.workload,
            image: pod.image.as_deref(),
            pod: &pod.pod.name,
            container_id: &req.container_id,
        };
        phases.mark("resolve");
        let record = {
            let mut state = self.state();
            let host_if = choose_host_if(&key, |name| state.owns_host_if(name))?;
            let network = match &routing {
                Routing::Cluster => None,
                Routing::Secondary { network, .. } => Some(network.as_str()),
            };
            let allocation = {
                let mut rng = self.rng.lock().expect("rng lock");
                state.allocate(network, &request, &identity, &mut *rng)?
            };
            state.claim_host_if(&host_if);
            new_record(NewAttachment {
                request: req,
                conf: &conf,
                // Only a pod the runtime named (K8S_POD_NAME) is recorded: the leak reconcile
                // releases a record whose pod is gone, and a made-up name is never found.
                pod: args
                    .get("K8S_POD_NAME")
                    .is_some_and(|n| !n.is_empty())
                    .then(|| pod.pod.clone()),
                allocation,
                anycast: request.anycast.clone(),
                host_if,
                boot_id: &self.boot_id,
                mtu,
                routing,
            })
        };
        phases.mark("allocate");
        let host_if = record.host_if.clone();
        let outcome = self.add_pending(record, &conf, &pod, phases).await;
        self.state().host_if_done(&host_if);
        outcome
    }

    /// ADD from the pending record on: persist it, program the kernel, put the pod's
    /// NetworkPolicy rules in place, commit.
    async fn add_pending(
        &self,
        mut record: AllocationRecord,
        conf: &FlockNetConf,
        pod: &PodInfo,
        phases: &mut Phases,
    ) -> Outcome<Value> {
        if let Err(e) = self.put_record(&record).await {
            self.state().release_addresses(&record);
            return Err(e);
        }
        phases.mark("store_pending");
        self.fail_at("after-pending");
        let spec = pod_spec(&record, None);
        let outcome = match self.kernel.setup(&spec).await {
            Ok(o) => o,
            Err(e) => {
                self.undo_add(&record, &spec).await;
                return Err(HandlerError::Kernel {
                    op: "set up",
                    container_id: record.container_id.clone(),
                    if_name: record.if_name.clone(),
                    source: Box::new(e),
                });
            }
        };
        phases.mark("kernel");
        phases.kernel_detail(outcome.timing);
        self.fail_at("after-kernel");
        if let Err(e) = self.admit_policy(&record, pod).await {
            self.undo_add(&record, &spec).await;
            return Err(e);
        }
        phases.mark("policy");
        record.state = RecordState::Committed;
        record.host_mac = outcome.host_mac;
        record.pod_mac = outcome.pod_mac;
        if let Err(e) = self.put_record(&record).await {
            self.undo_add(&record, &spec).await;
            return Err(e);
        }
        phases.mark("store_commit");
        self.fail_at("after-commit");
        let announces = !record.addresses.is_empty() || !record.anycast.is_empty();
        let result = cni_result(&record).to_value(conf.cni_version);
        self.state().commit(record);
        self.refresh_metrics();
        if announces {
            self.refresh_bird();
        }
        phases.mark("bird");
        Ok(result)
    }

    async fn undo_add(&self, record: &AllocationRecord, spec: &PodSpec) {
        self.forget_policy(&record.host_if);
        if let Err(e) = self.kernel.teardown(spec).await {
            warn!(error = %error::cause_chain(&e), "undoing a failed ADD left kernel errors");
        }
        if let Err(e) = self.delete_stored(&record.key()).await {
            // The pending record stays, and so do its addresses: start-up will undo both.
            warn!(error = %error::cause_chain(&e), "undoing a failed ADD could not delete its record");
            return;
        }
        self.state().release_addresses(record);
    }

    /// The MTU of a new pod whose network configuration sets none: the MTU of the node's
    /// interface toward its first BGP neighbor (the route to its address, or the interface
    /// of an unnumbered session), read again at most every [`UPLINK_MTU_TTL`] so a change
    /// reaches new pods (existing ones keep theirs); [`DEFAULT_MTU`] without BGP or a route.
    ///
    /// [`DEFAULT_MTU`]: flock_rpc::defaults::DEFAULT_MTU
    pub(super) async fn uplink_mtu(&self, settings: &NodeSettings) -> u32 {
        if let Some((at, mtu)) = *self.uplink_mtu.lock().expect("uplink mtu lock")
            && at.elapsed() < UPLINK_MTU_TTL
        {
            return mtu;
        }
        let neighbor = settings.bgp.as_ref().and_then(|b| b.neighbors.first());
        let toward = neighbor.and_then(|n| match &n.interface {
            Some(name) => Some(flock_netns::Toward::Interface(name)),
            None => n.address.parse().ok().map(flock_netns::Toward::Address),
        });
        let found = match toward {
            Some(toward) => match self.kernel.uplink_mtu(toward).await {
                Ok(found) => found,
                Err(e) => {
                    warn!(error = %error::cause_chain(&e), "reading the uplink's MTU failed");
                    None
                }
            },
            None => None,
        };
        let mtu = found.unwrap_or(flock_rpc::defaults::DEFAULT_MTU);
        *self.uplink_mtu.lock().expect("uplink mtu lock") = Some((std::time::Instant::now(), mtu));
        mtu
    }

    async fn resolve_pod(
        &self,
        args: &CniArgs,
        conf: &FlockNetConf,
        container_id: &str,
    ) -> Outcome<PodInfo> {
        let namespace = args.get("K8S_POD_NAMESPACE").unwrap_or_default().to_owned();
        let name = args.get("K8S_POD_NAME").unwrap_or_default().to_owned();
        let uid = args.get("K8S_POD_UID").unwrap_or_default().to_owned();
        let mut info = match (&self.pods, name.is_empty()) {
            (Some(pods), false) => pods.lookup(&namespace, &name, self.pod_wait).await?,
            _ => {
                let name = if name.is_empty() {
                    container_id.to_owned()
                } else {
                    name
                };
                PodInfo::standalone(namespace, name, uid.clone(), conf.annotations.clone())
            }
        };
        if !uid.is_empty() && info.pod.uid.is_empty() {
            info.pod.uid = uid;
        }
        // The runtime's own copy of the annotations has no informer race: it wins.
        if let Some(a) = &conf.pod_annotations {
            info.annotations = a.clone();
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(cid: &str, ifname: &str) -> AttachmentKey {
        AttachmentKey {
            container_id: cid.into(),
            if_name: ifname.into(),
        }
    }

    #[test]
    fn two_interfaces_of_one_container_get_two_veths() {
        let eth0 = choose_host_if(&key("c1", "eth0"), |_| false).unwrap();
        let net1 = choose_host_if(&key("c1", "net1"), |_| false).unwrap();
        assert_ne!(eth0, net1);
        assert!(eth0.starts_with("flock") && eth0.len() == 13, "{eth0}");
    }

    #[test]
    fn a_name_another_attachment_owns_is_never_chosen() {
        let k = key("c1", "eth0");
        let first = choose_host_if(&k, |_| false).unwrap();
        let second = choose_host_if(&k, |n| n == first).unwrap();
        assert_ne!(first, second);
        let err = choose_host_if(&k, |_| true).unwrap_err();
        assert!(err.to_string().contains("16 names"), "{err}");
    }
}
