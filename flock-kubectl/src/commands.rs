//! Each command: what it asks the cluster, and what it prints.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use flock_agent::inspect::NodeReport;
use flock_k8s_api::{NodeConfig, NodePool};
use ipnet::IpNet;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DynamicObject};
use serde::Serialize;

use crate::cluster::{AGENT_CONTAINER, BIRD_CONTAINER, Cluster, FlockPod};
use crate::error::{Error, Result};
use crate::explain::{End, Inputs};
use crate::ipam::{self, ApiPod, NodeView};
use crate::status::{NodeInputs, NodeStatus, node_status};
use crate::sysdump::Archive;
use crate::table::Table;

/// Table for people or JSON for scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Tables.
    Table,
    /// JSON.
    Json,
}

/// What a command prints, and whether it found a problem (exit 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The text.
    pub text: String,
    /// A problem was found.
    pub problem: bool,
}

fn json(value: &impl Serialize) -> String {
    serde_json::to_string_pretty(value).expect("answers serialise") + "\n"
}

/// Everything flock's pods and objects say, with each node's report.
struct Snapshot {
    agents: Vec<FlockPod>,
    birds: Vec<FlockPod>,
    configs: Vec<NodeConfig>,
    /// The nodes: the API's, and any NodeConfig's or agent's beyond them.
    nodes: Vec<String>,
    /// Each agent's node's report, or why there is none.
    reports: BTreeMap<String, std::result::Result<NodeReport, String>>,
}

async fn snapshot(cluster: &Cluster, dump: bool) -> Result<Snapshot> {
    let agents = cluster.agents().await?;
    let birds = cluster.birds().await?;
    let configs = cluster.node_configs().await?;
    let api_nodes: Vec<Node> = cluster
        .list(Api::all(cluster.client().clone()), "nodes")
        .await?;
    let mut nodes: BTreeSet<String> = api_nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    nodes.extend(configs.iter().filter_map(|c| c.metadata.name.clone()));
    nodes.extend(agents.iter().map(|a| a.node.clone()));
    let reports = futures::future::join_all(agents.iter().map(|a| async move {
        let r = cluster.inspect(a, dump).await.map_err(|e| e.to_string());
        (a.node.clone(), r)
    }))
    .await
    .into_iter()
    .collect();
    Ok(Snapshot {
        agents,
        birds,
        configs,
        nodes: nodes.into_iter().collect(),
        reports,
    })
}

impl Snapshot {
    fn statuses(&self) -> Vec<NodeStatus> {
        self.nodes
            .iter()
            .map(|node| {
                let report = match self.reports.get(node) {
                    Some(Ok(r)) => Ok(r),
                    Some(Err(e)) => Err(e.as_str()),
                    None => Err("no agent"),
                };
                node_status(NodeInputs {
                    node,
                    agent: self.agents.iter().find(|a| &a.node == node),
                    bird: self.birds.iter().find(|b| &b.node == node),
                    config: self.config(node),
                    report,
                })
            })
            .collect()
    }

    fn config(&self, node: &str) -> Option<&NodeConfig> {
        self.configs
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(node))
    }
}

#[derive(Serialize)]
struct StatusAnswer<'a> {
    nodes: &'a [NodeStatus],
    problems: Vec<String>,
}

fn pod_cell(p: &Option<crate::status::PodHealth>) -> String {
    match p {
        None => "-".to_owned(),
        Some(p) if p.ready => "ready".to_owned(),
        Some(_) => "NOT READY".to_owned(),
    }
}

/// `status`.
pub async fn status(cluster: &Cluster, output: Output) -> Result<Outcome> {
    let snap = snapshot(cluster, false).await?;
    let statuses = snap.statuses();
    let problems: Vec<String> = statuses.iter().flat_map(|s| s.problems.clone()).collect();
    let text = match output {
        Output::Json => json(&StatusAnswer {
            nodes: &statuses,
            problems: problems.clone(),
        }),
        Output::Table => {
            let mut nodes = Table::new(&[
                "NODE",
                "AGENT",
                "VERSION",
                "BIRD",
                "POOL",
                "IPV6 CIDR",
                "USED",
                "FREE",
                "IPV4 CIDR",
                "USED",
                "FREE",
                "POLICY",
            ]);
            let mut sessions = Table::new(&[
                "NODE", "NEIGHBOR", "STATE", "SINCE", "SENT", "RECEIVED", "BFD", "INFO",
            ]);
            for s in &statuses {
                let fam = |f: &Option<crate::status::Family>| match f {
                    Some(f) => [f.cidr.to_string(), f.used.to_string(), f.free.clone()],
                    None => ["-".into(), "-".into(), "-".into()],
                };
                let [c6, u6, f6] = fam(&s.ipv6);
                let [c4, u4, f4] = fam(&s.ipv4);
                nodes.row(vec![
                    s.node.clone(),
                    pod_cell(&s.agent),
                    s.version.clone().unwrap_or_else(|| "-".into()),
                    pod_cell(&s.bird),
                    s.pool.clone().unwrap_or_else(|| "-".into()),
                    c6,
                    u6,
                    f6,
                    c4,
                    u4,
                    f4,
                    s.policy.clone().unwrap_or_else(|| "off".into()),
                ]);
                for x in &s.sessions {
                    let count = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or("?".into());
                    sessions.row(vec![
                        s.node.clone(),
                        x.neighbor.clone(),
                        match x.known {
                            true => x.state.clone(),
                            false => format!("{}?", x.state),
                        },
                        x.since.clone(),
                        count(x.sent),
                        count(x.received),
                        x.bfd.clone().unwrap_or_else(|| "-".into()),
                        x.info.clone(),
                    ]);
                }
            }
            let mut out = nodes.render();
            if !sessions.is_empty() {
                out.push('\n');
                out.push_str(&sessions.render());
            }
            out.push('\n');
            out.push_str(&summary(statuses.len(), &problems));
            out
        }
    };
    Ok(Outcome {
        text,
        problem: !problems.is_empty(),
    })
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn summary(nodes: usize, problems: &[String]) -> String {
    match problems {
        [] => format!("{nodes} node{}, all healthy\n", plural(nodes)),
        p => {
            let mut out = format!(
                "{nodes} node{}, {} problem{}:\n",
                plural(nodes),
                p.len(),
                plural(p.len())
            );
            for line in p {
                out.push_str(&format!("  {line}\n"));
            }
            out
        }
    }
}

/// `bgp [NODE]`.
pub async fn bgp(cluster: &Cluster, node: Option<&str>, output: Output) -> Result<Outcome> {
    let snap = snapshot(cluster, false).await?;
    if let Some(n) = node
        && !snap.nodes.iter().any(|x| x == n)
    {
        return Err(Error::NotFound {
            asked: format!("node {n}"),
            found: format!("the cluster's nodes are {}", snap.nodes.join(", ")),
        });
    }
    let statuses: Vec<NodeStatus> = snap
        .statuses()
        .into_iter()
        .filter(|s| node.is_none_or(|n| s.node == n))
        .collect();
    let problems: Vec<String> = statuses
        .iter()
        .flat_map(|s| s.problems.iter())
        .filter(|p| p.contains("BGP") || p.contains("BIRD") || p.contains("BFD"))
        .cloned()
        .collect();
    let text = match output {
        Output::Json => json(&StatusAnswer {
            nodes: &statuses,
            problems: problems.clone(),
        }),
        Output::Table => {
            let mut out = String::new();
            for s in &statuses {
                out.push_str(&format!("{}:\n", s.node));
                if s.sessions.is_empty() {
                    out.push_str("  no BGP sessions\n");
                }
                for x in &s.sessions {
                    out.push_str(&format!(
                        "  {} {}{} since {}, BFD {}\n",
                        x.neighbor,
                        x.state,
                        if x.known { "" } else { " (last known)" },
                        if x.since.is_empty() { "?" } else { &x.since },
                        x.bfd.as_deref().unwrap_or("off")
                    ));
                    let list = |l: &[IpNet]| {
                        l.iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(" ")
                    };
                    out.push_str(&format!(
                        "    announces ({}): {}\n",
                        x.announced.len(),
                        list(&x.announced)
                    ));
                    out.push_str(&format!(
                        "    learns    ({}): {}\n",
                        x.learned.len(),
                        list(&x.learned)
                    ));
                }
            }
            out.push('\n');
            out.push_str(&summary(statuses.len(), &problems));
            out
        }
    };
    Ok(Outcome {
        text,
        problem: !problems.is_empty(),
    })
}

#[derive(Serialize)]
struct IpamAnswer {
    check: ipam::IpamCheck,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    released: Vec<ipam::Release>,
    #[serde(skip_serializing_if = "Option::is_none")]
    after: Option<ipam::IpamCheck>,
}

async fn ipam_check_once(cluster: &Cluster, snap: &Snapshot) -> Result<ipam::IpamCheck> {
    let pods: Vec<ApiPod> = cluster.pods().await?.iter().map(ApiPod::of).collect();
    let parsed = |pair: [Option<&String>; 2]| -> Vec<IpNet> {
        pair.into_iter()
            .flatten()
            .filter_map(|c| c.parse().ok())
            .collect()
    };
    // each node's CIDRs: the cluster network's, and each secondary network's by name
    let cidrs: BTreeMap<&str, ipam::NodeCidrs> = snap
        .configs
        .iter()
        .map(|c| {
            let cidrs = ipam::NodeCidrs {
                cluster: parsed([c.spec.cidr6.as_ref(), c.spec.cidr4.as_ref()]),
                networks: c
                    .spec
                    .networks
                    .iter()
                    .map(|n| (n.name.clone(), parsed([n.cidr6.as_ref(), n.cidr4.as_ref()])))
                    .collect(),
            };
            (c.metadata.name.as_deref().unwrap_or_default(), cidrs)
        })
        .collect();
    let none = ipam::NodeCidrs::default();
    let mut unreadable = Vec::new();
    let mut views = Vec::new();
    for node in &snap.nodes {
        match snap.reports.get(node) {
            Some(Ok(r)) => views.push(NodeView {
                node,
                cidrs: cidrs.get(node.as_str()).unwrap_or(&none),
                report: r,
            }),
            Some(Err(e)) => unreadable.push(e.clone()),
            None => unreadable.push(format!("{node}: no flock agent pod on the node")),
        }
    }
    Ok(ipam::check(&pods, &views, unreadable))
}

fn ipam_text(c: &ipam::IpamCheck) -> String {
    let mut out = format!(
        "{} records holding {} addresses; {} finding{}\n",
        c.records,
        c.addresses,
        c.findings.len(),
        plural(c.findings.len())
    );
    for f in &c.findings {
        out.push_str(&format!("  {}\n", f.line()));
    }
    for u in &c.unreadable {
        out.push_str(&format!("  unreadable  {u}\n"));
    }
    out
}

/// `ipam check [--release]`.
pub async fn ipam(cluster: &Cluster, release: bool, output: Output) -> Result<Outcome> {
    let snap = snapshot(cluster, false).await?;
    let check = ipam_check_once(cluster, &snap).await?;
    let mut released = Vec::new();
    let mut after = None;
    if release {
        let todo = ipam::to_release(&check).map_err(|reason| Error::Refused { reason })?;
        for r in &todo {
            let agent = snap
                .agents
                .iter()
                .find(|a| a.node == r.node)
                .expect("a readable node has an agent");
            cluster
                .exec_ok(
                    agent,
                    AGENT_CONTAINER,
                    &[
                        "flock-agent",
                        "release",
                        "--container-id",
                        &r.container_id,
                        "--if-name",
                        &r.if_name,
                        "--network",
                        &r.network,
                    ],
                )
                .await?;
            released.push(r.clone());
        }
        if !todo.is_empty() {
            let snap = snapshot(cluster, false).await?;
            after = Some(ipam_check_once(cluster, &snap).await?);
        }
    }
    let last = after.as_ref().unwrap_or(&check);
    let problem = !last.findings.is_empty() || !last.unreadable.is_empty();
    let text = match output {
        Output::Json => json(&IpamAnswer {
            check: check.clone(),
            released: released.clone(),
            after: after.clone(),
        }),
        Output::Table => {
            let mut out = ipam_text(&check);
            if release {
                out.push_str(&format!("released {}:\n", released.len()));
                for r in &released {
                    out.push_str(&format!(
                        "  {}: container {} {} (network {})\n",
                        r.node, r.container_id, r.if_name, r.network
                    ));
                }
                if let Some(a) = &after {
                    out.push_str("after the release: ");
                    out.push_str(&ipam_text(a));
                }
            }
            out
        }
    };
    Ok(Outcome { text, problem })
}

/// `policy explain SRC DST PORT/PROTO`.
pub async fn explain(
    cluster: &Cluster,
    src: &str,
    dst: &str,
    port: &str,
    ipv4: bool,
    output: Output,
) -> Result<Outcome> {
    let (src, dst) = (End::parse("SRC", src)?, End::parse("DST", dst)?);
    // the parse of PORT/PROTO is checked before the cluster is asked anything
    crate::explain::parse_transport(port, true)?;
    let client = cluster.client().clone();
    let cluster_policies = match cluster
        .list(
            Api::<DynamicObject>::all_with(
                client.clone(),
                &flock_agent::policy::cluster::api_resource(),
            ),
            "clusternetworkpolicies",
        )
        .await
    {
        Ok(l) => l,
        // the API has no ClusterNetworkPolicy: NetworkPolicy alone
        Err(Error::Api {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 404 => Vec::new(),
        Err(e) => return Err(e),
    };
    let inputs = Inputs {
        pods: cluster.pods().await?,
        namespaces: cluster
            .list(Api::<Namespace>::all(client.clone()), "namespaces")
            .await?,
        policies: cluster
            .list(Api::<NetworkPolicy>::all(client), "networkpolicies")
            .await?,
        cluster_policies,
    };
    let answer = crate::explain::explain(&inputs, &src, &dst, port, ipv4)?;
    let text = match output {
        Output::Json => json(&answer),
        Output::Table => {
            let mut out = format!("{}\n{}\n", answer.flow, answer.reason);
            out.push_str(&format!("  {}\n  {}\n", answer.egress, answer.ingress));
            for s in &answer.skipped {
                out.push_str(&format!("  (left out, as the agents leave it: {s})\n"));
            }
            out
        }
    };
    Ok(Outcome {
        text,
        problem: false,
    })
}

/// `sysdump [-o FILE]`: the archive's listing.
pub async fn sysdump(cluster: &Cluster, file: Option<&Path>, output: Output) -> Result<Outcome> {
    let snap = snapshot(cluster, true).await?;
    let stamp = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y%m%d-%H%M%S")
        .to_string();
    let root = format!("flock-sysdump-{stamp}");
    let path = file
        .map(Path::to_path_buf)
        .unwrap_or_else(|| format!("{root}.tar.gz").into());
    let mut archive = Archive::new(&root);
    for (node, report) in &snap.reports {
        match report {
            Ok(r) => archive.add_node(node, r.clone()),
            Err(e) => archive.error(format!("nodes/{node}: {e}")),
        }
    }
    for (pods, container) in [
        (&snap.agents, AGENT_CONTAINER),
        (&snap.birds, BIRD_CONTAINER),
    ] {
        for p in pods {
            let name = format!("nodes/{}/{container}.log", p.node);
            match cluster.logs(p, container, false).await {
                Ok(text) => archive.add(&name, text),
                Err(e) => archive.error(format!("{name}: {e}")),
            }
            // the container before its last restart: what a crash left
            if p.restarts > 0 {
                let name = format!("nodes/{}/{container}-previous.log", p.node);
                match cluster.logs(p, container, true).await {
                    Ok(text) => archive.add(&name, text),
                    Err(e) => archive.error(format!("{name}: {e}")),
                }
            }
        }
    }
    let client = cluster.client().clone();
    archive.add("cluster/nodeconfigs.yaml", yaml(&snap.configs));
    archive.add_list(
        "cluster/nodepools.yaml",
        cluster
            .list(Api::<NodePool>::all(client.clone()), "nodepools")
            .await,
    );
    archive.add_list(
        "cluster/daemonsets.yaml",
        cluster
            .list(
                Api::<DaemonSet>::namespaced(client.clone(), &cluster.namespace),
                "daemonsets",
            )
            .await,
    );
    let pods = [snap.agents.clone(), snap.birds.clone()].concat();
    archive.add("cluster/flock-pods.json", json(&pods));
    archive.add_list(
        "cluster/networkpolicies.yaml",
        cluster
            .list(Api::<NetworkPolicy>::all(client.clone()), "networkpolicies")
            .await,
    );
    archive.add_list(
        "cluster/clusternetworkpolicies.yaml",
        cluster
            .list(
                Api::<DynamicObject>::all_with(
                    client,
                    &flock_agent::policy::cluster::api_resource(),
                ),
                "clusternetworkpolicies",
            )
            .await,
    );
    let entries = archive.write(&path)?;
    let text = match output {
        Output::Json => json(&serde_json::json!({ "file": path, "entries": entries })),
        Output::Table => {
            let mut t = Table::new(&["SIZE", "FILE"]);
            for e in &entries {
                t.row(vec![e.size.to_string(), e.path.clone()]);
            }
            format!("{}\nwrote {}\n", t.render(), path.display())
        }
    };
    Ok(Outcome {
        text,
        problem: false,
    })
}

/// Objects as YAML.
fn yaml<T: Serialize>(v: &T) -> String {
    crate::sysdump::yaml(v)
}
