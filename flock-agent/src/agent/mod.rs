//! The agent's core: node state, the ADD/DEL/CHECK/STATUS/GC handlers of DESIGN §7, and the
//! start-up reconcile that makes any crash leave nothing behind.
//!
//! Ordering rules that make it crash-safe:
//! - ADD persists a **pending** record before the kernel is touched and a **committed** one
//!   after; start-up undoes pending records and keeps committed ones.
//! - GC and start-up list the kernel's `flock*` interfaces *before* reading the records, so an
//!   interface seen without a record really has none (a record is always written before its
//!   interface exists).
//! - Requests for one container are serialised; different containers run in parallel.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use flock_cni_proto::rpc::{Op, Request, Response};
use flock_cni_proto::{
    CniArgs, CniError, CniResult, ErrorCode, FlockNetConf, Interface, IpConfig, IpPrefix, NetConf,
    Route,
};
use flock_netns::{NodeNs, PodSpec};
use ipnet::IpNet;
use rand_chacha::ChaCha12Rng;
use rand_core::SeedableRng;
use serde_json::Value;
use tracing::{info, warn};

use crate::bird::BirdHandle;
use crate::metrics::{Health, Metrics};
use crate::nodeconfig::NodeSettings;
use crate::pods::{PodDirectory, PodInfo};
use crate::store::{AllocationRecord, AttachmentKey, RecordState, STORE_FORMAT, Store};

/// flock's own CNI error codes (100 and up, as the spec reserves for plugins).
pub mod codes {
    /// A pod annotation is malformed or asks for something the node cannot give.
    pub const INVALID_ANNOTATION: u32 = 100;
    /// The pool has no free address left.
    pub const POOL_EXHAUSTED: u32 = 101;
    /// A fixed address is already in use.
    pub const ADDRESS_IN_USE: u32 = 102;
    /// Programming or tearing down the kernel failed.
    pub const KERNEL: u32 = 103;
    /// The allocation store could not be written.
    pub const STORE: u32 = 104;
    /// CHECK found a difference between the kernel and the record.
    pub const CHECK_MISMATCH: u32 = 105;
}

/// How long ADD waits for the pod watcher to see a pod it has not seen yet.
pub const DEFAULT_POD_WAIT: Duration = Duration::from_secs(10);

/// The agent: state shared by every request.
pub struct Agent {
    node_ns: Arc<NodeNs>,
    store: Arc<Store>,
    boot_id: String,
    settings: RwLock<Option<Arc<NodeSettings>>>,
    pools: Mutex<flock_ipam::Pools>,
    records: Mutex<BTreeMap<AttachmentKey, AllocationRecord>>,
    container_locks: Arc<ContainerLocks>,
    /// Host veths of ADDs in progress (pending records): not orphans.
    in_flight: Mutex<BTreeSet<String>>,
    rng: Mutex<ChaCha12Rng>,
    bird: RwLock<Option<BirdHandle>>,
    pods: Option<Arc<dyn PodDirectory>>,
    pod_wait: Duration,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    failpoint: Option<String>,
}

/// What [`Agent::start`] needs.
pub struct AgentParts {
    /// Where the host side lives (the agent's own namespace in production).
    pub node_ns: NodeNs,
    /// The state directory.
    pub state_dir: PathBuf,
    /// The node's settings, when known at start (standalone) — Kubernetes mode sets them later.
    pub settings: Option<NodeSettings>,
    /// The pod watcher (Kubernetes mode).
    pub pods: Option<Arc<dyn PodDirectory>>,
    /// How long ADD waits for the pod watcher.
    pub pod_wait: Duration,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Health.
    pub health: Arc<Health>,
}

/// What start-up found and did, for the log and the tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StartupReport {
    /// Committed allocations kept.
    pub kept: usize,
    /// Pending allocations undone.
    pub undone_pending: usize,
    /// Allocations released because their namespace is gone (reboot or deleted netns).
    pub released_stale: usize,
    /// Host interfaces removed that no record owned.
    pub removed_orphan_ifaces: usize,
    /// Queued DELs processed.
    pub drained_dels: usize,
}

type CniOutcome = Result<Value, CniError>;

fn err(code: ErrorCode, msg: impl Into<String>) -> CniError {
    CniError::new(code, msg)
}

fn plugin_err(code: u32, msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::Plugin(code), msg)
}

impl Agent {
    /// Opens the store and runs the start-up reconcile of DESIGN §7: reserve committed
    /// addresses, undo pending ones, release allocations whose namespace is gone, remove host
    /// interfaces no record owns, and install the node CIDR blackholes.
    pub async fn start(parts: AgentParts) -> crate::Result<(Arc<Agent>, StartupReport)> {
        let (store, records) = {
            let dir = parts.state_dir.clone();
            tokio::task::spawn_blocking(move || Store::open(&dir))
                .await
                .expect("store open task")?
        };
        let boot_id = read_boot_id();
        let pools = flock_ipam::Pools::new(
            parts.settings.as_ref().and_then(|s| s.cidr6),
            parts.settings.as_ref().and_then(|s| s.cidr4),
        )
        .map_err(|e| crate::Error::InvalidNodeConfig {
            field: "spec".into(),
            value: String::new(),
            reason: e.to_string(),
        })?;
        let agent = Arc::new(Agent {
            node_ns: Arc::new(parts.node_ns),
            store: Arc::new(store),
            boot_id,
            settings: RwLock::new(parts.settings.map(Arc::new)),
            pools: Mutex::new(pools),
            records: Mutex::new(BTreeMap::new()),
            container_locks: Arc::default(),
            in_flight: Mutex::default(),
            rng: Mutex::new(ChaCha12Rng::from_seed(os_seed())),
            bird: RwLock::new(None),
            pods: parts.pods,
            pod_wait: parts.pod_wait,
            metrics: parts.metrics,
            health: parts.health,
            failpoint: std::env::var("FLOCK_FAILPOINT")
                .ok()
                .filter(|f| !f.is_empty()),
        });
        let report = agent.reconcile_at_start(records).await?;
        Ok((agent, report))
    }

    async fn reconcile_at_start(
        &self,
        records: Vec<AllocationRecord>,
    ) -> crate::Result<StartupReport> {
        let mut report = StartupReport::default();
        for record in records {
            let stale_reason = match record.state {
                RecordState::Pending => Some("pending at the last stop"),
                RecordState::Committed if record.boot_id != self.boot_id => {
                    Some("the node rebooted since")
                }
                RecordState::Committed if !Path::new(&record.netns).exists() => {
                    Some("its network namespace is gone")
                }
                RecordState::Committed => None,
            };
            match stale_reason {
                None => {
                    let mut pools = self.pools.lock().expect("pools lock");
                    for addr in record.pooled_addresses() {
                        if let Err(e) = pools.reserve(addr) {
                            // Two records claiming one address can only come from a store
                            // edited by hand; keep the first and say so loudly.
                            warn!(container_id = %record.container_id, %addr, error = %e,
                                "address of a committed record could not be reserved");
                        }
                    }
                    drop(pools);
                    self.records
                        .lock()
                        .expect("records lock")
                        .insert(record.key(), record);
                    report.kept += 1;
                }
                Some(reason) => {
                    info!(container_id = %record.container_id, if_name = %record.if_name,
                        reason, "releasing allocation at start-up");
                    let spec = pod_spec(&record, None);
                    if let Err(e) = flock_netns::teardown(&self.node_ns, &spec).await {
                        warn!(container_id = %record.container_id, error = %e,
                            "teardown at start-up reported errors");
                    }
                    self.delete_record(&record.key())
                        .await
                        .map_err(|e| crate::Error::StoreRecord { reason: e.msg })?;
                    if record.state == RecordState::Pending {
                        report.undone_pending += 1;
                    } else {
                        report.released_stale += 1;
                    }
                }
            }
        }
        report.removed_orphan_ifaces = self.remove_orphan_ifaces().await;
        self.sync_anycast_routes().await;
        self.install_blackholes().await;
        self.refresh_metrics();
        Ok(report)
    }

    /// Installs the blackhole routes of the node CIDRs (idempotent).
    pub async fn install_blackholes(&self) {
        let cidrs = self.node_cidrs();
        if cidrs.is_empty() {
            return;
        }
        if let Err(e) = flock_netns::ensure_blackholes(&self.node_ns, &cidrs).await {
            warn!(error = %e, "installing the node CIDR blackholes failed");
            self.health.set_problem("kernel", Some(e.to_string()));
        }
    }

    fn node_cidrs(&self) -> Vec<IpNet> {
        let settings = self.settings();
        let mut v = Vec::new();
        if let Some(s) = settings.as_deref() {
            v.extend(s.cidr6.map(IpNet::V6));
            v.extend(s.cidr4.map(IpNet::V4));
        }
        v
    }

    /// Removes `flock*` host interfaces that no record owns; returns how many.
    async fn remove_orphan_ifaces(&self) -> usize {
        // Kernel first, records second: see the module documentation.
        let ifaces = match flock_netns::list_host_ifaces(&self.node_ns).await {
            Ok(i) => i,
            Err(e) => {
                warn!(error = %e, "listing host interfaces failed");
                return 0;
            }
        };
        let mut owned: BTreeSet<String> = self
            .records
            .lock()
            .expect("records lock")
            .values()
            .map(|r| r.host_if.clone())
            .collect();
        owned.extend(
            self.in_flight
                .lock()
                .expect("in-flight lock")
                .iter()
                .cloned(),
        );
        let mut removed = 0;
        for iface in ifaces {
            if owned.contains(&iface.name) {
                continue;
            }
            match flock_netns::remove_host_iface(&self.node_ns, &iface.name).await {
                Ok(_) => {
                    info!(iface = %iface.name, "removed a host interface no allocation owns");
                    removed += 1;
                }
                Err(e) => {
                    warn!(iface = %iface.name, error = %e, "removing orphan interface failed")
                }
            }
        }
        removed
    }

    /// Sets every anycast route to exactly the local pods that carry the address.
    async fn sync_anycast_routes(&self) {
        let mut members: BTreeMap<IpAddr, Vec<flock_netns::AnycastMember>> = BTreeMap::new();
        for r in self.records.lock().expect("records lock").values() {
            for a in &r.anycast {
                members
                    .entry(*a)
                    .or_default()
                    .push(flock_netns::AnycastMember {
                        host_if: r.host_if.clone(),
                        pod_ip6: r.ipv6,
                    });
            }
        }
        for (addr, m) in members {
            if let Err(e) = flock_netns::sync_anycast(&self.node_ns, addr, &m).await {
                warn!(%addr, error = %e, "anycast route sync failed");
            }
        }
    }

    /// Replaces the node's settings (a NodeConfig event). Live allocations stay reserved even
    /// when a CIDR changes under them.
    pub async fn set_settings(&self, settings: Option<NodeSettings>) {
        {
            let mut pools = self.pools.lock().expect("pools lock");
            if let Err(e) = pools.set_node_cidrs(
                settings.as_ref().and_then(|s| s.cidr6),
                settings.as_ref().and_then(|s| s.cidr4),
            ) {
                // NodeSettings were validated with the same rules: this cannot happen, but if
                // it did, the old pools stay in force.
                warn!(error = %e, "new node CIDRs refused by the pools; keeping the old ones");
                return;
            }
        }
        match &settings {
            None => self.health.set_problem(
                "nodeconfig",
                Some("no NodeConfig for this node: new pods cannot be served".into()),
            ),
            Some(_) => self.health.set_problem("nodeconfig", None),
        }
        let before = self.node_cidrs();
        *self.settings.write().expect("settings lock") = settings.map(Arc::new);
        let after = self.node_cidrs();
        // A CIDR the node no longer owns loses its blackhole (it is no longer announced
        // either); live pods in it keep working through their own /128 and /32 routes.
        for old in before.into_iter().filter(|c| !after.contains(c)) {
            if let Err(e) = flock_netns::remove_blackhole(&self.node_ns, old).await {
                warn!(cidr = %old, error = %e, "removing an old node CIDR's blackhole failed");
            }
        }
        self.install_blackholes().await;
        self.refresh_metrics();
        self.refresh_bird();
    }

    /// The node's current settings.
    pub fn settings(&self) -> Option<Arc<NodeSettings>> {
        self.settings.read().expect("settings lock").clone()
    }

    /// Connects the BIRD writer.
    pub fn set_bird(&self, handle: BirdHandle) {
        *self.bird.write().expect("bird lock") = Some(handle);
    }

    fn refresh_bird(&self) {
        if let Some(b) = self.bird.read().expect("bird lock").as_ref() {
            b.refresh();
        }
    }

    /// A snapshot of every committed allocation.
    pub fn records(&self) -> Vec<AllocationRecord> {
        self.records
            .lock()
            .expect("records lock")
            .values()
            .cloned()
            .collect()
    }

    /// The BIRD configuration of this node: the NodeConfig's BGP setup, the node CIDRs as
    /// aggregates, and individually every pod address outside them (the `addresses`
    /// annotation, or pods left over from a CIDR change) and every anycast address.
    /// `Ok(None)` without BGP settings.
    pub fn render_bird(&self) -> Result<Option<String>, String> {
        let Some(settings) = self.settings() else {
            return Ok(None);
        };
        let Some(mut model) = settings.bgp.clone() else {
            return Ok(None);
        };
        let cidrs = model.cidrs.clone();
        for record in self.records() {
            for addr in record.pooled_addresses() {
                if !cidrs.iter().any(|c| c.contains(&addr)) {
                    model.addresses.push(addr);
                }
            }
            model.anycast.extend(record.anycast.iter().copied());
        }
        let valid = model.validate().map_err(|e| e.to_string())?;
        Ok(Some(flock_bird::render(&valid)))
    }

    fn refresh_metrics(&self) {
        let stats = self.pools.lock().expect("pools lock").stats();
        self.metrics
            .set_family("ipv6", stats.allocated6 as u64, stats.capacity6);
        self.metrics
            .set_family("ipv4", stats.allocated4 as u64, u128::from(stats.capacity4));
    }

    async fn lock_container(&self, container_id: &str) -> ContainerGuard {
        let lock = self
            .container_locks
            .lock()
            .expect("container locks")
            .entry(container_id.to_owned())
            .or_default()
            .clone();
        ContainerGuard {
            locks: self.container_locks.clone(),
            container_id: container_id.to_owned(),
            guard: Some(lock.lock_owned().await),
        }
    }

    /// Handles one RPC request and returns its response.
    pub async fn handle(&self, request: Request) -> Response {
        let started = std::time::Instant::now();
        let op = request.op;
        let span =
            tracing::info_span!("cni", op = op.as_str(), container_id = %request.container_id);
        let _enter = span.enter();
        let outcome = match op {
            Op::Add => self.add(&request).await,
            Op::Del => self.del(&request).await.map(|()| Value::Null),
            Op::Check => self.check(&request).await.map(|()| Value::Null),
            Op::Status => self.status(&request).await.map(|()| Value::Null),
            Op::Gc => self.gc(&request).await.map(|()| Value::Null),
        };
        let label = match &outcome {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.code.as_u32().to_string(),
        };
        self.metrics
            .observe_request(op.as_str(), &label, started.elapsed());
        match outcome {
            Ok(Value::Null) => Response::done(),
            Ok(v) => Response::ok(v),
            Err(e) => {
                info!(code = e.code.as_u32(), msg = %e.msg, "request failed");
                Response::error(e)
            }
        }
    }

    fn fail_at(&self, point: &str) {
        if self.failpoint.as_deref() == Some(point) {
            eprintln!("flock-agent: failpoint {point}: exiting");
            std::process::abort();
        }
    }

    async fn add(&self, req: &Request) -> CniOutcome {
        let conf = parse_conf(req)?;
        let key = attachment_key(req)?;
        let _guard = self.lock_container(&req.container_id).await;
        if let Some(existing) = self.records.lock().expect("records lock").get(&key) {
            // kubelet retries ADD: the same attachment gets the same result.
            return Ok(cni_result(existing).to_value(conf.cni_version));
        }
        if req.netns.is_empty() {
            return Err(err(
                ErrorCode::InvalidEnvironmentVariables,
                "ADD needs CNI_NETNS",
            ));
        }
        let settings = self.settings().ok_or_else(|| {
            err(
                ErrorCode::TryAgainLater,
                "no NodeConfig for this node yet: flock cannot allocate addresses",
            )
        })?;
        let args = CniArgs::parse(&req.args)?;
        let pod = self.resolve_pod(&args, &conf, &req.container_id).await?;
        let request =
            flock_ipam::PodRequest::from_annotations(&pod.annotations, &node_defaults(&settings))
                .map_err(|e| plugin_err(codes::INVALID_ANNOTATION, e.to_string()))?;
        let identity = flock_embed::Identity {
            namespace: &pod.pod.namespace,
            workload: &pod.workload,
            image: pod.image.as_deref(),
            pod: &pod.pod.name,
            container_id: &req.container_id,
        };
        let allocation = {
            let mut pools = self.pools.lock().expect("pools lock");
            let mut rng = self.rng.lock().expect("rng lock");
            pools
                .allocate(&request, &identity, &mut *rng)
                .map_err(ipam_error)?
        };
        let record = AllocationRecord {
            format: STORE_FORMAT,
            state: RecordState::Pending,
            network: conf.name.clone(),
            container_id: req.container_id.clone(),
            if_name: req.if_name.clone(),
            netns: req.netns.clone(),
            boot_id: self.boot_id.clone(),
            // Only a pod the runtime named (K8S_POD_NAME) is recorded: the leak reconcile
            // releases a record whose pod is gone, and a made-up name is never found.
            pod: args
                .get("K8S_POD_NAME")
                .is_some_and(|n| !n.is_empty())
                .then(|| pod.pod.clone()),
            ipv6: allocation.ipv6,
            ipv4: allocation.ipv4,
            addresses: allocation.addresses.clone(),
            anycast: request.anycast.clone(),
            mtu: conf.mtu,
            host_if: flock_netns::host_ifname(&req.container_id),
            host_mac: String::new(),
            pod_mac: String::new(),
        };
        self.in_flight
            .lock()
            .expect("in-flight lock")
            .insert(record.host_if.clone());
        let outcome = self.add_pending(record, key, &conf).await;
        self.in_flight
            .lock()
            .expect("in-flight lock")
            .remove(&flock_netns::host_ifname(&req.container_id));
        outcome
    }

    /// ADD from the pending record on: persist it, program the kernel, commit.
    async fn add_pending(
        &self,
        mut record: AllocationRecord,
        key: AttachmentKey,
        conf: &FlockNetConf,
    ) -> CniOutcome {
        if let Err(e) = self.put_record(&record).await {
            self.release(&record);
            return Err(e);
        }
        self.fail_at("after-pending");
        let spec = pod_spec(&record, None);
        let outcome = match flock_netns::setup(&self.node_ns, &spec).await {
            Ok(o) => o,
            Err(e) => {
                let msg = e.to_string();
                self.undo_add(&record, &spec).await;
                return Err(plugin_err(codes::KERNEL, msg));
            }
        };
        self.fail_at("after-kernel");
        record.state = RecordState::Committed;
        record.host_mac = outcome.host_mac.clone();
        record.pod_mac = outcome.pod_mac.clone();
        if let Err(e) = self.put_record(&record).await {
            self.undo_add(&record, &spec).await;
            return Err(e);
        }
        self.fail_at("after-commit");
        let announces = !record.addresses.is_empty() || !record.anycast.is_empty();
        let result = cni_result(&record).to_value(conf.cni_version);
        self.records
            .lock()
            .expect("records lock")
            .insert(key, record);
        self.refresh_metrics();
        if announces {
            self.refresh_bird();
        }
        Ok(result)
    }

    async fn undo_add(&self, record: &AllocationRecord, spec: &PodSpec) {
        if let Err(e) = flock_netns::teardown(&self.node_ns, spec).await {
            warn!(error = %e, "undoing a failed ADD left kernel errors");
        }
        if let Err(e) = self.delete_record(&record.key()).await {
            warn!(error = %e.msg, "undoing a failed ADD could not delete its record");
            return; // the pending record stays; start-up will undo it
        }
        self.release(record);
    }

    fn release(&self, record: &AllocationRecord) {
        let mut pools = self.pools.lock().expect("pools lock");
        for addr in record.pooled_addresses() {
            pools.release(addr);
        }
    }

    async fn put_record(&self, record: &AllocationRecord) -> Result<(), CniError> {
        let started = std::time::Instant::now();
        let store = self.store.clone();
        let record = record.clone();
        let outcome = tokio::task::spawn_blocking(move || store.put(&record))
            .await
            .expect("store write task");
        self.metrics
            .store_write_seconds
            .observe(started.elapsed().as_secs_f64());
        match outcome {
            Ok(()) => {
                self.health.set_problem("store", None);
                Ok(())
            }
            Err(e) => {
                self.health.set_problem("store", Some(e.to_string()));
                Err(plugin_err(codes::STORE, e.to_string()))
            }
        }
    }

    async fn delete_record(&self, key: &AttachmentKey) -> Result<(), CniError> {
        let store = self.store.clone();
        let k = key.clone();
        tokio::task::spawn_blocking(move || store.delete(&k))
            .await
            .expect("store delete task")
            .map_err(|e| plugin_err(codes::STORE, e.to_string()))?;
        self.records.lock().expect("records lock").remove(key);
        Ok(())
    }

    async fn resolve_pod(
        &self,
        args: &CniArgs,
        conf: &FlockNetConf,
        container_id: &str,
    ) -> Result<PodInfo, CniError> {
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

    async fn del(&self, req: &Request) -> Result<(), CniError> {
        // A configuration that is not flock's (wrong type, bad mtu) is an error even for DEL.
        parse_conf(req)?;
        let key = attachment_key(req)?;
        let guard = self.lock_container(&req.container_id).await;
        self.del_locked(&key, &req.netns, guard, VethDeletion::AfterAnswer)
            .await
    }

    /// Tears down and releases one attachment by key, as a DEL would (used by the Kubernetes
    /// leak reconcile for pods gone from the node).
    /// Unlike a DEL, nobody waits on the answer, so the veth is gone when this returns.
    pub async fn release_attachment(&self, key: &AttachmentKey) -> Result<(), CniError> {
        let guard = self.lock_container(&key.container_id).await;
        self.del_locked(key, "", guard, VethDeletion::Before).await
    }

    /// The health of the agent's components.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Tears down and releases one attachment; `guard` is its container's lock.
    ///
    /// The pod's routes and anycast nexthops go synchronously, then its record and
    /// addresses. Deleting the veth itself (tens of milliseconds of kernel time) happens as
    /// `veth` says: for a DEL, after the answer, in a task that keeps the container locked
    /// until the veth is gone, so a new ADD of the same container cannot race it. A crash
    /// before that deletion leaves a veth without a record, which start-up removes.
    async fn del_locked(
        &self,
        key: &AttachmentKey,
        netns: &str,
        guard: ContainerGuard,
        veth: VethDeletion,
    ) -> Result<(), CniError> {
        let record = self.records.lock().expect("records lock").get(key).cloned();
        let Some(record) = record else {
            // Unknown attachment: nothing is allocated, but make sure no veth of it lingers
            // (an ADD that crashed before its record was readable, a DEL queued twice).
            let spec = PodSpec {
                container_id: key.container_id.clone(),
                netns: PathBuf::from(netns),
                if_name: key.if_name.clone(),
                mtu: 1500,
                addresses: Vec::new(),
                anycast: Vec::new(),
            };
            return flock_netns::teardown(&self.node_ns, &spec)
                .await
                .map_err(|e| plugin_err(codes::KERNEL, e.to_string()));
        };
        let spec = pod_spec(&record, (!netns.is_empty()).then_some(netns));
        flock_netns::detach(&self.node_ns, &spec)
            .await
            .map_err(|e| plugin_err(codes::KERNEL, e.to_string()))?;
        self.delete_record(key).await?;
        self.release(&record);
        let node_ns = self.node_ns.clone();
        let host_if = record.host_if.clone();
        let remove = async move {
            if let Err(e) = flock_netns::remove_host_iface(&node_ns, &host_if).await {
                warn!(iface = %host_if, error = %e,
                    "deleting a released pod's veth failed; start-up or GC will retry");
            }
            drop(guard);
        };
        match veth {
            VethDeletion::AfterAnswer => {
                tokio::spawn(remove);
            }
            VethDeletion::Before => remove.await,
        }
        self.refresh_metrics();
        // Always re-render: besides `addresses` and anycast, a pod left from a node CIDR that
        // has since changed is announced on its own, until it goes. The writer is debounced
        // and writes nothing when the bytes do not change.
        self.refresh_bird();
        Ok(())
    }

    async fn check(&self, req: &Request) -> Result<(), CniError> {
        let conf = parse_conf(req)?;
        if !conf.cni_version.has_check() {
            return Err(err(
                ErrorCode::IncompatibleCniVersion,
                format!(
                    "CHECK needs cniVersion 0.4.0 or later, not {}",
                    conf.cni_version
                ),
            ));
        }
        let key = attachment_key(req)?;
        let _guard = self.lock_container(&req.container_id).await;
        let record = self
            .records
            .lock()
            .expect("records lock")
            .get(&key)
            .cloned()
            .ok_or_else(|| {
                err(
                    ErrorCode::UnknownContainer,
                    format!(
                        "no allocation for container {} interface {}",
                        req.container_id, req.if_name
                    ),
                )
            })?;
        let netconf = NetConf::from_value(&req.config)?;
        if let Some(prev) = netconf.prev_result()? {
            let ours = cni_result(&record);
            let want: BTreeSet<String> = ours.ips.iter().map(|i| i.address.to_string()).collect();
            let got: BTreeSet<String> = prev.ips.iter().map(|i| i.address.to_string()).collect();
            if want != got {
                return Err(plugin_err(
                    codes::CHECK_MISMATCH,
                    format!(
                        "prevResult ips {:?} differ from the allocation {:?}",
                        got, want
                    ),
                ));
            }
        }
        let spec = pod_spec(
            &record,
            (!req.netns.is_empty()).then_some(req.netns.as_str()),
        );
        let mismatches = flock_netns::check(&self.node_ns, &spec)
            .await
            .map_err(|e| plugin_err(codes::KERNEL, e.to_string()))?;
        if mismatches.is_empty() {
            return Ok(());
        }
        let all: Vec<String> = mismatches.iter().map(|m| m.to_string()).collect();
        let msg = match all.len() {
            1 => all[0].clone(),
            n => format!("{} (and {} more)", all[0], n - 1),
        };
        Err(plugin_err(codes::CHECK_MISMATCH, msg).with_details(all.join("; ")))
    }

    /// STATUS (DESIGN §7): success when an ADD can be served. Otherwise 50, naming every
    /// reason (no NodeConfig, a default family's pool exhausted, the store unwritable); 51
    /// when, on top of that, BIRD is failing, so the routes of existing pods may not be
    /// announced either. BIRD failing alone does not stop ADDs: `/readyz` reports it.
    async fn status(&self, req: &Request) -> Result<(), CniError> {
        let _conf = parse_conf(req)?;
        let mut reasons = Vec::new();
        match self.settings() {
            None => reasons.push("no NodeConfig for this node".to_owned()),
            Some(settings) => {
                let stats = self.pools.lock().expect("pools lock").stats();
                if settings.default_ipv6 && stats.allocated6 as u128 >= stats.capacity6 {
                    reasons.push(format!(
                        "the node's IPv6 pool is exhausted ({} of {} in use)",
                        stats.allocated6, stats.capacity6
                    ));
                }
                if settings.default_ipv4 && stats.allocated4 as u64 >= stats.capacity4 {
                    reasons.push(format!(
                        "the node's IPv4 pool is exhausted ({} of {} in use)",
                        stats.allocated4, stats.capacity4
                    ));
                }
            }
        }
        let store = self.store.clone();
        let probe = tokio::task::spawn_blocking(move || store.probe_writable())
            .await
            .expect("store probe task");
        match probe {
            Ok(()) => self.health.set_problem("store", None),
            Err(e) => {
                self.health.set_problem("store", Some(e.to_string()));
                reasons.push(format!("the allocation store is not writable: {e}"));
            }
        }
        if reasons.is_empty() {
            return Ok(());
        }
        let (code, tail) = match self.health.problem("bird") {
            Some(bird) => (
                ErrorCode::PluginNotAvailableLimitedConnectivity,
                format!("; and BIRD is failing, so existing pods may not be announced: {bird}"),
            ),
            None => (ErrorCode::PluginNotAvailable, String::new()),
        };
        Err(err(
            code,
            format!("flock cannot serve ADD: {}{tail}", reasons.join("; ")),
        ))
    }

    async fn gc(&self, req: &Request) -> Result<(), CniError> {
        let conf = parse_conf(req)?;
        let netconf = NetConf::from_value(&req.config)?;
        let valid: BTreeSet<(String, String)> = netconf
            .gc_attachments()
            .ok_or_else(|| {
                err(
                    ErrorCode::InvalidNetworkConfig,
                    "GC needs cni.dev/valid-attachments (or cni.dev/attachments) in the config",
                )
            })?
            .iter()
            .map(|a| (a.container_id.clone(), a.ifname.clone()))
            .collect();
        let mut errors = Vec::new();
        let stale: Vec<AttachmentKey> = self
            .records
            .lock()
            .expect("records lock")
            .values()
            .filter(|r| r.network == conf.name)
            .filter(|r| !valid.contains(&(r.container_id.clone(), r.if_name.clone())))
            .map(AllocationRecord::key)
            .collect();
        for key in stale {
            let guard = self.lock_container(&key.container_id).await;
            if let Err(e) = self.del_locked(&key, "", guard, VethDeletion::Before).await {
                errors.push(format!("{} {}: {}", key.container_id, key.if_name, e.msg));
            }
        }
        self.remove_orphan_ifaces().await;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(plugin_err(
                codes::KERNEL,
                format!("GC failed for {} attachment(s)", errors.len()),
            )
            .with_details(errors.join("; ")))
        }
    }

    /// Runs every DEL the shim queued while the agent was unreachable; returns how many ran.
    pub async fn drain_del_queue(&self, dir: &Path) -> usize {
        let queue = flock_cni_proto::DelQueue::new(dir);
        let mut done = 0;
        let pending = match queue.pending() {
            Ok(p) => p,
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, "reading the DEL queue failed");
                return 0;
            }
        };
        for (path, request) in pending {
            match request {
                Ok(request) => {
                    let response = self.handle(request).await;
                    if let Some(e) = &response.error {
                        warn!(file = %path.display(), msg = %e.msg, "queued DEL failed; kept for the next drain");
                        continue;
                    }
                    done += 1;
                }
                Err(e) => {
                    warn!(file = %path.display(), error = %e, "unreadable queued DEL; removing it");
                }
            }
            if let Err(e) = queue.remove(&path) {
                warn!(file = %path.display(), error = %e, "removing a drained DEL failed");
            }
        }
        done
    }
}

type ContainerLocks = Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>;

/// When a release deletes the pod's host-side veth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VethDeletion {
    /// After the answer (a DEL: the runtime waits on it, the kernel work need not).
    AfterAnswer,
    /// Before returning (GC and the leak reconcile: what they report is already true).
    Before,
}

/// Holds one container's lock; owns what it needs, so it can move into a background task
/// (the veth deletion after a DEL keeps the container locked until the veth is gone).
struct ContainerGuard {
    locks: Arc<ContainerLocks>,
    container_id: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        self.guard.take();
        let mut locks = self.locks.lock().expect("container locks");
        // Only the map still holds the mutex: nobody waits for it, the entry can go.
        if locks
            .get(&self.container_id)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            locks.remove(&self.container_id);
        }
    }
}

/// The request's attachment, validated with the shim's own rules (`CNI_CONTAINERID`,
/// `CNI_IFNAME`): the key names store files, so nothing else may reach the store.
fn attachment_key(req: &Request) -> Result<AttachmentKey, CniError> {
    flock_cni_proto::env::validate_container_id(&req.container_id)?;
    flock_cni_proto::env::validate_if_name(&req.if_name)?;
    Ok(AttachmentKey {
        container_id: req.container_id.clone(),
        if_name: req.if_name.clone(),
    })
}

fn parse_conf(req: &Request) -> Result<FlockNetConf, CniError> {
    let netconf = NetConf::from_value(&req.config)?;
    FlockNetConf::from_netconf(&netconf)
}

fn node_defaults(settings: &NodeSettings) -> flock_ipam::NodeDefaults {
    flock_ipam::NodeDefaults {
        ipv6: settings.default_ipv6,
        ipv4: settings.default_ipv4,
        ip_algo: settings.ip_algo.clone(),
        has_cidr6: settings.cidr6.is_some(),
        has_cidr4: settings.cidr4.is_some(),
    }
}

fn ipam_error(e: flock_ipam::Error) -> CniError {
    let code = match &e {
        flock_ipam::Error::Exhausted { .. } => codes::POOL_EXHAUSTED,
        flock_ipam::Error::InUse { .. } => codes::ADDRESS_IN_USE,
        _ => codes::INVALID_ANNOTATION,
    };
    plugin_err(code, e.to_string())
}

/// The kernel layout of a record (DESIGN §5); `netns` overrides the recorded path.
fn pod_spec(record: &AllocationRecord, netns: Option<&str>) -> PodSpec {
    let mut addresses: Vec<IpNet> = Vec::new();
    addresses.extend(record.ipv6.map(|a| IpNet::from(IpAddr::V6(a))));
    addresses.extend(record.ipv4.map(|a| IpNet::from(IpAddr::V4(a))));
    addresses.extend(record.addresses.iter().map(|a| IpNet::from(*a)));
    PodSpec {
        container_id: record.container_id.clone(),
        netns: PathBuf::from(netns.unwrap_or(&record.netns)),
        if_name: record.if_name.clone(),
        mtu: record.mtu,
        addresses,
        anycast: record.anycast.clone(),
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
    if let Some(a) = record.ipv6 {
        ips.push(ip(IpAddr::V6(a), Some(gw6)));
        let any6 = IpPrefix::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 0).expect("::/0");
        routes.push(Route::via(any6, Some(gw6)));
    }
    if let Some(a) = record.ipv4 {
        ips.push(ip(IpAddr::V4(a), Some(gw4)));
        let any4 =
            IpPrefix::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0).expect("0.0.0.0/0");
        routes.push(Route::via(any4, Some(gw4)));
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

/// The kernel's boot ID: a different one at start-up means every recorded netns is gone.
pub fn read_boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn os_seed() -> [u8; 32] {
    use std::io::Read;
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .expect("read /dev/urandom for the allocation RNG seed");
    seed
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let v = cni_result(&record).to_value(flock_cni_proto::CniVersion::V1_1_0);
        insta::assert_json_snapshot!(v);
    }
}
