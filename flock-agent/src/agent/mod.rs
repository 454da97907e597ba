//! The agent's core: node state and the CNI handlers of DESIGN §7, one module per verb
//! ([`add`], [`del`], [`check`], [`status`], [`gc`]) and one for [`startup`].
//!
//! Each module separates what it decides — a pure function over plain data, tested without
//! root — from doing it through the [`Kernel`](crate::kernel::Kernel) trait and the store.
//!
//! Ordering rules that make it crash-safe:
//! - ADD persists a **pending** record before the kernel is touched and a **committed** one
//!   after; start-up undoes pending records and keeps committed ones.
//! - GC and start-up list the kernel's `flock*` interfaces *before* reading the records, so an
//!   interface seen without a record really has none (a record is always written before its
//!   interface exists).
//! - Requests for one container are serialised; different containers run in parallel.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use flock_cni_proto::{CniError, NetConf};
use flock_rpc::FlockNetConf;
use flock_rpc::rpc::{Op, Request, Response};
use ipnet::IpNet;
use rand_chacha::ChaCha12Rng;
use rand_core::SeedableRng;
use serde_json::Value;
use tracing::{Instrument, debug, info, warn};

use crate::kernel::Kernel;
use crate::metrics::{Component, Health, Metrics};
use crate::pods::PodDirectory;
use crate::policy::PolicyEnforcer;
use crate::routing::bird::BirdHandle;
use crate::routing::services::guard::ServiceGuard;
use crate::store::{AllocationRecord, AttachmentKey, Store};
use crate::trace::{Phases, RequestTag, Tracer};
use flock_k8s_api::NodeSettings;

pub mod add;
pub mod check;
pub mod del;
pub mod error;
pub mod gc;
mod locks;
mod lull;
pub mod policy;
pub mod result;
pub mod startup;
pub mod state;
pub mod status;

pub use error::{HandlerError, codes};
pub use result::{cni_result, pod_spec};
pub use startup::StartupReport;

use locks::{ContainerGuard, ContainerLocks};
use state::NodeState;

/// How long ADD waits for the pod watcher to see a pod it has not seen yet.
pub const DEFAULT_POD_WAIT: Duration = Duration::from_secs(10);

/// The agent: state shared by every request.
pub struct Agent {
    kernel: Arc<dyn Kernel>,
    store: Arc<Store>,
    boot_id: String,
    settings: RwLock<Option<Arc<NodeSettings>>>,
    /// Whether the agent has heard whether its node has a NodeConfig (false in Kubernetes mode
    /// until the NodeConfig watch first answers).
    settings_known: tokio::sync::watch::Sender<bool>,
    state: Arc<Mutex<NodeState>>,
    locks: Arc<ContainerLocks>,
    rng: Mutex<ChaCha12Rng>,
    bird: RwLock<Option<BirdHandle>>,
    services: RwLock<Option<Arc<crate::routing::services::ServiceState>>>,
    service_guard: RwLock<Option<ServiceGuard>>,
    pods: Option<Arc<dyn PodDirectory>>,
    pod_wait: Duration,
    policy: Option<Arc<PolicyEnforcer>>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    failpoint: Option<String>,
    tracer: Option<Tracer>,
    /// The uplink's MTU and when it was read ([`Agent::uplink_mtu`]).
    uplink_mtu: Mutex<Option<(Instant, u32)>>,
    /// When requests pause, for the veth deletions after DELs (`lull`).
    lull: Arc<lull::Lull>,
}

/// What [`Agent::start`] needs. The caller (`main`) reads the environment; the agent does not.
pub struct AgentParts {
    /// The kernel: [`NetnsKernel`](crate::kernel::NetnsKernel) in production.
    pub kernel: Arc<dyn Kernel>,
    /// The state directory.
    pub state_dir: std::path::PathBuf,
    /// The node's settings, when known at start (standalone) — Kubernetes mode sets them later.
    pub settings: Option<NodeSettings>,
    /// The pod watcher (Kubernetes mode).
    pub pods: Option<Arc<dyn PodDirectory>>,
    /// How long ADD waits for the pod watcher (and for its pod's NetworkPolicy rules).
    pub pod_wait: Duration,
    /// NetworkPolicy enforcement (Kubernetes mode): ADD returns once its pod's rules are in
    /// place, DEL drops them.
    pub policy: Option<Arc<PolicyEnforcer>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Health.
    pub health: Arc<Health>,
    /// Seed of the allocation RNG (random host bits).
    pub rng_seed: [u8; 32],
    /// Test hook: abort the process at this point of an ADD (`after-pending`,
    /// `after-kernel`, `after-commit`) or a DEL (`del-after-detach`, `del-after-delete`).
    pub failpoint: Option<String>,
    /// Where each request's phases are written (`--trace`), if anywhere.
    pub tracer: Option<Tracer>,
}

impl AgentParts {
    /// Parts with no settings, no pod watcher, fresh metrics and health, and a seed from
    /// the OS.
    pub fn new(kernel: Arc<dyn Kernel>, state_dir: impl Into<std::path::PathBuf>) -> AgentParts {
        AgentParts {
            kernel,
            state_dir: state_dir.into(),
            settings: None,
            pods: None,
            pod_wait: DEFAULT_POD_WAIT,
            policy: None,
            metrics: Arc::new(Metrics::new()),
            health: Arc::new(Health::default()),
            rng_seed: os_seed(),
            failpoint: None,
            tracer: None,
        }
    }
}

/// A seed for the allocation RNG from the OS.
pub fn os_seed() -> [u8; 32] {
    use std::io::Read;
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .expect("read /dev/urandom for the allocation RNG seed");
    seed
}

type Outcome<T = ()> = Result<T, HandlerError>;

impl Agent {
    /// Opens the store and runs the start-up reconcile of DESIGN §7 (see [`startup`]).
    pub async fn start(parts: AgentParts) -> crate::Result<(Arc<Agent>, StartupReport)> {
        let boot_id = parts.kernel.boot_id();
        let (store, records) = {
            let dir = parts.state_dir.clone();
            let boot_id = boot_id.clone();
            tokio::task::spawn_blocking(move || Store::open(&dir, &boot_id))
                .await
                .expect("store open task")?
        };
        let refused = |e: flock_ipam::Error| {
            crate::Error::from(flock_k8s_api::Error::InvalidNodeConfig {
                field: "spec".into(),
                value: String::new(),
                reason: e.to_string(),
            })
        };
        let pools = flock_ipam::Pools::new(
            parts.settings.as_ref().and_then(|s| s.cidr6),
            parts.settings.as_ref().and_then(|s| s.cidr4),
        )
        .map_err(refused)?;
        let mut state = NodeState::new(pools);
        state
            .set_networks(parts.settings.as_ref().map_or(&[][..], |s| &s.networks))
            .map_err(refused)?;
        let agent = Arc::new(Agent {
            boot_id,
            kernel: parts.kernel,
            store: Arc::new(store),
            settings_known: tokio::sync::watch::Sender::new(parts.settings.is_some()),
            settings: RwLock::new(parts.settings.map(Arc::new)),
            state: Arc::new(Mutex::new(state)),
            locks: Arc::default(),
            rng: Mutex::new(ChaCha12Rng::from_seed(parts.rng_seed)),
            bird: RwLock::new(None),
            services: RwLock::new(None),
            service_guard: RwLock::new(None),
            pods: parts.pods,
            pod_wait: parts.pod_wait,
            policy: parts.policy,
            metrics: parts.metrics,
            health: parts.health,
            failpoint: parts.failpoint.filter(|f| !f.is_empty()),
            tracer: parts.tracer,
            uplink_mtu: Mutex::new(None),
            lull: Arc::default(),
        });
        let report = agent.reconcile_at_start(records).await?;
        agent.restore_policy_pods();
        agent.stock_store();
        Ok((agent, report))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.state.lock().expect("node state lock")
    }

    /// Installs the blackhole routes of the node CIDRs (idempotent); clears the kernel problem
    /// once they are in place.
    pub async fn install_blackholes(&self) {
        let cidrs = self.node_cidrs();
        if cidrs.is_empty() {
            self.health.set_problem(Component::Kernel, None);
            return;
        }
        match self.kernel.ensure_blackholes(&cidrs).await {
            Ok(()) => self.health.set_problem(Component::Kernel, None),
            Err(e) => {
                let chain = error::cause_chain(&e);
                warn!(error = %chain, "installing the node CIDR blackholes failed");
                self.health.set_problem(
                    Component::Kernel,
                    Some(format!("node CIDR blackholes: {chain}")),
                );
            }
        }
    }

    /// The node's CIDRs of every network (cluster and secondary): each gets a blackhole.
    fn node_cidrs(&self) -> Vec<IpNet> {
        let mut v = Vec::new();
        if let Some(s) = self.settings().as_deref() {
            v.extend(s.cluster_cidrs());
            v.extend(s.networks.iter().flat_map(|n| n.cidrs()));
        }
        v
    }

    /// Sets every anycast route to exactly the local pods that carry the address.
    async fn sync_anycast_routes(&self) {
        let members = self.state().anycast_members();
        for (addr, m) in members {
            if let Err(e) = self.kernel.sync_anycast(addr, &m).await {
                warn!(%addr, error = %error::cause_chain(&e), "anycast route sync failed");
            }
        }
    }

    /// Replaces the node's settings (a NodeConfig event). Live allocations stay reserved even
    /// when a CIDR changes under them.
    pub async fn set_settings(&self, settings: Option<NodeSettings>) {
        let changed = {
            let mut state = self.state();
            state
                .set_node_cidrs(
                    settings.as_ref().and_then(|s| s.cidr6),
                    settings.as_ref().and_then(|s| s.cidr4),
                )
                .and_then(|()| {
                    state.set_networks(settings.as_ref().map_or(&[][..], |s| &s.networks))
                })
        };
        if let Err(e) = changed {
            // NodeSettings were validated with the same rules: this cannot happen, but if
            // it did, the old pools stay in force.
            warn!(error = %e, "new node CIDRs refused by the pools; keeping the old ones");
            return;
        }
        match &settings {
            None => self.health.set_problem(
                Component::NodeConfig,
                Some("no NodeConfig for this node: new pods cannot be served".into()),
            ),
            Some(_) => self.health.set_problem(Component::NodeConfig, None),
        }
        let before = self.node_cidrs();
        *self.settings.write().expect("settings lock") = settings.map(Arc::new);
        self.settings_known.send_replace(true);
        self.guard_service_ranges();
        let after = self.node_cidrs();
        // A CIDR the node no longer owns loses its blackhole (it is no longer announced
        // either); live pods in it keep working through their own /128 and /32 routes.
        for old in before.into_iter().filter(|c| !after.contains(c)) {
            if let Err(e) = self.kernel.remove_blackhole(old).await {
                warn!(cidr = %old, error = %error::cause_chain(&e),
                    "removing an old node CIDR's blackhole failed");
            }
        }
        self.install_blackholes().await;
        self.refresh_metrics();
        self.refresh_bird();
    }

    /// The node's settings for an ADD. An agent that has not yet heard whether its node has
    /// a NodeConfig — one just restarted, serving before its NodeConfig watch has answered —
    /// waits for that answer up to the pod wait, rather than failing a pod for a moment's lag.
    pub(super) async fn settings_for_add(&self) -> Option<Arc<NodeSettings>> {
        if self.settings().is_none() && !*self.settings_known.borrow() {
            let mut known = self.settings_known.subscribe();
            let _ = tokio::time::timeout(self.pod_wait, known.wait_for(|k| *k)).await;
        }
        self.settings()
    }

    /// The node's current settings.
    pub fn settings(&self) -> Option<Arc<NodeSettings>> {
        self.settings.read().expect("settings lock").clone()
    }

    /// Connects the BIRD writer.
    pub fn set_bird(&self, handle: BirdHandle) {
        *self.bird.write().expect("bird lock") = Some(handle);
    }

    /// Connects the Service state (Kubernetes mode): its routes join BIRD's configuration,
    /// and `guard` keeps the Service ranges the node announces ending at the node.
    pub fn set_services(
        &self,
        state: Arc<crate::routing::services::ServiceState>,
        guard: ServiceGuard,
    ) {
        *self.services.write().expect("services lock") = Some(state);
        *self.service_guard.write().expect("service guard lock") = Some(guard);
        self.guard_service_ranges();
        self.refresh_bird();
    }

    /// Gives the Service guard the cluster-IP ranges BIRD announces: the NodeConfig's
    /// `clusterIPCIDRs` when the node has BGP, else none.
    fn guard_service_ranges(&self) {
        let guard = self.service_guard.read().expect("service guard lock");
        let Some(guard) = guard.as_ref() else {
            return;
        };
        // Not before the NodeConfig watch has answered: a restarted agent keeps the table
        // it left until then.
        if !*self.settings_known.borrow() {
            return;
        }
        let ranges = self
            .settings()
            .filter(|s| s.bgp.is_some())
            .map(|s| s.services.cluster_ips.clone())
            .unwrap_or_default();
        guard.set(ranges);
    }

    /// Services or their endpoints changed: re-render BIRD soon.
    pub fn announcements_changed(&self) {
        self.refresh_bird();
    }

    fn refresh_bird(&self) {
        if let Some(b) = self.bird.read().expect("bird lock").as_ref() {
            b.refresh();
        }
    }

    /// A snapshot of every committed allocation.
    pub fn records(&self) -> Vec<AllocationRecord> {
        self.state().records().cloned().collect()
    }

    /// The NetworkPolicy enforcer, when enforcement is on.
    pub fn policy(&self) -> Option<&Arc<PolicyEnforcer>> {
        self.policy.as_ref()
    }

    /// The health of the agent's components.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// The agent's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The BIRD configuration of this node ([`crate::routing::announce::bird_model`]), rendered. `Ok(None)`
    /// without BGP settings.
    pub fn render_bird(&self) -> Result<Option<String>, crate::routing::BirdError> {
        let Some(settings) = self.settings() else {
            return Ok(None);
        };
        let model = crate::routing::announce::bird_model(&settings, self.state().records());
        match model {
            None => Ok(None),
            Some(mut model) => {
                let services = self.services.read().expect("services lock").clone();
                if let Some(state) = services {
                    let announcement = state.announcement(&settings.node, &settings.services);
                    model.services.extend(announcement.routes);
                }
                let valid = model
                    .validate()
                    .map_err(|e| crate::routing::BirdError::Model(Box::new(e)))?;
                Ok(Some(flock_bird::render(&valid)))
            }
        }
    }

    fn refresh_metrics(&self) {
        let stats = self.state().pools().stats();
        self.metrics
            .set_family("ipv6", stats.allocated6 as u64, stats.capacity6);
        self.metrics
            .set_family("ipv4", stats.allocated4 as u64, u128::from(stats.capacity4));
    }

    async fn lock_container(&self, container_id: &str) -> ContainerGuard {
        ContainerGuard::lock(&self.locks, container_id).await
    }

    /// Handles one RPC request and returns its response.
    pub async fn handle(&self, request: Request) -> Response {
        self.handle_with(request, &mut Phases::start()).await.0
    }

    /// Handles one RPC request, marking its phases; returns the response and what a trace
    /// line says of the request.
    pub async fn handle_with(
        &self,
        request: Request,
        phases: &mut Phases,
    ) -> (Response, RequestTag) {
        self.handle_as(request, phases, del::VethDeletion::AfterAnswer)
            .await
    }

    /// [`Agent::handle_with`], a DEL deleting its veth as `veth` says.
    async fn handle_as(
        &self,
        request: Request,
        phases: &mut Phases,
        veth: del::VethDeletion,
    ) -> (Response, RequestTag) {
        let started = Instant::now();
        self.lull.request();
        let op = request.op;
        // Entered around each poll, not held across the awaits: requests interleave on the
        // agent's one thread, and a guard held over an await would name this request in the
        // log lines of whichever ran meanwhile.
        let span =
            tracing::info_span!("cni", op = op.as_str(), container_id = %request.container_id);
        let outcome: Outcome<Option<Value>> = async {
            match op {
                Op::Add => self.add(&request, phases).await.map(Some),
                Op::Del => self.del(&request, phases, veth).await.map(|()| None),
                Op::Check => self.check(&request).await.map(|()| None),
                Op::Status => self.status(&request).await.map(|()| None),
                Op::Gc => self.gc(&request).await.map(|()| None),
            }
        }
        .instrument(span.clone())
        .await;
        if !matches!(op, Op::Add | Op::Del) {
            phases.mark("handle");
        }
        let outcome = outcome.map_err(|e| e.to_cni());
        let label = match &outcome {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.code.as_u32().to_string(),
        };
        self.metrics
            .observe_request(op.as_str(), &label, started.elapsed());
        let tag = RequestTag {
            op: op.as_str().to_owned(),
            container_id: request.container_id,
            if_name: request.if_name,
            outcome: label,
        };
        let response = match outcome {
            Ok(None) => Response::done(),
            Ok(Some(v)) => Response::ok(v),
            Err(e) => {
                span.in_scope(|| {
                    info!(code = e.code.as_u32(), msg = %e.msg, details = %e.details, "request failed")
                });
                Response::error(e)
            }
        };
        (response, tag)
    }

    /// A request begins, for the trace (when tracing): record its line with
    /// [`Traced::record`](crate::trace::Traced::record) once it is answered.
    pub fn trace_begin(&self) -> Option<crate::trace::Traced<'_>> {
        self.tracer.as_ref().map(Tracer::begin)
    }

    fn fail_at(&self, point: &str) {
        if self.failpoint.as_deref() == Some(point) {
            eprintln!("flock-agent: failpoint {point}: exiting");
            std::process::abort();
        }
    }

    async fn put_record(&self, record: &AllocationRecord) -> Outcome {
        let started = Instant::now();
        // Inline: an atomic write without fsync is a few syscalls on the page cache, cheaper
        // than handing it to a blocking thread (see `store`).
        let outcome = self.store.put(record);
        self.metrics
            .store_write_seconds
            .observe(started.elapsed().as_secs_f64());
        self.stock_store();
        match outcome {
            Ok(()) => {
                self.health.set_problem(Component::Store, None);
                Ok(())
            }
            Err(e) => {
                self.health
                    .set_problem(Component::Store, Some(error::cause_chain(&e)));
                Err(HandlerError::Store(e))
            }
        }
    }

    /// Tops up the store's blank pages (or spare files) on a blocking thread when they run
    /// low, so that no ADD extends or creates a file on its path (see `store`). A failure only
    /// costs later writes the page or file they then add.
    fn stock_store(&self) {
        if !self.store.claim_stock() {
            return;
        }
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || match store.stock() {
            Ok(added) => debug!(added, "stocked the store's blank pages or spare files"),
            Err(e) => {
                warn!(error = %error::cause_chain(&e), "could not stock the store")
            }
        });
    }

    /// Moves the records of the store's slots file into files of their own, for an agent
    /// that stops (see `store`): an earlier agent, after a rollback, reads them. A failure
    /// leaves them in the slots file, which an earlier agent refuses to open (it names the
    /// store's format) rather than start without them.
    pub async fn retire_store(&self) {
        let store = Arc::clone(&self.store);
        match tokio::task::spawn_blocking(move || store.retire_slots()).await {
            Ok(Ok(moved)) => info!(moved, "the store's records are in files of their own"),
            Ok(Err(e)) => warn!(error = %error::cause_chain(&e),
                "could not move the store's records out of its slots file: an earlier agent \
                 will refuse to open the store"),
            Err(e) => warn!(error = %e, "the task retiring the store's slots file failed"),
        }
    }

    /// Deletes a record from the store (not from the node state).
    async fn delete_stored(&self, key: &AttachmentKey) -> Outcome {
        self.store.delete(key).map_err(HandlerError::Store)
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
