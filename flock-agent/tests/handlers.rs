//! The CNI handlers on the in-memory kernel, without root: the bugs each fix closed, and a
//! property test of random ADD / DEL / CHECK / GC / crash-and-restart sequences.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flock_agent::agent::{Agent, AgentParts};
use flock_agent::kernel::memory::{FaultOp, MemoryKernel};
use flock_agent::metrics::Component;
use flock_agent::store::{AllocationRecord, RecordState, Store};
use flock_cni_proto::ErrorCode;
use flock_k8s_api::{NodeConfig, NodeSettings};
use flock_rpc::rpc::{Op, PROTOCOL_VERSION, Request, Response};
use proptest::prelude::*;
use serde_json::{Value, json};

const BOOT: &str = "boot-1";

fn settings(cidr6: &str, cidr4: &str) -> NodeSettings {
    serde_json::from_value::<NodeConfig>(json!({
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "NodeConfig",
        "metadata": { "name": "node-a" },
        "spec": { "cidr6": cidr6, "cidr4": cidr4 }
    }))
    .expect("fixture")
    .settings()
    .expect("valid")
}

async fn start(kernel: &Arc<MemoryKernel>, dir: &Path, settings: NodeSettings) -> Arc<Agent> {
    let (agent, _) = Agent::start(AgentParts {
        settings: Some(settings),
        rng_seed: [7; 32],
        ..AgentParts::new(kernel.clone(), dir)
    })
    .await
    .expect("agent starts");
    agent
}

/// An agent on a fresh in-memory kernel and store, with a /64 and a /24.
async fn fresh() -> (Arc<MemoryKernel>, tempfile::TempDir, Arc<Agent>) {
    let kernel = Arc::new(MemoryKernel::new(BOOT));
    let dir = tempfile::tempdir().unwrap();
    let agent = start(
        &kernel,
        dir.path(),
        settings("2001:db8:7::/64", "10.77.0.0/24"),
    )
    .await;
    (kernel, dir, agent)
}

fn netns_of(cid: &str) -> PathBuf {
    PathBuf::from(format!("/run/netns/{cid}"))
}

fn request(op: Op, cid: &str, if_name: &str, config: Value) -> Request {
    Request {
        v: PROTOCOL_VERSION,
        op,
        container_id: cid.into(),
        netns: netns_of(cid).to_string_lossy().into_owned(),
        if_name: if_name.into(),
        args: format!("K8S_POD_NAMESPACE=shop;K8S_POD_NAME=pod-{cid}"),
        path: "/opt/cni/bin".into(),
        config,
    }
}

fn conf() -> Value {
    json!({ "cniVersion": "1.1.0", "name": "flock", "type": "flock" })
}

fn conf_with_annotations(annotations: Value) -> Value {
    json!({ "cniVersion": "1.1.0", "name": "flock", "type": "flock",
            "runtimeConfig": { "io.kubernetes.cri.pod-annotations": annotations } })
}

async fn add(agent: &Agent, kernel: &MemoryKernel, cid: &str, if_name: &str) -> Response {
    kernel.add_netns(netns_of(cid));
    agent.handle(request(Op::Add, cid, if_name, conf())).await
}

/// Waits until every DEL's background veth deletion is done (it waits for a pause in the
/// requests first): the kernel's veths are then exactly the records'.
async fn settled(agent: &Agent, kernel: &MemoryKernel) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if veths(kernel) == record_veths(agent) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!(
        "kernel veths {:?} never matched the records' {:?}",
        veths(kernel),
        record_veths(agent)
    );
}

fn veths(kernel: &MemoryKernel) -> BTreeSet<String> {
    kernel.state().veths.keys().cloned().collect()
}

fn record_veths(agent: &Agent) -> BTreeSet<String> {
    agent.records().iter().map(|r| r.host_if.clone()).collect()
}

#[tokio::test]
async fn an_add_waits_for_the_first_node_config_of_a_restarted_agent() {
    // Kubernetes mode starts without settings: the NodeConfig watch has not answered yet.
    let kernel = Arc::new(MemoryKernel::new(BOOT));
    let dir = tempfile::tempdir().unwrap();
    let (agent, _) = Agent::start(AgentParts {
        rng_seed: [7; 32],
        ..AgentParts::new(kernel.clone(), dir.path())
    })
    .await
    .expect("agent starts");
    let late = agent.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        late.set_settings(Some(settings("2001:db8:7::/64", "10.77.0.0/24")))
            .await;
    });
    let response = add(&agent, &kernel, "early", "eth0").await;
    assert!(response.error.is_none(), "{:?}", response.error);

    // Once the watch has said there is no NodeConfig, an ADD fails at once.
    agent.set_settings(None).await;
    let started = std::time::Instant::now();
    let response = add(&agent, &kernel, "none", "eth0").await;
    let error = response.error.expect("no NodeConfig");
    assert_eq!(error.code, ErrorCode::TryAgainLater);
    assert!(error.msg.contains("no NodeConfig"), "{}", error.msg);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "it did not wait for a NodeConfig the watch said is gone"
    );
}

#[tokio::test]
async fn two_attachments_of_one_container_keep_their_own_veths() {
    let (kernel, _dir, agent) = fresh().await;
    assert!(add(&agent, &kernel, "c1", "eth0").await.error.is_none());
    assert!(add(&agent, &kernel, "c1", "net1").await.error.is_none());
    assert_eq!(veths(&kernel).len(), 2, "one veth per attachment");
    // A DEL of an interface flock never set up for this container deletes nothing.
    let r = agent.handle(request(Op::Del, "c1", "net9", conf())).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    settled(&agent, &kernel).await;
    assert_eq!(veths(&kernel).len(), 2);
    let r = agent.handle(request(Op::Del, "c1", "net1", conf())).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    settled(&agent, &kernel).await;
    let left: Vec<AllocationRecord> = agent.records();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].if_name, "eth0");
    assert_eq!(veths(&kernel), BTreeSet::from([left[0].host_if.clone()]));
}

#[tokio::test]
async fn a_kernel_failure_reaches_the_runtime_with_its_errno() {
    let (kernel, _dir, agent) = fresh().await;
    kernel.fail_next(FaultOp::Setup, 1);
    let error = add(&agent, &kernel, "c1", "eth0")
        .await
        .error
        .expect("the kernel failed");
    assert_eq!(
        error.code,
        ErrorCode::Plugin(flock_agent::agent::codes::KERNEL)
    );
    assert_eq!(error.msg, "set up of container c1 interface eth0");
    assert!(
        error.details.contains("Input/output error (os error 5)"),
        "{}",
        error.details
    );
    // Nothing of the failed ADD is left, and the address is free again.
    assert!(agent.records().is_empty());
    assert!(veths(&kernel).is_empty());
    assert!(add(&agent, &kernel, "c1", "eth0").await.error.is_none());
}

#[tokio::test]
async fn status_does_not_count_addresses_outside_the_node_cidr_as_pool_usage() {
    let kernel = Arc::new(MemoryKernel::new(BOOT));
    let dir = tempfile::tempdir().unwrap();
    // A /29 of IPv4: 5 usable addresses (network, broadcast and the gateway-facing first
    // are not handed out).
    let agent = start(
        &kernel,
        dir.path(),
        settings("2001:db8:7::/64", "10.77.0.0/29"),
    )
    .await;
    let cap = 5;
    for i in 0..cap - 1 {
        let cid = format!("c{i}");
        kernel.add_netns(netns_of(&cid));
        let annotations = json!({ "flock.fritzlab.net/addresses": format!("10.99.0.{}", i + 1) });
        let r = agent
            .handle(request(
                Op::Add,
                &cid,
                "eth0",
                conf_with_annotations(annotations),
            ))
            .await;
        assert!(r.error.is_none(), "{:?}", r.error);
    }
    let mut status = request(Op::Status, "", "", conf());
    status.netns = String::new();
    let r = agent.handle(status).await;
    assert!(
        r.error.is_none(),
        "one address of the pool is still free: {:?}",
        r.error
    );
}

#[tokio::test]
async fn a_record_of_an_earlier_boot_is_released_and_its_address_reused() {
    let kernel = Arc::new(MemoryKernel::new(BOOT));
    let dir = tempfile::tempdir().unwrap();
    let s = settings("2001:db8:7::/64", "10.77.0.0/24");
    let agent = start(&kernel, dir.path(), s.clone()).await;
    assert!(add(&agent, &kernel, "c1", "eth0").await.error.is_none());
    drop(agent);
    kernel.reboot("boot-2");
    let agent = start(&kernel, dir.path(), s).await;
    assert!(agent.records().is_empty());
    assert!(Store::read(dir.path()).unwrap().is_empty());
}

#[tokio::test]
async fn a_kernel_problem_is_cleared_once_the_kernel_works_again() {
    let kernel = Arc::new(MemoryKernel::new(BOOT));
    let dir = tempfile::tempdir().unwrap();
    kernel.fail_next(FaultOp::Blackholes, 1);
    let s = settings("2001:db8:7::/64", "10.77.0.0/24");
    let agent = start(&kernel, dir.path(), s.clone()).await;
    let problem = agent
        .health()
        .problem(Component::Kernel)
        .expect("the blackholes failed");
    assert!(problem.contains("os error 5"), "{problem}");
    // The next NodeConfig event installs them, and /readyz is ready again.
    agent.set_settings(Some(s)).await;
    assert_eq!(agent.health().problem(Component::Kernel), None);
    assert_eq!(kernel.state().blackholes.len(), 2);
}

// ---- the property test ---------------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    Add(u8, bool),
    Del(u8, bool),
    Check(u8, bool),
    /// GC keeping the attachments whose bit is set (bit = container·2 + interface).
    Gc(u16),
    /// The agent stops (kill -9) and starts again on the same store and kernel.
    Restart,
    /// The agent stops in the middle of an ADD: the pending record is written and the kernel
    /// half-programmed, nothing committed.
    CrashMidAdd(u8, bool),
    /// The next kernel set-up fails.
    KernelFault,
    /// A pod's namespace disappears (its veths with it), then the agent restarts.
    NetnsGone(u8),
}

const CONTAINERS: u8 = 5;

fn step() -> impl Strategy<Value = Step> {
    let c = 0..CONTAINERS;
    prop_oneof![
        4 => (c.clone(), any::<bool>()).prop_map(|(c, i)| Step::Add(c, i)),
        3 => (c.clone(), any::<bool>()).prop_map(|(c, i)| Step::Del(c, i)),
        1 => (c.clone(), any::<bool>()).prop_map(|(c, i)| Step::Check(c, i)),
        1 => any::<u16>().prop_map(Step::Gc),
        1 => Just(Step::Restart),
        1 => (c.clone(), any::<bool>()).prop_map(|(c, i)| Step::CrashMidAdd(c, i)),
        1 => Just(Step::KernelFault),
        1 => c.prop_map(Step::NetnsGone),
    ]
}

fn names(c: u8, second: bool) -> (String, &'static str) {
    (format!("c{c}"), if second { "net1" } else { "eth0" })
}

/// What the runtime believes: attachment → the addresses its ADD returned.
type Model = BTreeMap<(String, String), Vec<IpAddr>>;

fn result_ips(result: &Value) -> Vec<IpAddr> {
    result["ips"]
        .as_array()
        .expect("ips")
        .iter()
        .map(|ip| {
            let text = ip["address"].as_str().expect("address");
            text.split('/').next().unwrap().parse().expect("an address")
        })
        .collect()
}

fn record_ips(r: &AllocationRecord) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = Vec::new();
    v.extend(r.ipv6.map(IpAddr::V6));
    v.extend(r.ipv4.map(IpAddr::V4));
    v
}

async fn invariants(agent: &Agent, kernel: &MemoryKernel, model: &Model) {
    settled(agent, kernel).await;
    let records = agent.records();
    // No address on two live attachments.
    let mut seen = BTreeSet::new();
    for r in &records {
        for a in r.pooled_addresses() {
            assert!(
                seen.insert(a),
                "{a} is held by two attachments: {records:#?}"
            );
        }
        assert_eq!(r.state, RecordState::Committed);
    }
    // The agent's attachments are exactly the model's, with the addresses ADD returned.
    let live: Model = records
        .iter()
        .map(|r| ((r.container_id.clone(), r.if_name.clone()), record_ips(r)))
        .collect();
    assert_eq!(
        &live, model,
        "agent state differs from what the runtime was told"
    );
    // The kernel carries exactly the live attachments: no leaked veth, no stray route.
    let routed: BTreeSet<IpAddr> = kernel
        .state()
        .host_routes
        .keys()
        .map(|n| n.addr())
        .collect();
    let held: BTreeSet<IpAddr> = model.values().flatten().copied().collect();
    assert_eq!(routed, held, "host routes differ from the live addresses");
}

async fn run_steps(steps: Vec<Step>) {
    let kernel = Arc::new(MemoryKernel::new(BOOT));
    let dir = tempfile::tempdir().unwrap();
    // A small IPv4 pool, so addresses are reused often.
    let s = settings("2001:db8:7::/120", "10.77.0.0/28");
    let mut agent = start(&kernel, dir.path(), s.clone()).await;
    let mut model = Model::new();
    let mut fault_armed = false;
    for step in steps {
        match step {
            Step::Add(c, i) => {
                let (cid, ifn) = names(c, i);
                let r = add(&agent, &kernel, &cid, ifn).await;
                match (&r.result, &r.error) {
                    (Some(result), None) => {
                        let ips = result_ips(result);
                        if let Some(before) = model.get(&(cid.clone(), ifn.to_owned())) {
                            assert_eq!(before, &ips, "a repeated ADD changed the result");
                        }
                        model.insert((cid, ifn.to_owned()), ips);
                    }
                    (_, Some(e)) if fault_armed => {
                        assert_eq!(
                            e.code,
                            ErrorCode::Plugin(flock_agent::agent::codes::KERNEL),
                            "{e:?}"
                        );
                        fault_armed = false;
                    }
                    (_, Some(e)) => {
                        // Otherwise only a full pool may refuse an ADD here.
                        assert_eq!(
                            e.code,
                            ErrorCode::Plugin(flock_agent::agent::codes::POOL_EXHAUSTED),
                            "{e:?}"
                        );
                    }
                    _ => panic!("ADD answered neither result nor error"),
                }
            }
            Step::Del(c, i) => {
                let (cid, ifn) = names(c, i);
                let r = agent.handle(request(Op::Del, &cid, ifn, conf())).await;
                assert!(r.error.is_none(), "DEL is idempotent: {:?}", r.error);
                model.remove(&(cid, ifn.to_owned()));
            }
            Step::Check(c, i) => {
                let (cid, ifn) = names(c, i);
                let r = agent.handle(request(Op::Check, &cid, ifn, conf())).await;
                if model.contains_key(&(cid, ifn.to_owned())) {
                    assert!(
                        r.error.is_none(),
                        "CHECK of a live attachment: {:?}",
                        r.error
                    );
                } else {
                    assert_eq!(r.error.map(|e| e.code), Some(ErrorCode::UnknownContainer));
                }
            }
            Step::Gc(mask) => {
                let valid: Vec<Value> = (0..CONTAINERS)
                    .flat_map(|c| [(c, false), (c, true)])
                    .filter(|(c, i)| mask & (1 << (*c * 2 + u8::from(*i))) != 0)
                    .map(|(c, i)| {
                        let (cid, ifn) = names(c, i);
                        json!({ "containerID": cid, "ifname": ifn })
                    })
                    .collect();
                let mut config = conf();
                config["cni.dev/valid-attachments"] = Value::Array(valid);
                let mut r = request(Op::Gc, "", "", config);
                r.netns = String::new();
                let r = agent.handle(r).await;
                assert!(r.error.is_none(), "GC: {:?}", r.error);
                model.retain(|(cid, ifn), _| {
                    let c: u8 = cid[1..].parse().unwrap();
                    mask & (1 << (c * 2 + u8::from(ifn == "net1"))) != 0
                });
            }
            Step::Restart => {
                drop(agent);
                agent = start(&kernel, dir.path(), s.clone()).await;
            }
            Step::CrashMidAdd(c, i) => {
                let (cid, ifn) = names(c, i);
                if model.contains_key(&(cid.clone(), ifn.to_owned())) {
                    continue;
                }
                drop(agent);
                // What a crashed ADD leaves: a pending record and a half-built pod, on an
                // address no live attachment holds.
                let held: BTreeSet<IpAddr> = model.values().flatten().copied().collect();
                let free6 = (0xf0..=0xfeu16)
                    .map(|n| std::net::Ipv6Addr::new(0x2001, 0xdb8, 7, 0, 0, 0, 0, n))
                    .find(|a| !held.contains(&IpAddr::V6(*a)))
                    .expect("a free address");
                let (store, _) = Store::open(dir.path(), BOOT).unwrap();
                let pending = AllocationRecord {
                    format: flock_agent::store::STORE_FORMAT,
                    state: RecordState::Pending,
                    network: "flock".into(),
                    container_id: cid.clone(),
                    if_name: ifn.into(),
                    netns: netns_of(&cid).to_string_lossy().into_owned(),
                    boot_id: BOOT.into(),
                    pod: None,
                    ipv6: Some(free6),
                    ipv4: None,
                    addresses: vec![],
                    anycast: vec![],
                    mtu: 1500,
                    host_if: flock_netns::host_ifname(&cid, ifn, 0),
                    host_mac: String::new(),
                    pod_mac: String::new(),
                    flock_network: None,
                    default_route: true,
                    routes: Vec::new(),
                };
                store.put(&pending).unwrap();
                kernel.add_netns(netns_of(&cid));
                use flock_agent::kernel::Kernel;
                let spec = flock_agent::agent::pod_spec(&pending, None);
                kernel.fail_next(FaultOp::Setup, 0);
                fault_armed = false;
                kernel.setup(&spec).await.unwrap();
                agent = start(&kernel, dir.path(), s.clone()).await;
            }
            Step::KernelFault => {
                kernel.fail_next(FaultOp::Setup, 1);
                fault_armed = true;
            }
            Step::NetnsGone(c) => {
                let cid = format!("c{c}");
                kernel.remove_netns(&netns_of(&cid));
                model.retain(|(m, _), _| *m != cid);
                drop(agent);
                agent = start(&kernel, dir.path(), s.clone()).await;
            }
        }
        invariants(&agent, &kernel, &model).await;
    }
    // Every committed attachment survives a restart, with its addresses.
    drop(agent);
    let agent = start(&kernel, dir.path(), s).await;
    invariants(&agent, &kernel, &model).await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_invariant(steps in proptest::collection::vec(step(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run_steps(steps));
    }
}
