//! Policy decisions a person can see. A namespace annotated [`ANNOTATION`] has the chains of
//! its pods log the new connections they deny (`deny`) or every new connection they judge
//! (`all`) to nfnetlink_log ([`super::nflog`]); the agent reads each packet back, limits the
//! lines per pod ([`Limiter`]), asks the policy model which rule decided, and writes one
//! JSON line to a node-local file with rotation ([`LogFile`]) and to its own log, and counts
//! it per policy and verdict.
//!
//! Decided purely here: the annotation's values, the prefixes the table logs with, the rate
//! limit, the line, the rotation. The socket thread and the task live in [`spawn`].

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use flock_policy::{Direction, LogMode, Transport, parse_log_prefix};
use serde::Serialize;
use tracing::{info, warn};

use super::nflog::{self, LoggedPacket};
use crate::metrics::{Component, DecisionLabels, Health, Metrics, ReasonLabels};

/// The namespace annotation that turns logging on for its pods: `deny` logs the new
/// connections their policies deny, `all` every new connection a policy judges.
pub const ANNOTATION: &str = "flock.fritzlab.net/policy-log";

/// The log mode an annotation value asks for; the error names the annotation and the value.
pub fn log_mode(value: &str) -> Result<LogMode, String> {
    match value.trim() {
        "deny" => Ok(LogMode::Deny),
        "all" => Ok(LogMode::All),
        other => Err(format!(
            "annotation {ANNOTATION}: {other:?} is neither \"deny\" nor \"all\""
        )),
    }
}

/// Lines per pod: a token bucket each, `rate` a second up to `burst`; what is over is
/// counted, and the next line written for the pod says how many were left out.
#[derive(Debug)]
pub struct Limiter {
    rate: f64,
    burst: f64,
    buckets: HashMap<String, Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    left_out: u64,
}

impl Limiter {
    /// A limiter of `rate` lines a second per pod, with bursts of `burst`.
    pub fn new(rate: u32, burst: u32) -> Limiter {
        Limiter {
            rate: f64::from(rate),
            burst: f64::from(burst.max(1)),
            buckets: HashMap::new(),
        }
    }

    /// Whether `pod` may have a line at `now`: `Some(n)` with the lines left out since its
    /// last one, or `None` when it is over its rate.
    pub fn admit(&mut self, pod: &str, now: Instant) -> Option<u64> {
        let bucket = self
            .buckets
            .entry(pod.to_owned())
            .or_insert_with(|| Bucket {
                tokens: self.burst,
                at: now,
                left_out: 0,
            });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Some(std::mem::take(&mut bucket.left_out))
        } else {
            bucket.left_out += 1;
            None
        }
    }

    /// Forgets the pods whose buckets have been full for a while (no line in `idle`).
    pub fn prune(&mut self, now: Instant, idle: Duration) {
        self.buckets
            .retain(|_, b| b.left_out > 0 || now.saturating_duration_since(b.at) < idle);
    }
}

/// One decision as written: a JSON object on one line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// When the agent read it (RFC 3339, UTC).
    pub time: String,
    /// When the kernel logged the packet, if it carried a timestamp.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packet_time: Option<String>,
    /// `allow` or `deny`.
    pub verdict: &'static str,
    /// The side whose policies decided: `ingress` (of the destination pod) or `egress` (of
    /// the source pod).
    pub direction: &'static str,
    /// Source address.
    pub src: IpAddr,
    /// The source pod, `namespace/name`, when the address is a pod's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub src_pod: Option<String>,
    /// Destination address (a Service's backend: after kube-proxy's translation).
    pub dst: IpAddr,
    /// The destination pod, when the address is a pod's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst_pod: Option<String>,
    /// `tcp`, `udp`, `sctp`, `icmp`, `icmpv6` or the protocol number.
    pub protocol: String,
    /// The destination port (TCP, UDP, SCTP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The rule that decided, or why nothing allowed it.
    pub decided_by: String,
    /// The policy that decided (`networkpolicy NS/NAME`, `clusternetworkpolicy NAME`), or
    /// `none`: the metric's label.
    pub policy: String,
    /// Lines of the same pod left out by the rate limit since its previous line.
    #[serde(skip_serializing_if = "is_zero")]
    pub left_out: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `protocol` and `port` of a decision line.
pub fn protocol_and_port(transport: Transport) -> (String, Option<u16>) {
    match transport {
        Transport::Tcp(p) => ("tcp".into(), Some(p)),
        Transport::Udp(p) => ("udp".into(), Some(p)),
        Transport::Sctp(p) => ("sctp".into(), Some(p)),
        Transport::Icmp { .. } => ("icmp".into(), None),
        Transport::Icmpv6 { .. } => ("icmpv6".into(), None),
        Transport::Other(n) => (n.to_string(), None),
    }
}

/// A file of decision lines, rotated by size: `policy.log` becomes `policy.log.1`, and so on
/// up to `keep` old files; the oldest goes.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: Option<File>,
    size: u64,
}

impl LogFile {
    /// A log at `path`, rotated at `max_bytes`, keeping `keep` old files. Nothing is opened
    /// before the first line.
    pub fn new(path: impl Into<PathBuf>, max_bytes: u64, keep: u32) -> LogFile {
        LogFile {
            path: path.into(),
            max_bytes,
            keep,
            file: None,
            size: 0,
        }
    }

    /// The current file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line, rotating first when it would pass the size.
    pub fn write_line(&mut self, line: &str) -> std::io::Result<()> {
        let len = line.len() as u64 + 1;
        if self.file.is_some() && self.size + len > self.max_bytes {
            self.rotate()?;
        }
        if self.file.is_none() {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
            self.size = file.metadata()?.len();
            self.file = Some(file);
            if self.size > 0 && self.size + len > self.max_bytes {
                self.rotate()?;
                return self.write_line(line);
            }
        }
        let file = self.file.as_mut().expect("opened above");
        file.write_all(format!("{line}\n").as_bytes())?;
        self.size += len;
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.file = None;
        let numbered = |n: u32| PathBuf::from(format!("{}.{n}", self.path.display()));
        if self.keep == 0 {
            return std::fs::remove_file(&self.path);
        }
        for n in (1..self.keep).rev() {
            match std::fs::rename(numbered(n), numbered(n + 1)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(&self.path, numbered(1))
    }
}

/// What the policy model says about a logged flow (the enforcer answers from the ruleset in
/// force). Two questions, so that a packet over its pod's rate costs one pod lookup and no
/// explanation.
pub trait Describe: Send + Sync {
    /// The pod with `addr`, `namespace/name`.
    fn pod_at(&self, addr: IpAddr) -> Option<String>;
    /// The rule that decided `direction`'s side of the flow (or why nothing allowed it), and
    /// the deciding policy, or `none`.
    fn decided_by(
        &self,
        src: IpAddr,
        dst: IpAddr,
        transport: Transport,
        direction: Direction,
    ) -> (String, String);
}

/// Where decision lines go and how many.
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// The node-local file (`/var/log/flock/policy.log`).
    pub path: PathBuf,
    /// Rotation size.
    pub max_bytes: u64,
    /// Old files kept.
    pub keep: u32,
    /// Lines per pod and second.
    pub rate: u32,
    /// Burst of lines per pod.
    pub burst: u32,
}

impl Default for LogOptions {
    fn default() -> LogOptions {
        LogOptions {
            path: PathBuf::from("/var/log/flock/policy.log"),
            max_bytes: 10 << 20,
            keep: 3,
            rate: 10,
            burst: 20,
        }
    }
}

/// Turns logged packets into lines: rate limit, description, file, log and metrics.
pub struct DecisionLog {
    limiter: Limiter,
    file: LogFile,
    describe: Arc<dyn Describe>,
    metrics: Arc<Metrics>,
}

impl DecisionLog {
    /// A decision log with `options`, describing flows with `describe`.
    pub fn new(
        options: &LogOptions,
        describe: Arc<dyn Describe>,
        metrics: Arc<Metrics>,
    ) -> DecisionLog {
        DecisionLog {
            limiter: Limiter::new(options.rate, options.burst),
            file: LogFile::new(&options.path, options.max_bytes, options.keep),
            describe,
            metrics,
        }
    }

    /// The line for one logged packet, written; `None` when it is not flock's, cannot be
    /// read, or is over its pod's rate.
    pub fn take(&mut self, packet: &LoggedPacket, now: Instant) -> Option<Decision> {
        let (allowed, direction) = parse_log_prefix(&packet.prefix)?;
        let (src, dst, transport) = nflog::flow(&packet.payload)?;
        // the pod whose chain decided: its lines are limited together
        let (side_addr, other_addr) = match direction {
            Direction::Ingress => (dst, src),
            Direction::Egress => (src, dst),
        };
        let side_pod = self.describe.pod_at(side_addr);
        let key = side_pod.clone().unwrap_or_else(|| side_addr.to_string());
        let Some(left_out) = self.limiter.admit(&key, now) else {
            self.unwritten("rate");
            return None;
        };
        let other_pod = self.describe.pod_at(other_addr);
        let (src_pod, dst_pod) = match direction {
            Direction::Ingress => (other_pod, side_pod),
            Direction::Egress => (side_pod, other_pod),
        };
        let (decided_by, policy) = self.describe.decided_by(src, dst, transport, direction);
        let verdict = if allowed { "allow" } else { "deny" };
        let (protocol, port) = protocol_and_port(transport);
        let rfc3339 = |t: SystemTime| {
            k8s_openapi::jiff::Timestamp::try_from(t)
                .map(|t| t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string())
                .ok()
        };
        let decision = Decision {
            time: rfc3339(SystemTime::now()).unwrap_or_default(),
            packet_time: packet.at.and_then(rfc3339),
            verdict,
            direction: direction.as_str(),
            src,
            src_pod,
            dst,
            dst_pod,
            protocol,
            port,
            decided_by,
            policy,
            left_out,
        };
        self.metrics
            .policy_decisions
            .get_or_create(&DecisionLabels {
                policy: decision.policy.clone(),
                verdict: verdict.to_owned(),
            })
            .inc();
        let line = serde_json::to_string(&decision).unwrap_or_default();
        info!(target: "flock_agent::policy::decision", "{line}");
        if let Err(e) = self.file.write_line(&line) {
            warn!(path = %self.file.path().display(), error = %e, "cannot write the policy decision log");
        }
        Some(decision)
    }

    /// Counts packets the kernel dropped before this reader saw them.
    pub fn lost(&self) {
        self.unwritten("lost");
    }

    fn unwritten(&self, reason: &str) {
        self.metrics
            .policy_decisions_unwritten
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Forgets idle pods' rate buckets.
    pub fn prune(&mut self, now: Instant) {
        self.limiter.prune(now, Duration::from_secs(60));
    }
}

/// Reads flock's nfnetlink_log group from `socket` on a thread of its own and writes each
/// packet's line through `log`, until the socket fails for good.
pub fn spawn(mut socket: nflog::NflogSocket, mut log: DecisionLog) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("policy-log".into())
        .spawn(move || {
            let mut pruned = Instant::now();
            loop {
                match socket.recv() {
                    Ok(packets) => {
                        let now = Instant::now();
                        for p in &packets {
                            log.take(p, now);
                        }
                        if now.duration_since(pruned) > Duration::from_secs(60) {
                            log.prune(now);
                            pruned = now;
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOBUFS as i32) => {
                        log.lost()
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        warn!(error = %e, "the policy decision log stopped reading");
                        return;
                    }
                }
            }
        })
        .expect("spawn the policy-log thread")
}

/// Starts logging the decisions of `enforcer`'s ruleset in `netns` (the node's namespace):
/// binds flock's nfnetlink_log group there and reads it on a thread of its own. When the
/// group cannot be bound (another program holds it), nothing is logged and `/readyz` notes
/// why.
pub async fn start(
    enforcer: &Arc<super::PolicyEnforcer>,
    options: &LogOptions,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
    netns: &flock_netns::NsTarget,
) {
    let open = || nflog::NflogSocket::open(flock_policy::LOG_GROUP);
    let socket = match netns {
        flock_netns::NsTarget::Current => open(),
        flock_netns::NsTarget::Path(path) => flock_netns::blocking_in_netns(path, open)
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string()))),
    };
    match socket {
        Ok(socket) => {
            let describe: Arc<dyn Describe> = enforcer.clone();
            spawn(socket, DecisionLog::new(options, describe, metrics.clone()));
            info!(path = %options.path.display(), group = flock_policy::LOG_GROUP, "policy decision log ready");
        }
        Err(e) => {
            let why = format!(
                "cannot bind nfnetlink_log group {}: {e}; policy decisions are not logged",
                flock_policy::LOG_GROUP
            );
            warn!("{why}");
            health.set_note(Component::PolicyLog, Some(why));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_values() {
        assert_eq!(log_mode("deny"), Ok(LogMode::Deny));
        assert_eq!(log_mode(" all "), Ok(LogMode::All));
        assert_eq!(
            log_mode("yes"),
            Err(
                "annotation flock.fritzlab.net/policy-log: \"yes\" is neither \"deny\" nor \"all\""
                    .into()
            )
        );
    }

    #[test]
    fn the_limiter_gives_a_pod_its_burst_then_its_rate_and_counts_the_rest() {
        let mut l = Limiter::new(2, 3);
        let t0 = Instant::now();
        assert_eq!(
            (0..3).map(|_| l.admit("a/x", t0)).collect::<Vec<_>>(),
            [Some(0); 3]
        );
        assert_eq!(l.admit("a/x", t0), None);
        assert_eq!(l.admit("a/x", t0), None);
        assert_eq!(
            l.admit("a/y", t0),
            Some(0),
            "another pod has its own bucket"
        );
        // half a second at 2/s: one more, which says two were left out
        assert_eq!(l.admit("a/x", t0 + Duration::from_millis(500)), Some(2));
        assert_eq!(l.admit("a/x", t0 + Duration::from_millis(500)), None);
        l.prune(t0 + Duration::from_secs(120), Duration::from_secs(60));
        assert!(
            l.buckets.contains_key("a/x"),
            "a pod with lines left out is kept"
        );
        assert!(!l.buckets.contains_key("a/y"));
    }

    #[test]
    fn the_file_rotates_by_size_and_keeps_its_old_files() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("log/policy.log");
        let mut f = LogFile::new(&path, 20, 2);
        for i in 0..7 {
            f.write_line(&format!("line {i} xxxxx")).expect("write"); // 13 bytes + newline
        }
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        assert_eq!(read(&path), "line 6 xxxxx\n");
        assert_eq!(read(&dir.path().join("log/policy.log.1")), "line 5 xxxxx\n");
        assert_eq!(read(&dir.path().join("log/policy.log.2")), "line 4 xxxxx\n");
        assert!(!dir.path().join("log/policy.log.3").exists());
        // a restarted agent appends to what is there, and rotates when it is full
        let mut again = LogFile::new(&path, 20, 2);
        again.write_line("line 7 xxxxx").expect("write");
        assert_eq!(read(&path), "line 7 xxxxx\n");
        assert_eq!(read(&dir.path().join("log/policy.log.1")), "line 6 xxxxx\n");
    }

    fn packet(prefix: &str) -> LoggedPacket {
        let mut p = vec![0x60, 0, 0, 0, 0, 20, 6, 64];
        p.extend_from_slice(
            &"2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        p.extend_from_slice(
            &"2001:db8::2"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        p.extend_from_slice(&[0x9c, 0x40, 0, 80]);
        p.extend_from_slice(&[0; 16]);
        LoggedPacket {
            prefix: prefix.into(),
            at: None,
            payload: p,
        }
    }

    #[test]
    fn a_logged_packet_becomes_a_line_in_the_file_and_the_metrics() {
        let dir = tempfile::tempdir().expect("tmp");
        let options = LogOptions {
            path: dir.path().join("policy.log"),
            rate: 1,
            burst: 1,
            ..LogOptions::default()
        };
        /// Pods `a/ADDR` (the source) and `b/ADDR`.
        struct Fake;
        impl Describe for Fake {
            fn pod_at(&self, addr: IpAddr) -> Option<String> {
                let ns = if addr == "2001:db8::1".parse::<IpAddr>().unwrap() {
                    "a"
                } else {
                    "b"
                };
                Some(format!("{ns}/{addr}"))
            }
            fn decided_by(
                &self,
                _: IpAddr,
                _: IpAddr,
                _: Transport,
                direction: Direction,
            ) -> (String, String) {
                assert_eq!(direction, Direction::Ingress);
                (
                    "no NetworkPolicy selecting b/web allows it".into(),
                    "none".into(),
                )
            }
        }
        let metrics = Arc::new(Metrics::new());
        let mut log = DecisionLog::new(&options, Arc::new(Fake), metrics.clone());
        let now = Instant::now();
        assert_eq!(
            log.take(&packet("kube-router deny"), now),
            None,
            "not flock's"
        );
        let d = log
            .take(&packet("flock deny ingress"), now)
            .expect("a line");
        assert_eq!(
            (d.verdict, d.direction, d.port),
            ("deny", "ingress", Some(80))
        );
        assert_eq!(
            log.take(&packet("flock deny ingress"), now),
            None,
            "over the rate"
        );
        let line = std::fs::read_to_string(&options.path).expect("file");
        let v: serde_json::Value = serde_json::from_str(line.trim()).expect("json");
        assert_eq!(v["srcPod"], "a/2001:db8::1");
        assert_eq!(v["dstPod"], "b/2001:db8::2");
        assert_eq!(v["protocol"], "tcp");
        assert_eq!(v["decidedBy"], "no NetworkPolicy selecting b/web allows it");
        let text = metrics.encode();
        assert!(
            text.contains("flock_policy_decisions_total{policy=\"none\",verdict=\"deny\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("flock_policy_decisions_unwritten_total{reason=\"rate\"} 1"),
            "{text}"
        );
    }
}
