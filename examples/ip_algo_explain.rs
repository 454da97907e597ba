//! Shows where an ip-algo spec puts each field in a CIDR, and the address a
//! sample pod would get.
//!
//! ```text
//! cargo run -p flock-examples --example ip_algo_explain -- [SPEC] [CIDR] [NAMESPACE] [WORKLOAD] [POD]
//! cargo run -p flock-examples --example ip_algo_explain -- workload 2001:db8:0:1::/64 shop checkout checkout-7d4b9c-x2x1q
//! ```

use std::process::ExitCode;

use flock_embed::{Identity, IpAlgo, workload_name};
use flock_ipam::{AlgoSource, NodeDefaults, PodRequest, Pools, Want};
use ipnet::Ipv6Net;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.to_owned());
    let spec = arg(0, "ns:16,app:24,n:8");
    let cidr = arg(1, "2001:db8:0:1::/64");
    let namespace = arg(2, "shop");
    let deployment = arg(3, "checkout");
    let pod_name = arg(4, "checkout-7d4b9c-x2x1q");
    match run(&spec, &cidr, &namespace, &deployment, &pod_name) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    spec: &str,
    cidr: &str,
    namespace: &str,
    deployment: &str,
    pod_name: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let algo: IpAlgo = spec.parse()?;
    let cidr: Ipv6Net = cidr.parse().map_err(|e| format!("CIDR {cidr:?}: {e}"))?;
    print!("{}", algo.explain(cidr.prefix_len())?);

    // a Deployment's pod: owned by the ReplicaSet <deployment>-<hash>
    let hash = pod_name
        .strip_prefix(deployment)
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|rest| rest.split('-').next())
        .unwrap_or("");
    let replica_set = format!("{deployment}-{hash}");
    let workload = workload_name(Some(("ReplicaSet", &replica_set)), Some(hash), pod_name);
    let mut pools = Pools::new(Some(cidr), None)?;
    let request = PodRequest {
        ipv4: Want::No,
        ip_algo: algo,
        ip_algo_source: AlgoSource::Pod,
        ..PodRequest::defaults(&NodeDefaults::for_cidrs(true, false))
    };
    // a fixed seed, so the random bits are the same on every run
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    println!(
        "
workload {namespace}/{workload} (from ReplicaSet {replica_set:?}):"
    );
    let replicas = [
        pod_name.to_owned(),
        format!("{replica_set}-q8d2w"),
        format!("{replica_set}-z7m4k"),
    ];
    for pod in &replicas {
        let identity = Identity {
            namespace,
            workload: &workload,
            image: Some("registry.example/checkout:2.4.1"),
            pod,
            container_id: "4f1c2e0b",
        };
        let got = pools.allocate(&request, &identity, &mut rng)?;
        let n = got
            .counter
            .map_or(String::new(), |n| format!("  (n = {n})"));
        let addr = got.ipv6.map_or_else(|| "-".to_owned(), |a| a.to_string());
        println!("  pod {pod:<28} {addr}{n}");
    }
    Ok(())
}
