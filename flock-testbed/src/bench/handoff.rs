//! The hand-off floor's stand-in daemon: ADDs through the shim to a process that decodes, sets up and
//! answers and keeps no books, and that daemon itself (the hidden [`HANDOFF_DAEMON`] command).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flock_netns::{NodeNs, PodSpec, setup};

/// A stand-in daemon serving ADDs and DELs of a set of pods, through the shim (`flock` in `bin_dir`)
/// exec'd by the runtime stand-in in the node's namespace with the conflist and the
/// `CNI_ARGS` the bench gives flock's agent, as the bench's runtime makes a subject's ADDs.
/// The daemon is this program again ([`handoff_daemon`]), a process of its own in that
/// namespace, as the agent is. For each call it accepts, reads and decodes the request,
/// parses its configuration, calls `flock_netns::setup` and answers with the CNI result; it
/// takes no lock, allocates nothing and writes no store. So each call's time is an ADD as the
/// runtime sees it, with the exec, the two hand-offs between the shim and a daemon, and the
/// kernel work, and nothing of flock's own bookkeeping: what a CNI of a shim and a node agent
/// (DESIGN §1) that keeps no books reaches on this machine. A DEL is read, decoded and
/// answered with nothing done: flock's agent, too, answers a DEL of a pod without anycast
/// before any kernel work (its veth goes after the answer, with the pod's routes), so what is
/// left is the exec, the hand-offs and the decoding. The stand-in's veths go with their pod
/// namespaces.
pub(super) struct HandOff {
    runtime: flock_testkit::cni::Runtime,
    atts: Vec<flock_testkit::cni::Attachment>,
}

impl HandOff {
    /// Starts a daemon for `specs` from this thread (so in this thread's namespace, which
    /// must be the node's at `node_path`), runs `calls` with it (which makes one ADD of each
    /// pod, in any order, between calls of its own, and a DEL of each if `dels`), and
    /// returns what `calls` returned and the CPU time the daemon used from its first call to
    /// its last, every thread. The daemon ends after the last call it was told of.
    pub(super) fn run<T>(
        specs: &[PodSpec],
        dels: bool,
        node_path: &Path,
        bin_dir: &Path,
        calls: impl FnOnce(&HandOff) -> Result<T>,
    ) -> Result<(T, Duration)> {
        use std::io::{BufRead, Read, Write};
        let exe = std::env::current_exe().context("this program's path")?;
        let dir = std::env::temp_dir().join(format!(
            "flock-bench-handoff-{}-{}",
            std::process::id(),
            specs.first().map_or("none", |s| s.container_id.as_str())
        ));
        let layout = flock_testkit::node::AgentLayout::new(&dir);
        let mut daemon = std::process::Command::new(&exe)
            .arg(HANDOFF_DAEMON)
            .arg(&layout.socket)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("start {} {HANDOFF_DAEMON}", exe.display()))?;
        let outcome = (|| {
            let run_dir = layout.socket.parent().unwrap_or(&dir);
            std::fs::create_dir_all(run_dir)
                .with_context(|| format!("create {}", run_dir.display()))?;
            // How many calls it serves, then the pods, one per line; then the daemon binds its
            // socket and says so.
            let mut pods = format!("{CALLS_LINE}{}\n", specs.len() * if dels { 2 } else { 1 });
            for spec in specs {
                pods.push_str(&handoff_line(spec));
                pods.push('\n');
            }
            let mut stdin = daemon.stdin.take().context("the daemon's stdin")?;
            stdin
                .write_all(pods.as_bytes())
                .context("write to the daemon")?;
            drop(stdin);
            let mut ready = String::new();
            // kept open to the end: the daemon's last line is its CPU time
            let mut said =
                std::io::BufReader::new(daemon.stdout.take().context("the daemon's stdout")?);
            said.read_line(&mut ready).context("read from the daemon")?;
            if ready.trim() != "ready" {
                bail!("the stand-in daemon did not start (it said {ready:?})");
            }
            // its CPU time before the first call: what serving them adds is the difference to
            // the total it reports at its end
            let cpu_before = super::calls::cpu_time(daemon.id())?;
            let hand_off = HandOff {
                runtime: flock_testkit::cni::Runtime::new(
                    layout.conflist("bench-floor"),
                    [bin_dir],
                    dir.join("cni-cache"),
                )?
                .in_netns(node_path),
                atts: specs
                    .iter()
                    .enumerate()
                    .map(|(i, spec)| {
                        super::calls::cri_attachment(
                            spec.container_id.clone(),
                            &spec.netns,
                            &format!("pod-floor-{i}"),
                            i,
                        )
                    })
                    .collect(),
            };
            let made = calls(&hand_off)?;
            let mut last = String::new();
            said.read_to_string(&mut last)
                .context("read the daemon's last line")?;
            let total = last
                .lines()
                .find_map(|l| l.strip_prefix(CPU_LINE))
                .and_then(|ns| ns.trim().parse::<u64>().ok())
                .with_context(|| format!("the stand-in daemon said no {CPU_LINE:?}: {last:?}"))?;
            Ok((made, Duration::from_nanos(total).saturating_sub(cpu_before)))
        })();
        if outcome.is_err() {
            // A daemon that failed has said why on stderr and ended; one that still waits for
            // calls that will not come is stopped.
            std::thread::sleep(Duration::from_millis(200));
            let _ = daemon.kill();
        }
        let ended = daemon.wait_with_output();
        let _ = std::fs::remove_dir_all(&dir);
        let ended = ended.context("wait for the stand-in daemon")?;
        let said = String::from_utf8_lossy(&ended.stderr).trim().to_owned();
        match outcome {
            Err(e) if !said.is_empty() => {
                Err(e.context(format!("the stand-in daemon ({}): {said}", ended.status)))
            }
            Err(e) => Err(e),
            Ok(_) if !ended.status.success() => {
                bail!("the stand-in daemon failed ({}): {said}", ended.status)
            }
            Ok(measured) => Ok(measured),
        }
    }

    /// The ADD of pod `i`, timed.
    pub(super) fn add(&self, i: usize) -> Result<Duration> {
        let att = self.attachment(i)?;
        let t = Instant::now();
        self.call(att)?;
        Ok(t.elapsed())
    }

    /// The DEL of pod `i`, timed.
    pub(super) fn del(&self, i: usize) -> Result<Duration> {
        let att = self.attachment(i)?;
        let t = Instant::now();
        self.runtime
            .del(att)
            .with_context(|| format!("DEL of {} to the stand-in daemon", att.container_id))?;
        Ok(t.elapsed())
    }

    fn attachment(&self, i: usize) -> Result<&flock_testkit::cni::Attachment> {
        self.atts
            .get(i)
            .with_context(|| format!("the stand-in daemon has no pod {i}"))
    }

    /// The ADDs of the pods of `range` from `threads` threads, as the bench's runtime makes
    /// a subject's: their wall time.
    pub(super) fn burst(&self, range: std::ops::Range<usize>, threads: usize) -> Result<Duration> {
        let atts = self.atts.get(range.clone()).with_context(|| {
            format!(
                "the stand-in daemon has no pods {range:?} (it has {})",
                self.atts.len()
            )
        })?;
        let (_, wall) = super::calls::concurrently(atts, threads, |att| self.call(att))?;
        Ok(wall)
    }

    fn call(&self, att: &flock_testkit::cni::Attachment) -> Result<()> {
        self.runtime
            .add(att)
            .map(drop)
            .with_context(|| format!("ADD of {} to the stand-in daemon", att.container_id))
    }
}

/// What the stand-in daemon prints last: its CPU time in nanoseconds, every thread.
const CPU_LINE: &str = "cpu_ns ";

/// The first line the stand-in daemon reads: how many calls it serves before it ends.
const CALLS_LINE: &str = "calls ";

/// The hidden command that runs the stand-in daemon of `HandOff`.
pub const HANDOFF_DAEMON: &str = "__bench-handoff-daemon";

/// A pod as [`HandOff`] tells the daemon of it: container, host veth, namespace and
/// addresses (comma-separated), separated by spaces.
fn handoff_line(spec: &PodSpec) -> String {
    let addresses: Vec<String> = spec.addresses.iter().map(ToString::to_string).collect();
    format!(
        "{} {} {} {}",
        spec.container_id,
        spec.host_if,
        spec.netns.display(),
        addresses.join(",")
    )
}

/// The pod of a line of [`handoff_line`].
fn parse_handoff_line(line: &str) -> Result<PodSpec> {
    let fields: Vec<&str> = line.split(' ').collect();
    let [container_id, host_if, netns, addresses] = fields[..] else {
        bail!("a pod line {line:?}: not four fields");
    };
    let addresses = addresses
        .split(',')
        .map(|a| {
            a.parse()
                .with_context(|| format!("a pod line {line:?}: address {a:?}"))
        })
        .collect::<Result<_>>()?;
    Ok(PodSpec {
        container_id: container_id.to_owned(),
        netns: netns.into(),
        if_name: "eth0".into(),
        host_if: host_if.to_owned(),
        mtu: 1500,
        addresses,
        anycast: vec![],
        default_route: true,
        routes: vec![],
    })
}

/// The stand-in daemon of `HandOff`: `args` is its socket; stdin says how many calls it
/// serves ([`CALLS_LINE`]) and lists the pods, one [`handoff_line`] each. Binds the socket,
/// prints `ready`, serves that many calls, each as a task of its own (as the agent does) on
/// a one-thread runtime (as the agent's), and ends. A call that fails is printed on stderr
/// at once, and ends the daemon.
pub fn handoff_daemon(args: &[String]) -> Result<()> {
    use std::io::{Read, Write};
    let [socket] = args else {
        bail!("usage: xtask {HANDOFF_DAEMON} SOCKET, the pods on stdin");
    };
    let mut lines = String::new();
    std::io::stdin()
        .read_to_string(&mut lines)
        .context("read the pods")?;
    let mut lines = lines.lines();
    let calls: usize = lines
        .next()
        .and_then(|l| l.strip_prefix(CALLS_LINE))
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("the first line does not say {CALLS_LINE:?} and a count"))?;
    let by_id: std::collections::HashMap<String, PodSpec> = lines
        .map(|line| parse_handoff_line(line).map(|spec| (spec.container_id.clone(), spec)))
        .collect::<Result<_>>()?;
    let by_id = std::sync::Arc::new(by_id);
    let listener =
        std::os::unix::net::UnixListener::bind(socket).with_context(|| format!("bind {socket}"))?;
    listener
        .set_nonblocking(true)
        .context("a non-blocking listener")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async {
        let listener = tokio::net::UnixListener::from_std(listener).context("the listener")?;
        // The node's netlink socket opened before the first call, as the agent's is by its
        // reconcile at start, which lists the host's veths.
        let node = std::sync::Arc::new(NodeNs::current());
        flock_netns::list_host_ifaces(&node)
            .await
            .context("list the node's veths")?;
        let mut stdout = std::io::stdout();
        writeln!(stdout, "ready").and_then(|()| stdout.flush())?;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..calls {
            let (stream, _) = listener.accept().await.context("accept")?;
            let (node, by_id) = (node.clone(), by_id.clone());
            tasks.spawn(async move {
                let served = serve(&node, &by_id, stream).await;
                if let Err(e) = &served {
                    eprintln!("{e:#}");
                }
                served
            });
            while let Some(served) = tasks.try_join_next() {
                served.context("a call panicked")??;
            }
        }
        while let Some(served) = tasks.join_next().await {
            served.context("a call panicked")??;
        }
        let cpu = super::calls::cpu_time(std::process::id())?;
        writeln!(stdout, "{CPU_LINE}{}", cpu.as_nanos()).and_then(|()| stdout.flush())?;
        Ok(())
    })
}

/// One call of the stand-in daemon of [`HandOff`]: an ADD or a DEL.
async fn serve(
    node: &NodeNs,
    specs: &std::collections::HashMap<String, PodSpec>,
    mut stream: tokio::net::UnixStream,
) -> Result<()> {
    use flock_cni_proto::{CniResult, Interface, IpConfig, IpPrefix, Route};
    use flock_rpc::rpc::{self, LineDecoder, Response};
    use tokio::io::AsyncReadExt;
    let mut decoder = LineDecoder::new();
    let mut buf = [0u8; 16 * 1024];
    let line = loop {
        if let Some(line) = decoder.next_line()? {
            break line;
        }
        let n = stream.read(&mut buf).await.context("read the request")?;
        if n == 0 {
            bail!("the shim closed its connection before a whole request");
        }
        decoder.push(&buf[..n]);
    };
    let req = rpc::decode_request(&line)?;
    let conf = flock_cni_proto::NetConf::from_value(&req.config)
        .and_then(|c| flock_rpc::FlockNetConf::from_netconf(&c))
        .map_err(|e| anyhow::anyhow!("the request's configuration: {e}"))?;
    let Some(spec) = specs.get(&req.container_id) else {
        bail!(
            "a request for {:?}, not a pod of the floor",
            req.container_id
        );
    };
    match req.op {
        rpc::Op::Add => {}
        rpc::Op::Del => return answer(stream, &Response::done()).await,
        op => bail!(
            "a {op:?} of {}: the floor serves ADD and DEL",
            spec.container_id
        ),
    }
    let done = setup(node, spec)
        .await
        .with_context(|| format!("setup of {}", spec.container_id))?;
    // The shape of the agent's result (`flock_agent::agent::result::cni_result`).
    let mut result = CniResult {
        interfaces: vec![
            Interface {
                name: done.host_if,
                mac: Some(done.host_mac),
                mtu: Some(spec.mtu),
                ..Interface::default()
            },
            Interface {
                name: done.pod_if,
                mac: Some(done.pod_mac),
                mtu: Some(spec.mtu),
                sandbox: Some(req.netns.clone()),
                ..Interface::default()
            },
        ],
        ..CniResult::default()
    };
    for a in &spec.addresses {
        let (gateway, any) = if a.addr().is_ipv6() {
            (
                std::net::IpAddr::V6(flock_netns::GATEWAY6),
                std::net::Ipv6Addr::UNSPECIFIED.into(),
            )
        } else {
            (
                std::net::IpAddr::V4(flock_netns::GATEWAY4),
                std::net::Ipv4Addr::UNSPECIFIED.into(),
            )
        };
        result.ips.push(IpConfig {
            address: IpPrefix::new(a.addr(), a.prefix_len())?,
            gateway: Some(gateway),
            interface: Some(1),
        });
        result
            .routes
            .push(Route::via(IpPrefix::new(any, 0)?, Some(gateway)));
    }
    answer(stream, &Response::ok(result.to_value(conf.cni_version))).await
}

async fn answer(
    mut stream: tokio::net::UnixStream,
    response: &flock_rpc::rpc::Response,
) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    stream
        .write_all(&flock_rpc::rpc::encode_line(response))
        .await
        .context("write the answer")?;
    let _ = stream.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::floor::floor_spec;
    use super::*;

    #[test]
    fn the_hand_off_daemon_reads_back_the_pods_it_is_told_of() {
        let spec = floor_spec(4097, "/run/netns/bfpod-x".into());
        let line = handoff_line(&spec);
        assert_eq!(parse_handoff_line(&line).expect("parse"), spec);
        let e = parse_handoff_line("floor-1 veth /run/netns/p 2001:db8::1/128,nope")
            .expect_err("a bad address");
        assert!(format!("{e:#}").contains(r#"address "nope""#), "{e:#}");
        let e = parse_handoff_line("floor-1 veth").expect_err("two fields");
        assert!(format!("{e:#}").contains("not four fields"), "{e:#}");
    }
}
