//! `flock-agent`: the node daemon and its tools (DESIGN §9).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use flock_agent::daemon::{RunOptions, defaults};
use flock_agent::routing::bird::{BirdTarget, Debounce};
use flock_agent::store::Store;
use flock_k8s_api::client::duration_flag;
use flock_rpc::defaults as cni_defaults;

#[derive(Parser, Debug)]
#[command(name = "flock-agent", version, about = "flock's node agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the node daemon.
    Run(RunArgs),
    /// Install the shim and the conflist on this node (the DaemonSet's init container).
    InstallCni(InstallArgs),
    /// Deprecated: runs `flock-controller` (beside this program) with the same arguments.
    #[command(disable_help_flag = true)]
    Controller {
        /// `flock-controller`'s arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Print a CustomResourceDefinition as YAML (NodeConfig unless told otherwise).
    Crd {
        /// Which resource: nodeconfigs or nodepools.
        #[arg(default_value = "nodeconfigs", value_parser = ["nodeconfigs", "nodepools"])]
        resource: String,
    },
    /// Remove what flock put in this node's nftables (the tables `inet flock_policy` and
    /// `inet flock_services`), for an uninstall: run on each node after `kubectl delete -f
    /// deploy/`. Other tables (kube-proxy's) are untouched; running it twice is fine.
    Cleanup {
        /// The nft program.
        #[arg(long, env = "FLOCK_NFT", default_value = "nft")]
        nft: PathBuf,
    },
    /// Show what the allocation store holds.
    Allocations {
        /// The agent's state directory.
        #[arg(long, env = "FLOCK_STATE_DIR", default_value = defaults::STATE_DIR)]
        state_dir: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print what this node holds as JSON — the store, the `flock*` links and routes, BIRD's
    /// sessions, BFD, the agent's readiness — for `kubectl flock` (which runs it in the
    /// agent's container). Reads only.
    Inspect(InspectArgs),
    /// Release one allocation as its DEL would: sends the agent a CNI DEL for the attachment
    /// (`kubectl flock ipam check --release` runs it for a leaked one).
    Release {
        /// The attachment's container ID.
        #[arg(long)]
        container_id: String,
        /// The attachment's interface name.
        #[arg(long)]
        if_name: String,
        /// The attachment's CNI network.
        #[arg(long, default_value = "flock")]
        network: String,
        /// The agent's RPC socket.
        #[arg(long, env = "FLOCK_SOCKET", default_value = defaults::SOCKET)]
        socket: PathBuf,
    },
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// This node's name.
    #[arg(long, env = "FLOCK_NODE_NAME", default_value = "")]
    node: String,
    /// The agent's state directory.
    #[arg(long, env = "FLOCK_STATE_DIR", default_value = defaults::STATE_DIR)]
    state_dir: PathBuf,
    /// The BIRD configuration file the agent renders.
    #[arg(long, env = "FLOCK_BIRD_CONFIG", default_value = defaults::BIRD_CONFIG)]
    bird_config: PathBuf,
    /// BIRD's control socket.
    #[arg(long, env = "FLOCK_BIRD_SOCKET", default_value = defaults::BIRD_SOCKET)]
    bird_socket: PathBuf,
    /// The birdc program.
    #[arg(long, env = "FLOCK_BIRDC", default_value = "birdc")]
    birdc: PathBuf,
    /// Where the agent serves /readyz and /metrics.
    #[arg(long, env = "FLOCK_METRICS_ADDR", default_value = defaults::METRICS_ADDR)]
    metrics_addr: SocketAddr,
    /// The nft program.
    #[arg(long, env = "FLOCK_NFT", default_value = "nft")]
    nft: PathBuf,
    /// Add the raw texts a bug report needs: BIRD's configuration, protocols and routes, the
    /// routing tables, the nftables ruleset, the metrics.
    #[arg(long)]
    dump: bool,
}

#[derive(Args, Debug)]
struct InstallArgs {
    /// The shim binary to install (default: `flock` next to this program).
    #[arg(long, env = "FLOCK_SHIM")]
    shim: Option<PathBuf>,
    /// The CNI binary directory.
    #[arg(long, env = "FLOCK_CNI_BIN_DIR", default_value = defaults::CNI_BIN_DIR)]
    bin_dir: PathBuf,
    /// The CNI configuration directory.
    #[arg(long, env = "FLOCK_CNI_CONF_DIR", default_value = defaults::CNI_CONF_DIR)]
    conf_dir: PathBuf,
    /// The CNI network name.
    #[arg(long, env = "FLOCK_NETWORK", default_value = "flock")]
    network: String,
    /// The conflist's cniVersion (0.4.0, 1.0.0 or 1.1.0); cniVersions offers it and every newer
    /// one. 1.0.0 because containerd 1.6 and 1.7 refuse a 1.1.0 result.
    #[arg(
        long,
        env = "FLOCK_CNI_VERSION",
        default_value_t = flock_agent::install::DEFAULT_CNI_VERSION,
        value_parser = flock_agent::install::parse_cni_version
    )]
    cni_version: flock_cni_proto::CniVersion,
    /// The agent socket written into the conflist.
    #[arg(long, env = "FLOCK_SOCKET", default_value = cni_defaults::DEFAULT_AGENT_SOCKET)]
    agent_socket: PathBuf,
    /// The agent's state directory: the shim queues DELs in its del-queue.
    #[arg(long, env = "FLOCK_STATE_DIR", default_value = cni_defaults::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// The DEL queue written into the conflist (default: `<state-dir>/del-queue`); the
    /// agent's `run --del-queue-dir`.
    #[arg(long, env = "FLOCK_DEL_QUEUE_DIR")]
    del_queue_dir: Option<PathBuf>,
    /// The MTU of pod interfaces. Absent: none in the conflist, and the agent gives each new
    /// pod the MTU of the node's uplink (the interface of its route to the BGP neighbor).
    #[arg(long, env = "FLOCK_MTU")]
    mtu: Option<u32>,
    /// The reference plugins to chain after flock, comma-separated, each of which must be in
    /// the CNI binary directory: `portmap` (hostPort), `bandwidth` (the bandwidth
    /// annotations), or `none`.
    #[arg(
        long,
        env = "FLOCK_CNI_CHAIN",
        value_delimiter = ',',
        default_value = flock_agent::install::DEFAULT_CHAIN_FLAG,
        value_parser = flock_agent::install::parse_chained
    )]
    chain: Vec<Option<flock_agent::install::Chained>>,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Run without Kubernetes: NodeConfig from a file, pod identity from CNI_ARGS.
    #[arg(long, env = "FLOCK_STANDALONE", requires = "node_config")]
    standalone: bool,
    /// The NodeConfig YAML file (standalone mode).
    #[arg(long, env = "FLOCK_NODE_CONFIG")]
    node_config: Option<PathBuf>,
    /// This node's name (standalone: default the NodeConfig's name; Kubernetes mode: required).
    #[arg(long, env = "FLOCK_NODE_NAME")]
    node: Option<String>,
    /// The RPC socket the shim connects to.
    #[arg(long, env = "FLOCK_SOCKET", default_value = defaults::SOCKET)]
    socket: PathBuf,
    /// Where allocations are persisted.
    #[arg(long, env = "FLOCK_STATE_DIR", default_value = defaults::STATE_DIR)]
    state_dir: PathBuf,
    /// The BIRD configuration file the agent renders.
    #[arg(
        long,
        env = "FLOCK_BIRD_CONFIG",
        default_value = defaults::BIRD_CONFIG
    )]
    bird_config: PathBuf,
    /// BIRD's control socket.
    #[arg(long, env = "FLOCK_BIRD_SOCKET", default_value = defaults::BIRD_SOCKET)]
    bird_socket: PathBuf,
    /// The birdc program.
    #[arg(long, env = "FLOCK_BIRDC", default_value = "birdc")]
    birdc: PathBuf,
    /// The DEL queue the shim writes to when the agent is unreachable
    /// (default: `<state-dir>/del-queue`).
    #[arg(long, env = "FLOCK_DEL_QUEUE_DIR")]
    del_queue_dir: Option<PathBuf>,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, env = "FLOCK_METRICS_ADDR", default_value = defaults::METRICS_ADDR)]
    metrics_addr: SocketAddr,
    /// Append one JSON line per CNI request to this file: its phases and their durations
    /// (`cargo xtask bench` reads it).
    #[arg(long, env = "FLOCK_TRACE")]
    trace: Option<PathBuf>,
    /// Kubernetes mode: a kubeconfig file (default: in-cluster service account, or $KUBECONFIG).
    #[arg(long, env = "FLOCK_KUBECONFIG", conflicts_with = "standalone")]
    kubeconfig: Option<PathBuf>,
    /// Kubernetes mode: how long a pod may be gone from this node before its allocation is
    /// released (`300`, `300s`, `5m`, `1h`).
    #[arg(long, env = "FLOCK_LEAK_GRACE", default_value = "5m", value_parser = duration_flag)]
    leak_grace: Duration,
    /// Kubernetes mode: the shortest time between two NodeConfig status writes.
    #[arg(long, env = "FLOCK_STATUS_INTERVAL", default_value = "10s", value_parser = duration_flag)]
    status_interval: Duration,
    /// Kubernetes mode: how long ADD waits for the pod watcher to see its pod, and then for
    /// the pod's NetworkPolicy rules to be in place.
    #[arg(long, env = "FLOCK_POD_WAIT", default_value = "10s", value_parser = duration_flag)]
    pod_wait: Duration,
    /// Kubernetes mode: enforce NetworkPolicies with nftables (table `inet flock_policy`).
    #[arg(long, env = "FLOCK_NETWORK_POLICY", default_value_t = true, action = clap::ArgAction::Set)]
    network_policy: bool,
    /// The nft program.
    #[arg(long, env = "FLOCK_NFT", default_value = "nft")]
    nft: PathBuf,
    /// Kubernetes mode: where the policy decisions of namespaces annotated
    /// `flock.fritzlab.net/policy-log` are written, one JSON line each.
    #[arg(
        long,
        env = "FLOCK_POLICY_LOG",
        default_value = "/var/log/flock/policy.log"
    )]
    policy_log: PathBuf,
    /// Kubernetes mode: the size at which the policy log is rotated (`policy.log.1`, …).
    #[arg(long, env = "FLOCK_POLICY_LOG_MAX_BYTES", default_value_t = 10 << 20)]
    policy_log_max_bytes: u64,
    /// Kubernetes mode: rotated policy logs kept.
    #[arg(long, env = "FLOCK_POLICY_LOG_KEEP", default_value_t = 3)]
    policy_log_keep: u32,
    /// Kubernetes mode: policy log lines per pod and second (bursts of twice as many).
    #[arg(long, env = "FLOCK_POLICY_LOG_RATE", default_value_t = 10)]
    policy_log_rate: u32,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(args),
        Command::InstallCni(args) => install_cni(args),
        Command::Controller { args } => controller(args),
        Command::Crd { resource } => {
            match resource.as_str() {
                "nodepools" => print!("{}", flock_agent::crd::node_pool_yaml()),
                _ => print!("{}", flock_agent::crd::node_config_yaml()),
            }
            Ok(())
        }
        Command::Cleanup { nft } => cleanup(nft),
        Command::Allocations { state_dir, json } => allocations(&state_dir, json),
        Command::Inspect(args) => inspect(args),
        Command::Release {
            container_id,
            if_name,
            network,
            socket,
        } => release(&socket, container_id, if_name, &network),
    }
}

fn init_logs() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: a container's log (kubectl logs, the
        // node's log files) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// `flock-agent controller ARGS…`: the pool controller is its own program now,
/// `flock-controller` (deploy/controller.yaml runs it); this runs it from beside this binary,
/// with the same arguments, for the Deployments of the release before. To be removed in the
/// next release.
fn controller(args: Vec<std::ffi::OsString>) -> Result<()> {
    use std::os::unix::process::CommandExt as _;
    let own = std::env::current_exe().context("find this program")?;
    let program = own.with_file_name("flock-controller");
    eprintln!(
        "flock-agent controller is deprecated: running {} (deploy/controller.yaml runs it directly)",
        program.display()
    );
    let error = std::process::Command::new(&program).args(args).exec();
    Err(error).with_context(|| format!("run {}", program.display()))
}

fn run(args: RunArgs) -> Result<()> {
    init_logs();
    let del_queue_dir = args
        .del_queue_dir
        .unwrap_or_else(|| cni_defaults::del_queue_dir(&args.state_dir));
    let options = RunOptions {
        node_config: args.node_config,
        node: args.node,
        socket: args.socket,
        state_dir: args.state_dir,
        del_queue_dir,
        bird: BirdTarget {
            config_path: args.bird_config,
            socket: args.bird_socket,
            birdc: args.birdc,
        },
        debounce: Debounce::default(),
        metrics_addr: args.metrics_addr,
        rng_seed: flock_agent::agent::os_seed(),
        // A test hook: the crash-safety tests abort the agent at a chosen point of an ADD.
        failpoint: std::env::var("FLOCK_FAILPOINT").ok(),
        trace: args.trace,
    };
    // One thread. The agent's work is kernel calls made in small steps (a netlink request,
    // its answer, the next), each a hand-off between tasks; with a worker per CPU every
    // hand-off woke another worker, and that cost more than the work itself. Measured with
    // `cargo xtask bench`: daemon CPU per ADD in a burst 0.8-1.0 ms with two workers,
    // 0.6-0.7 ms with one; flock-netns alone set up 1,083-1,423 pods/s at concurrency 10
    // with two and 2,028-2,259 with one. Blocking work (nft, the store's open) goes to tokio's
    // blocking threads, and each new pod namespace is entered on a thread of its own.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    if args.standalone {
        runtime.block_on(flock_agent::daemon::run_standalone(options))?;
    } else {
        let kube = flock_agent::k8s::KubeOptions {
            kubeconfig: args.kubeconfig,
            leak_grace: args.leak_grace,
            status_interval: args.status_interval,
            pod_wait: args.pod_wait,
            network_policy: args.network_policy,
            nft: args.nft,
            policy_log: flock_agent::policy::decisions::LogOptions {
                path: args.policy_log,
                max_bytes: args.policy_log_max_bytes,
                keep: args.policy_log_keep,
                rate: args.policy_log_rate,
                burst: args.policy_log_rate.saturating_mul(2),
            },
            ..flock_agent::k8s::KubeOptions::default()
        };
        runtime.block_on(flock_agent::k8s::run(options, kube))?;
    }
    Ok(())
}

fn install_cni(args: InstallArgs) -> Result<()> {
    let shim = match args.shim {
        Some(path) => path,
        None => std::env::current_exe()
            .context("locate this program")?
            .with_file_name("flock"),
    };
    let del_queue_dir = args
        .del_queue_dir
        .unwrap_or_else(|| cni_defaults::del_queue_dir(&args.state_dir));
    let plan = flock_agent::install::InstallPlan {
        shim,
        bin_dir: args.bin_dir,
        conf_dir: args.conf_dir,
        network: args.network,
        cni_version: args.cni_version,
        agent_socket: args.agent_socket,
        del_queue_dir,
        mtu: args.mtu,
        chain: args.chain.into_iter().flatten().collect(),
    };
    for path in flock_agent::install::install(&plan)? {
        eprintln!("installed {}", path.display());
    }
    Ok(())
}

fn cleanup(nft: PathBuf) -> Result<()> {
    use flock_agent::policy::nft::{Nft, NftCommand};
    use flock_agent::routing::services::guard;
    let nft = NftCommand::new(nft, flock_netns::NsTarget::Current);
    let tables = format!("inet {} and inet {}", flock_policy::TABLE, guard::TABLE);
    // One transaction: both tables go, or neither.
    let script = format!("{}{}", flock_policy::REMOVE_SCRIPT, guard::REMOVE_SCRIPT);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?
        .block_on(nft.apply(script))
        .with_context(|| format!("remove nftables tables {tables}"))?;
    eprintln!("removed nftables tables {tables} (those that existed)");
    Ok(())
}

fn allocations(state_dir: &std::path::Path, json: bool) -> Result<()> {
    // Read-only: a running agent's store is never written (nor its temporary files removed).
    let records = Store::read(state_dir)
        .with_context(|| format!("read the store in {}", state_dir.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(());
    }
    println!(
        "{:<14} {:<6} {:<8} {:<10} {:<28} {:<16} {:<24} HOST-IF",
        "CONTAINER", "IF", "NETWORK", "STATE", "IPV6", "IPV4", "POD"
    );
    for r in &records {
        let pod = r
            .pod
            .as_ref()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .unwrap_or_default();
        let cid: String = r.container_id.chars().take(12).collect();
        println!(
            "{:<14} {:<6} {:<8} {:<10} {:<28} {:<16} {:<24} {}",
            cid,
            r.if_name,
            r.network,
            format!("{:?}", r.state).to_lowercase(),
            r.ipv6.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
            r.ipv4.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
            pod,
            r.host_if
        );
    }
    Ok(())
}

fn inspect(args: InspectArgs) -> Result<()> {
    let sources = flock_agent::inspect::Sources {
        node: args.node,
        state_dir: args.state_dir,
        bird_config: args.bird_config,
        bird_socket: args.bird_socket,
        birdc: args.birdc,
        metrics_addr: args.metrics_addr,
        nft: args.nft,
        ip: "ip".into(),
    };
    let report = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?
        .block_on(flock_agent::inspect::gather(&sources, args.dump));
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

fn release(
    socket: &std::path::Path,
    container_id: String,
    if_name: String,
    network: &str,
) -> Result<()> {
    use flock_rpc::rpc::{Op, PROTOCOL_VERSION, Request};
    let request = Request {
        v: PROTOCOL_VERSION,
        op: Op::Del,
        container_id: container_id.clone(),
        // the namespace is gone (that is what makes the allocation a leak); DEL allows none
        netns: String::new(),
        if_name: if_name.clone(),
        args: String::new(),
        path: String::new(),
        config: serde_json::json!({ "cniVersion": "1.0.0", "name": network, "type": "flock" }),
    };
    let response = flock_rpc::rpc::Client::new(socket)
        .call(&request)
        .with_context(|| format!("send a DEL to the agent at {}", socket.display()))?;
    response.into_result().map_err(|e| {
        anyhow::anyhow!(
            "the agent refused the DEL of container {container_id} interface {if_name}: {e}"
        )
    })?;
    println!("released container {container_id} interface {if_name}");
    Ok(())
}
