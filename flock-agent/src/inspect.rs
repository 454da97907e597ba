//! What a node holds, gathered for an operator (`flock-agent inspect`, which `kubectl flock`
//! runs in the agent's container through the API's exec): the store, the node's `flock*`
//! links and routes, BIRD's sessions with the routes each sends and learns, BFD, the agent's
//! `/readyz`, and — for a bug report — the raw texts (BIRD's configuration and protocols,
//! the routing tables, the nftables ruleset, the metrics).
//!
//! Every source is read on its own: one that cannot be read (a frozen BIRD, a store being
//! replaced) is a [`Read::Error`] naming the source and why, and the rest is still reported.
//! Nothing is written: the store is read as `flock-agent allocations` reads it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::agent::startup::{Disposition, disposition};
use crate::store::{AllocationRecord, Store};

/// How long one question to BIRD or the agent's HTTP endpoint may take: a frozen BIRD (or
/// agent) is reported as not answering, not waited for.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);

/// One source's answer, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Read<T> {
    /// What the source said.
    Ok(T),
    /// Why it could not be read.
    Error(String),
}

impl<T> Read<T> {
    /// The answer, if there is one.
    pub fn ok(&self) -> Option<&T> {
        match self {
            Read::Ok(v) => Some(v),
            Read::Error(_) => None,
        }
    }

    /// Why there is no answer, if there is none.
    pub fn error(&self) -> Option<&str> {
        match self {
            Read::Ok(_) => None,
            Read::Error(e) => Some(e),
        }
    }
}

impl<T, E: std::fmt::Display> From<Result<T, E>> for Read<T> {
    fn from(r: Result<T, E>) -> Read<T> {
        match r {
            Ok(v) => Read::Ok(v),
            Err(e) => Read::Error(e.to_string()),
        }
    }
}

/// Where the node's state is (the agent's own flags and environment).
#[derive(Debug, Clone)]
pub struct Sources {
    /// The node's name.
    pub node: String,
    /// The agent's state directory (the store).
    pub state_dir: PathBuf,
    /// BIRD's configuration file.
    pub bird_config: PathBuf,
    /// BIRD's control socket.
    pub bird_socket: PathBuf,
    /// The birdc program.
    pub birdc: PathBuf,
    /// Where the agent serves `/readyz` and `/metrics`.
    pub metrics_addr: SocketAddr,
    /// The nft program.
    pub nft: PathBuf,
    /// The ip program (raw routing tables for a dump).
    pub ip: PathBuf,
}

/// One stored allocation and whether what it stands for is still on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredAttachment {
    /// The record.
    pub record: AllocationRecord,
    /// Whether its network namespace file exists.
    pub netns_exists: bool,
    /// Whether its host veth exists.
    pub host_if_exists: bool,
    /// Whether its pod is still on the node: a committed record of this boot whose namespace
    /// exists (what the agent's start-up keeps), or an ADD in flight. A record that is not
    /// is what start-up would release.
    pub on_node: bool,
}

/// A main-table route through a `flock*` link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRoute {
    /// Destination.
    pub dst: IpNet,
    /// The `flock*` links it goes through.
    pub host_ifs: Vec<String>,
}

/// One BGP session as BIRD sees it, with the prefixes it sends and learns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    /// `show protocols all` for it.
    pub detail: flock_bird::ProtocolDetail,
    /// `show route export NAME`: what the node announces on it.
    pub announced: Read<Vec<IpNet>>,
    /// `show route protocol NAME`: what the node learned from it (after its import filter).
    pub learned: Read<Vec<IpNet>>,
}

/// BIRD's side of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bird {
    /// The BGP sessions.
    pub sessions: Vec<Session>,
    /// BFD's sessions.
    pub bfd: Read<Vec<flock_bird::BfdSession>>,
}

/// The agent's `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Readiness {
    /// HTTP 200.
    pub ready: bool,
    /// What it said (the problems when not ready).
    pub body: String,
}

/// Raw texts for a bug report (`inspect --dump`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dump {
    /// The rendered BIRD configuration.
    pub bird_config: Read<String>,
    /// `birdc show protocols all`.
    pub bird_protocols: Read<String>,
    /// `birdc show route all`.
    pub bird_routes: Read<String>,
    /// `ip -d link`, `ip addr`, `ip rule`, and both families' routing tables (all tables).
    pub ip: Read<String>,
    /// `nft list ruleset`.
    pub nft: Read<String>,
    /// The agent's `/metrics`.
    pub metrics: Read<String>,
}

/// What one node holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// The node.
    pub node: String,
    /// This program's version.
    pub version: String,
    /// The kernel's boot ID.
    pub boot_id: String,
    /// The agent's `/readyz`.
    pub readiness: Read<Readiness>,
    /// The store's allocations.
    pub store: Read<Vec<StoredAttachment>>,
    /// The node's `flock*` links.
    pub host_ifs: Read<Vec<String>>,
    /// Main-table routes through them.
    pub routes: Read<Vec<PodRoute>>,
    /// BIRD.
    pub bird: Read<Bird>,
    /// The raw texts, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dump: Option<Dump>,
}

/// Gathers the node's report; `dump` adds the raw texts.
pub async fn gather(sources: &Sources, dump: bool) -> NodeReport {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let node_ns = flock_netns::NodeNs::current();
    let host_ifs: Read<Vec<String>> = flock_netns::list_host_ifaces(&node_ns)
        .await
        .map(|l| l.into_iter().map(|i| i.name).collect())
        .into();
    let routes: Read<Vec<PodRoute>> = flock_netns::host_routes(&node_ns)
        .await
        .map(|r| {
            r.into_iter()
                .map(|r| PodRoute {
                    dst: r.dst,
                    host_ifs: r.host_ifs,
                })
                .collect()
        })
        .into();
    let store = match Store::read(&sources.state_dir) {
        Ok(records) => Read::Ok(
            records
                .into_iter()
                .map(|record| attachment(record, &boot_id, host_ifs.ok()))
                .collect(),
        ),
        Err(e) => Read::Error(format!(
            "the store in {}: {}",
            sources.state_dir.display(),
            flock_cni_proto::error::cause_chain(&e)
        )),
    };
    let readiness = http_get(sources.metrics_addr, "/readyz")
        .await
        .map(|(status, body)| Readiness {
            ready: status == 200,
            body: body.trim().to_owned(),
        })
        .into();
    let bird = bird(sources).await;
    let dump = match dump {
        true => Some(gather_dump(sources).await),
        false => None,
    };
    NodeReport {
        node: sources.node.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        boot_id,
        readiness,
        store,
        host_ifs,
        routes,
        bird,
        dump,
    }
}

/// A record and its presence on the node.
fn attachment(
    record: AllocationRecord,
    boot_id: &str,
    host_ifs: Option<&Vec<String>>,
) -> StoredAttachment {
    let netns_exists = !record.netns.is_empty() && Path::new(&record.netns).exists();
    let host_if_exists = host_ifs.is_some_and(|l| l.contains(&record.host_if));
    let on_node = match disposition(&record, boot_id, netns_exists) {
        Disposition::Keep => true,
        // An ADD in flight (or one a crash left, which start-up undoes): its pod is on the
        // node as long as its namespace is.
        Disposition::UndoPending => netns_exists,
        Disposition::Release(_) => false,
    };
    StoredAttachment {
        record,
        netns_exists,
        host_if_exists,
        on_node,
    }
}

async fn bird(sources: &Sources) -> Read<Bird> {
    let all = match birdc(sources, &["show", "protocols", "all"]).await {
        Ok(text) => text,
        Err(e) => return Read::Error(e),
    };
    let details = match flock_bird::parse_show_protocols_all(&all) {
        Ok(d) => d,
        Err(e) => return Read::Error(e.to_string()),
    };
    let mut sessions = Vec::new();
    for detail in details.into_iter().filter(|d| d.row.is_bgp()) {
        let name = detail.row.name.clone();
        let announced = routes(sources, &["show", "route", "export", &name]).await;
        let learned = routes(sources, &["show", "route", "protocol", &name]).await;
        sessions.push(Session {
            detail,
            announced,
            learned,
        });
    }
    let bfd = match birdc(sources, &["show", "bfd", "sessions"]).await {
        Ok(text) => flock_bird::parse_show_bfd_sessions(&text).into(),
        Err(e) => Read::Error(e),
    };
    Read::Ok(Bird { sessions, bfd })
}

async fn routes(sources: &Sources, args: &[&str]) -> Read<Vec<IpNet>> {
    match birdc(sources, args).await {
        Ok(text) => flock_bird::parse_show_route(&text).into(),
        Err(e) => Read::Error(e),
    }
}

/// `birdc -s SOCKET ARGS…`, within [`ANSWER_TIMEOUT`].
async fn birdc(sources: &Sources, args: &[&str]) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new(&sources.birdc);
    cmd.arg("-s").arg(&sources.bird_socket).args(args);
    let what = format!(
        "{} -s {} {}",
        sources.birdc.display(),
        sources.bird_socket.display(),
        args.join(" ")
    );
    let text = run(cmd, &what).await?;
    // birdc exits 0 after printing a server error such as "Unable to connect"
    if text.lines().any(|l| l.starts_with("Unable to connect")) {
        return Err(format!("{what}: {}", text.trim()));
    }
    Ok(text)
}

/// Runs `cmd` within [`ANSWER_TIMEOUT`]: its stdout, or an error naming `what` and why.
async fn run(mut cmd: tokio::process::Command, what: &str) -> Result<String, String> {
    cmd.kill_on_drop(true)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().map_err(|e| format!("{what}: {e}"))?;
    match tokio::time::timeout(ANSWER_TIMEOUT, child.wait_with_output()).await {
        Err(_) => Err(format!(
            "{what}: no answer in {} s",
            ANSWER_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Ok(Ok(out)) if !out.status.success() => Err(format!(
            "{what}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(Ok(out)) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
    }
}

/// `GET PATH` on the agent's HTTP endpoint (HTTP/1.0, so the body is not chunked): the
/// status code and the body.
async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let what = format!("GET http://{addr}{path}");
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await?;
        Ok::<_, std::io::Error>(reply)
    };
    let reply = match tokio::time::timeout(ANSWER_TIMEOUT, exchange).await {
        Err(_) => {
            return Err(format!(
                "{what}: no answer in {} s",
                ANSWER_TIMEOUT.as_secs()
            ));
        }
        Ok(Err(e)) => return Err(format!("{what}: {e}")),
        Ok(Ok(reply)) => String::from_utf8_lossy(&reply).into_owned(),
    };
    parse_http_reply(&reply).ok_or_else(|| format!("{what}: not an HTTP reply: {reply:?}"))
}

/// The status code and body of an HTTP/1.x reply.
fn parse_http_reply(reply: &str) -> Option<(u16, String)> {
    let (head, body) = reply.split_once("\r\n\r\n")?;
    let status = head
        .lines()
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((status, body.to_owned()))
}

async fn gather_dump(sources: &Sources) -> Dump {
    let bird_config = std::fs::read_to_string(&sources.bird_config)
        .map_err(|e| format!("{}: {e}", sources.bird_config.display()))
        .into();
    let bird_protocols = birdc(sources, &["show", "protocols", "all"]).await.into();
    let bird_routes = birdc(sources, &["show", "route", "all"]).await.into();
    let mut ip = String::new();
    let mut ip_errors = Vec::new();
    for args in [
        &["-d", "link", "show"][..],
        &["addr", "show"],
        &["rule", "show"],
        &["-6", "rule", "show"],
        &["route", "show", "table", "all"],
        &["-6", "route", "show", "table", "all"],
    ] {
        let mut cmd = tokio::process::Command::new(&sources.ip);
        cmd.args(args);
        let what = format!("ip {}", args.join(" "));
        match run(cmd, &what).await {
            Ok(text) => ip.push_str(&format!("# {what}\n{text}\n")),
            Err(e) => ip_errors.push(e),
        }
    }
    let ip = match ip_errors.is_empty() {
        true => Read::Ok(ip),
        false => Read::Error(ip_errors.join("; ")),
    };
    let mut nft = tokio::process::Command::new(&sources.nft);
    nft.args(["list", "ruleset"]);
    let nft = run(nft, &format!("{} list ruleset", sources.nft.display()))
        .await
        .into();
    let metrics = http_get(sources.metrics_addr, "/metrics")
        .await
        .map(|(_, body)| body)
        .into();
    Dump {
        bird_config,
        bird_protocols,
        bird_routes,
        ip,
        nft,
        metrics,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_http_reply() {
        let reply = "HTTP/1.0 503 Service Unavailable\r\ncontent-length: 14\r\n\r\nbgp: 0 of 1 up";
        assert_eq!(
            parse_http_reply(reply),
            Some((503, "bgp: 0 of 1 up".to_owned()))
        );
        assert_eq!(parse_http_reply("garbage"), None);
    }

    #[test]
    fn a_source_that_cannot_be_read_serialises_as_its_error() {
        let r: Read<u32> = Err::<u32, _>("no answer in 3 s").into();
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"error":"no answer in 3 s"}"#
        );
        let r: Read<u32> = Read::Ok(7);
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"ok":7}"#);
    }
}
