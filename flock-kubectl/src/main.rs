//! `kubectl-flock`: kubectl finds it on `PATH` as the plugin `kubectl flock`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use flock_kubectl::cluster::Cluster;
use flock_kubectl::commands::{self, Output};
use flock_kubectl::error::{EXIT_PROBLEM, Error};

#[derive(Parser, Debug)]
#[command(
    name = "kubectl flock",
    version,
    about = "Answers an operator's questions about a flock cluster",
    after_help = "Exit codes: 0 all well, 1 a problem found, 2 a wrong argument, 3 not found, \
                  4 no flock in the cluster, 5 an agent did not answer (or a release was \
                  refused), 6 the API or the kubeconfig, 7 a local file."
)]
struct Cli {
    /// The kubeconfig (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The namespace flock runs in.
    #[arg(long, short = 'n', global = true, default_value = "kube-system")]
    namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Each node: flock's pods, versions, NodeConfig and pool, addresses used and free, BGP
    /// sessions and BFD, NetworkPolicy; then what is wrong.
    Status {
        /// table or json.
        #[arg(long, short = 'o', value_enum, default_value = "table")]
        output: Output,
    },
    /// BGP sessions, and the routes each node announces and learns.
    Bgp {
        /// One node (default: every node).
        node: Option<String>,
        /// table or json.
        #[arg(long, short = 'o', value_enum, default_value = "table")]
        output: Output,
    },
    /// Addresses: every one flock handed out, cross-checked between the API, the agents'
    /// stores and the nodes' kernels.
    Ipam {
        #[command(subcommand)]
        command: IpamCommand,
    },
    /// NetworkPolicy and ClusterNetworkPolicy.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// One archive of what a bug report needs: each node's logs, BIRD's configuration,
    /// protocols and routes, routing tables, nftables, store, metrics; flock's objects.
    Sysdump {
        /// The archive (default: flock-sysdump-TIME.tar.gz here).
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
        /// Print the listing as json.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum IpamCommand {
    /// Leaked, orphaned, duplicated and out-of-CIDR addresses.
    Check {
        /// Free what is safely leaked: records whose pod is gone from the API and from the
        /// node. Nothing is freed while any source cannot be read.
        #[arg(long)]
        release: bool,
        /// table or json.
        #[arg(long, short = 'o', value_enum, default_value = "table")]
        output: Output,
    },
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// The verdict of a new connection and the rule that decides it.
    Explain {
        /// The source: a pod (namespace/name) or an address.
        src: String,
        /// The destination: a pod (namespace/name) or an address (a Service's backend).
        dst: String,
        /// PORT/PROTO (80/tcp, 53/udp, 9/sctp) or icmp.
        port: String,
        /// Use the pods' IPv4 addresses (IPv6 by default).
        #[arg(long, short = '4')]
        ipv4: bool,
        /// table or json.
        #[arg(long, short = 'o', value_enum, default_value = "table")]
        output: Output,
    },
}

async fn run(cli: Cli) -> Result<commands::Outcome, Error> {
    let cluster = Cluster::connect(cli.kubeconfig.as_deref(), cli.namespace).await?;
    match cli.command {
        Command::Status { output } => commands::status(&cluster, output).await,
        Command::Bgp { node, output } => commands::bgp(&cluster, node.as_deref(), output).await,
        Command::Ipam {
            command: IpamCommand::Check { release, output },
        } => commands::ipam(&cluster, release, output).await,
        Command::Policy {
            command:
                PolicyCommand::Explain {
                    src,
                    dst,
                    port,
                    ipv4,
                    output,
                },
        } => commands::explain(&cluster, &src, &dst, &port, ipv4, output).await,
        Command::Sysdump { output, json } => {
            let format = if json { Output::Json } else { Output::Table };
            commands::sysdump(&cluster, output.as_deref(), format).await
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kubectl flock: start the async runtime: {e}");
            return ExitCode::from(6);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(outcome) => {
            print!("{}", outcome.text);
            if outcome.problem {
                ExitCode::from(EXIT_PROBLEM)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("kubectl flock: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
