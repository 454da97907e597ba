//! What the agent's own bookkeeping costs a pod: ADDs and DELs through `Agent::handle` on
//! the in-memory kernel, so everything but the kernel's work and the hand-off from the shim
//! (which the hand-off floor of `cargo xtask bench` pays too): the request's configuration
//! and arguments, the lock, the allocation, the store's writes (on `$TMPDIR`), the result,
//! the metrics. It is the part of an ADD by which flock's agent exceeds the floor (issue 29).
//!
//! Pods come in batches of [`BATCH`] ADDs, then their DELs, as a burst of pods and its
//! teardown; `add` times the ADDs of each batch (its DELs untimed), `del` the DELs. The node
//! has the bench's pools: a /64 and a /16.
//!
//! `cargo bench -p flock-agent --bench handle`

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use flock_agent::agent::{Agent, AgentParts};
use flock_agent::kernel::Kernel;
use flock_agent::kernel::memory::MemoryKernel;
use flock_rpc::rpc::{Op, PROTOCOL_VERSION, Request};
use serde_json::json;

#[path = "../tests/policy_support/mod.rs"]
mod policy_support;

/// Pods added before their DELs.
const BATCH: u64 = 100;

/// How long a batch's deferred veth deletions may take before the bench fails.
const DELETIONS_LIMIT: Duration = Duration::from_secs(10);

struct Bench {
    rt: tokio::runtime::Runtime,
    kernel: Arc<MemoryKernel>,
    agent: Arc<Agent>,
    _dir: tempfile::TempDir,
    next: u64,
}

impl Bench {
    fn new() -> Bench {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let kernel = Arc::new(MemoryKernel::new("boot-bench"));
        let dir = tempfile::tempdir().expect("state directory");
        let settings = policy_support::node_settings("bench", "2001:db8:98::/64", "10.98.0.0/16");
        let (agent, _) = rt
            .block_on(Agent::start(AgentParts {
                settings: Some(settings),
                ..AgentParts::new(kernel.clone(), dir.path())
            }))
            .expect("the agent starts");
        Bench {
            rt,
            kernel,
            agent,
            _dir: dir,
            next: 0,
        }
    }

    /// `pods` ADDs and their DELs, in batches; the time of the calls of `timed`.
    fn run(&mut self, pods: u64, timed: Op) -> Duration {
        let mut spent = Duration::ZERO;
        let mut left = pods;
        while left > 0 {
            let n = left.min(BATCH);
            left -= n;
            let first = self.next;
            self.next += n;
            let ids: Vec<String> = (first..first + n).map(|i| format!("bench{i:08}")).collect();
            for id in &ids {
                self.kernel.add_netns(netns(id));
            }
            for op in [Op::Add, Op::Del] {
                let t = Instant::now();
                self.rt.block_on(async {
                    for id in &ids {
                        let response = self.agent.handle(request(op, id)).await;
                        assert!(
                            response.error.is_none(),
                            "{op:?} {id}: {:?}",
                            response.error
                        );
                    }
                });
                if op == timed {
                    spent += t.elapsed();
                }
            }
            // the DELs' deferred veth deletions, before the next batch, and the namespaces gone
            // as a runtime removes them
            self.rt.block_on(async {
                let deadline = Instant::now() + DELETIONS_LIMIT;
                loop {
                    let left = self.kernel.host_ifaces().await.expect("the veths");
                    if left.is_empty() {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "veths {left:?} not deleted within {DELETIONS_LIMIT:?} of their DELs"
                    );
                    tokio::time::sleep(Duration::from_micros(100)).await;
                }
            });
            for id in &ids {
                self.kernel.remove_netns(&netns(id));
            }
        }
        spent
    }
}

fn netns(id: &str) -> PathBuf {
    PathBuf::from(format!("/run/netns/{id}"))
}

fn request(op: Op, id: &str) -> Request {
    Request {
        v: PROTOCOL_VERSION,
        op,
        container_id: id.to_owned(),
        netns: netns(id).to_string_lossy().into_owned(),
        if_name: "eth0".into(),
        args: format!("K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{id}"),
        path: "/opt/cni/bin".into(),
        config: json!({ "cniVersion": "1.1.0", "name": "bench-flock", "type": "flock" }),
    }
}

fn handle(c: &mut Criterion) {
    let mut group = c.benchmark_group("agent_bookkeeping");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(10));
    for (name, timed) in [("add", Op::Add), ("del", Op::Del)] {
        let mut bench = Bench::new();
        group.bench_function(name, |b| b.iter_custom(|pods| bench.run(pods, timed)));
    }
    group.finish();
}

criterion_group!(benches, handle);
criterion_main!(benches);
