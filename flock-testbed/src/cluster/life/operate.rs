//! `life operate`: `kubectl flock`, as an operator runs it — through `kubectl`, which finds
//! the plugin on `PATH`, with the admin's kubeconfig — against the cluster, each command's
//! output into the report:
//!
//! - **status** healthy (exit 0); with node2's BIRD frozen (SIGSTOP), naming node2 and its
//!   session (exit 1); with node1's agent frozen, naming node1 (exit 1); healthy again after.
//! - **bgp** for a node: its sessions, what it announces (its CIDRs) and learns (the other
//!   node's); an unknown node is exit 3.
//! - **ipam check** finding a leak made on purpose: a pod deleted while its node's agent is
//!   stopped, its queued DEL removed (a DEL lost) and its network namespace left behind (a
//!   runtime that forgot its sandbox). While the namespace is there the leak is reported and
//!   `--release` frees nothing; once it is gone, `--release` frees exactly it, and the check
//!   after finds nothing.
//! - **policy explain** for an allowed and a denied flow, each confirmed by a real connection.
//! - **sysdump**: the archive's listing, every node's files in it, nothing it could not get.
//! - Bad input: a namespace without flock (exit 4), an unknown pod (3), a malformed port (2).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{DEMO_NS, StoppedAgent, pid_in, pods, rollout_flock, signal};
use crate::cluster::proc::Place;
use crate::cluster::{CONTROL, NODES, Node, kube, kubectl, kubectl_stdin, node, pki};
use crate::sys;

/// The plugin's binary, which kubectl finds on `PATH` as `kubectl flock`.
pub const PLUGIN: &str = "kubectl-flock";

/// What one run of `kubectl flock …` gave.
pub(super) struct Run {
    line: String,
    pub(super) code: i32,
    pub(super) stdout: String,
    stderr: String,
}

/// `kubectl flock ARGS…` as admin from the control plane's namespace, the plugin found on
/// `PATH` in `bins` (kubectl takes no flag before a plugin's name: the kubeconfig goes in
/// `KUBECONFIG`).
pub(super) fn flock(bins: &Path, args: &[&str]) -> Result<Run> {
    let path = format!(
        "{}:{}",
        bins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Place::Net(CONTROL.to_owned())
        .command(kube::kubectl())
        .env("KUBECONFIG", pki::kubeconfig("admin"))
        .env("PATH", path)
        .arg("flock")
        .args(args)
        .output()
        .context("run kubectl flock")?;
    Ok(Run {
        line: format!("kubectl flock {}", args.join(" ")),
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

impl Run {
    /// Into the report: the command, its exit code and what it printed.
    fn show(&self, out: &mut String) {
        let _ = writeln!(out, "$ {}   # exit {}", self.line, self.code);
        out.push_str(&self.stdout);
        out.push_str(&self.stderr);
        out.push('\n');
    }

    /// A failure unless it exited `code` and printed every one of `wanted`.
    fn expect(&self, code: i32, wanted: &[&str], failures: &mut Vec<String>) {
        let all = format!("{}{}", self.stdout, self.stderr);
        if self.code != code {
            failures.push(format!(
                "`{}` exited {} (wanted {code}): {}",
                self.line,
                self.code,
                all.trim()
            ));
        }
        for w in wanted {
            if !all.contains(w) {
                failures.push(format!(
                    "`{}` does not say {w:?}: {}",
                    self.line,
                    all.trim()
                ));
            }
        }
    }
}

/// Runs `during` with `comm` of `n` frozen, thawing it whatever happens.
fn frozen<T>(n: &Node, comm: &str, during: impl FnOnce() -> Result<T>) -> Result<T> {
    use nix::sys::signal::Signal;
    let pid = pid_in(n, comm)?;
    signal(pid, Signal::SIGSTOP)?;
    let result = during();
    signal(pid, Signal::SIGCONT)?;
    result
}

/// Waits up to `limit` for `status` to be healthy again; the last run.
fn wait_healthy(bins: &Path, limit: Duration) -> Result<Run> {
    let t = Instant::now();
    loop {
        let run = flock(bins, &["status"])?;
        if run.code == 0 || t.elapsed() > limit {
            return Ok(run);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Runs the scenario; its outputs into `out`; returns what missed its goal.
pub(super) fn operate(out: &mut String) -> Result<Vec<String>> {
    // built before the scenarios run (`cluster check`, `cluster life`): none builds itself
    let bins = crate::lab::debug_bins();
    if !bins.join(PLUGIN).exists() {
        bail!(
            "{} is not built (cargo build -p flock-kubectl)",
            bins.join(PLUGIN).display()
        );
    }
    let mut failures = Vec::new();
    let _ = writeln!(
        out,
        "KUBECTL FLOCK (the plugin found by kubectl on PATH, the admin's kubeconfig)\n"
    );

    // status, healthy
    let status = wait_healthy(&bins, Duration::from_secs(60))?;
    status.show(out);
    status.expect(
        0,
        &["all healthy", NODES[0].name, NODES[1].name],
        &mut failures,
    );
    let json = flock(&bins, &["status", "-o", "json"])?;
    match serde_json::from_str::<Value>(&json.stdout) {
        Ok(v) => {
            let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
            if nodes.len() != NODES.len() {
                failures.push(format!("status -o json: {} nodes", nodes.len()));
            }
            for n in &nodes {
                let up = n["sessions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| s["state"] == "Established");
                if !up || n["ipv6"]["used"].as_u64().unwrap_or(0) == 0 {
                    failures.push(format!("status -o json: {n}"));
                }
            }
        }
        Err(e) => failures.push(format!("status -o json does not parse: {e}")),
    }

    // bgp
    let n = &NODES[0];
    let bgp = flock(&bins, &["bgp", n.name])?;
    bgp.show(out);
    bgp.expect(
        0,
        &[n.cidr6, n.cidr4, NODES[1].cidr6, n.gateway, "Established"],
        &mut failures,
    );
    flock(&bins, &["bgp", "node9"])?.expect(3, &["node node9"], &mut failures);

    // status with a frozen BIRD, then a frozen agent
    let frozen_bird = frozen(&NODES[1], "bird", || flock(&bins, &["status"]))?;
    frozen_bird.show(out);
    frozen_bird.expect(
        1,
        &[
            &format!("{}: BIRD does not answer", NODES[1].name),
            NODES[1].gateway,
        ],
        &mut failures,
    );
    let again = wait_healthy(&bins, Duration::from_secs(60))?;
    again.expect(0, &["all healthy"], &mut failures);
    let frozen_agent = frozen(&NODES[0], "flock-agent", || flock(&bins, &["status"]))?;
    frozen_agent.show(out);
    frozen_agent.expect(
        1,
        &[&format!("{}: the agent does not answer", NODES[0].name)],
        &mut failures,
    );
    wait_healthy(&bins, Duration::from_secs(60))?.expect(0, &["all healthy"], &mut failures);

    // bad input
    for (args, code, says) in [
        (&["-n", "default", "status"][..], 4, "no flock here"),
        (
            &["policy", "explain", "demo/nope", "demo/nope2", "80/tcp"],
            3,
            "SRC pod demo/nope",
        ),
        (
            &["policy", "explain", "demo/a", "demo/b", "80/http"],
            2,
            "PORT/PROTO \"80/http\"",
        ),
    ] {
        let run = flock(&bins, args)?;
        run.show(out);
        run.expect(code, &[says], &mut failures);
    }

    leak(&bins, out, &mut failures)?;
    explain(&bins, out, &mut failures)?;
    sysdump(&bins, out, &mut failures)?;
    Ok(failures)
}

/// The pod whose allocation is leaked on purpose.
const LEAKER: &str = "operate-leak";

/// How long the kubelet may take to remove a deleted pod's sandbox: its garbage collector
/// runs once a minute.
const SANDBOX_REMOVAL_LIMIT: Duration = Duration::from_secs(150);

/// Whether `n`'s containerd (its client `ctr`) still has sandbox `id`, as a sandbox or as its
/// pause container.
fn runtime_has_sandbox(ctr: &Path, n: &Node, id: &str) -> Result<bool> {
    let socket = node::containerd_socket(n);
    for what in ["sandboxes", "containers"] {
        let listed = sys::output(
            Command::new(ctr)
                .arg("--address")
                .arg(&socket)
                .args(["-n", "k8s.io", what, "ls"]),
        )?;
        // a table, the ID first on each line
        if listed
            .lines()
            .any(|l| l.split_whitespace().next() == Some(id))
        {
            return Ok(true);
        }
    }
    Ok(false)
}

fn leak(bins: &Path, out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    let n = &NODES[1];
    kubectl_stdin(
        &["apply", "-f", "-"],
        &super::pinned_pod(
            DEMO_NS,
            LEAKER,
            "",
            n.name,
            crate::cluster::images::NET,
            "[sleep, infinity]",
            "",
        ),
    )?;
    kubectl(&[
        "-n",
        DEMO_NS,
        "wait",
        "--for=condition=Ready",
        &format!("pod/{LEAKER}"),
        "--timeout=60s",
    ])?;
    // its record: the container ID and the namespace to leave behind
    let store = node::host_path(n, "/var/lib/flock").context("the node's /var/lib/flock")?;
    let record = super::agent_records(n)?
        .into_iter()
        .find(|r| r["pod"]["name"] == LEAKER)
        .context("no record of the leaking pod")?;
    let cid = record["containerId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let netns = record["netns"].as_str().unwrap_or_default().to_owned();
    let netns_name = Path::new(&netns)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .context("the record's netns has no name")?;

    // the agent stopped, the pod deleted: the shim queues its DEL, which is then lost
    let stopped = StoppedAgent::stop(n)?;
    let made = (|| -> Result<()> {
        kubectl(&[
            "-n",
            "kube-system",
            "wait",
            "--for=delete",
            "pod",
            "-l",
            "app.kubernetes.io/name=flock",
            "--field-selector",
            &format!("spec.nodeName={}", n.name),
            "--timeout=60s",
        ])?;
        kubectl(&[
            "-n",
            DEMO_NS,
            "delete",
            "pod",
            LEAKER,
            "--wait=true",
            "--timeout=60s",
        ])?;
        // the kubelet tears the sandbox down after the pod left the API: wait for its DEL
        let queue = store.join("del-queue");
        let drop_queued = || -> Result<usize> {
            let queued: Vec<PathBuf> = std::fs::read_dir(&queue)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains(&cid)))
                .collect();
            for q in &queued {
                std::fs::remove_file(q).with_context(|| format!("remove {}", q.display()))?;
            }
            Ok(queued.len())
        };
        let t = Instant::now();
        let mut dropped = drop_queued()?;
        while dropped == 0 && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(200));
            dropped = drop_queued()?;
        }
        if dropped == 0 {
            bail!(
                "the shim queued no DEL for {cid} in {} within 60 s",
                queue.display()
            );
        }
        // The runtime must forget the sandbox before its namespace comes back: containerd
        // sends a DEL on every stop of a sandbox it still has (the kubelet's garbage
        // collector stops it again before removing it), and with the agent back that DEL
        // would free the record the check is to find leaked. Each such DEL is queued too,
        // and lost like the first.
        let ctr = kube::ensure_built()?.ctr();
        let t = Instant::now();
        while runtime_has_sandbox(&ctr, n, &cid)? {
            if t.elapsed() > SANDBOX_REMOVAL_LIMIT {
                bail!(
                    "containerd still has sandbox {cid} {} s after its pod was deleted",
                    SANDBOX_REMOVAL_LIMIT.as_secs()
                );
            }
            drop_queued()?;
            std::thread::sleep(Duration::from_millis(500));
        }
        drop_queued()?;
        // the runtime forgot its sandbox but left its namespace
        node::place(n)?.run(&["ip", "netns", "add", &netns_name])?;
        Ok(())
    })();
    stopped.start_again()?;
    made?;
    rollout_flock()?;

    let check = flock(bins, &["ipam", "check"])?;
    check.show(out);
    check.expect(
        1,
        &[
            &format!("leaked      {}", n.name),
            &format!("{DEMO_NS}/{LEAKER}"),
            "its sandbox is still on the node",
        ],
        failures,
    );
    let refused = flock(bins, &["ipam", "check", "--release"])?;
    refused.show(out);
    refused.expect(1, &["released 0"], failures);

    // the namespace is cleaned up at last: the leak becomes releasable
    node::place(n)?.run(&["ip", "netns", "delete", &netns_name])?;
    let found = flock(bins, &["ipam", "check", "-o", "json"])?;
    let leaks: Vec<Value> = serde_json::from_str::<Value>(&found.stdout)
        .map(|v| {
            v["check"]["findings"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .unwrap_or_default();
    if leaks.len() != 1 || leaks[0]["kind"] != "leaked" || leaks[0]["releasable"] != true {
        failures.push(format!(
            "ipam check after the namespace went: not exactly the one releasable leak: {}",
            found.stdout.trim()
        ));
    }
    let release = flock(bins, &["ipam", "check", "--release"])?;
    release.show(out);
    release.expect(
        0,
        &[
            "released 1",
            &format!("{}: container {cid} eth0", n.name),
            "after the release: ",
        ],
        failures,
    );
    if !release.stdout.contains("after the release: 0 records") {
        // the check after must find nothing
        let after = release
            .stdout
            .split("after the release: ")
            .nth(1)
            .unwrap_or("");
        if !after.contains("; 0 findings") {
            failures.push(format!("ipam check after the release: {}", after.trim()));
        }
    }
    Ok(())
}

/// The policy the explanations are about: `web` takes TCP 80 from `anycast` pods only.
const POLICY: &str = "operate-web-from-anycast";

fn explain(bins: &Path, out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{ name: {POLICY}, namespace: {DEMO_NS} }}
spec:
  podSelector: {{ matchLabels: {{ app: web }} }}
  ingress:
    - from: [ {{ podSelector: {{ matchLabels: {{ app: anycast }} }} }} ]
      ports: [ {{ port: 80, protocol: TCP }} ]"
        ),
    )?;
    let result = (|| -> Result<()> {
        let web = pods(DEMO_NS, "app=web")?;
        let anycast = pods(DEMO_NS, "app=anycast")?;
        let (Some(dst), Some(other)) = (
            web.iter().find(|p| p.node == NODES[1].name),
            web.iter().find(|p| p.node == NODES[0].name),
        ) else {
            bail!("no web pod on each node");
        };
        let src = anycast
            .iter()
            .find(|p| p.node == NODES[0].name)
            .context("no anycast pod on node1")?;
        let dst_ip6 = dst
            .ips
            .iter()
            .find(|i| i.contains(':'))
            .context("web's IPv6")?;
        let dst_ip4 = dst
            .ips
            .iter()
            .find(|i| !i.contains(':'))
            .context("web's IPv4")?;
        for (from, to, ipv4, verdict, addr) in [
            (src, dst, false, "accept", dst_ip6.clone()),
            (other, dst, true, "drop", dst_ip4.clone()),
        ] {
            let mut args = vec![
                "policy".to_owned(),
                "explain".to_owned(),
                format!("{DEMO_NS}/{}", from.name),
                format!("{DEMO_NS}/{}", to.name),
                "80/tcp".to_owned(),
            ];
            if ipv4 {
                args.push("-4".into());
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let run = flock(bins, &args)?;
            run.show(out);
            run.expect(0, &[&format!("{verdict}: "), POLICY], failures);
            // the data path agrees (the agents apply the policy within a second)
            let real = super::exec(
                &from.name,
                &format!(
                    "for i in 1 2 3 4 5; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' \
                     | nc -w 2 {addr} 80 2>/dev/null | grep -q '^HTTP/1.1 200' && exit 0; \
                     [ {verdict} = drop ] && exit 1; sleep 1; done; exit 1"
                ),
            );
            let connected = real.is_ok();
            let _ = writeln!(
                out,
                "  (HTTP from {} to {addr} port 80: {})\n",
                from.name,
                if connected { "connected" } else { "refused" }
            );
            if connected != (verdict == "accept") {
                failures.push(format!(
                    "policy explain said {verdict} for {} -> {addr}, but HTTP {}",
                    from.name,
                    if connected {
                        "connected"
                    } else {
                        "did not connect"
                    }
                ));
            }
        }
        Ok(())
    })();
    kubectl(&["-n", DEMO_NS, "delete", "networkpolicy", POLICY])?;
    result
}

fn sysdump(bins: &Path, out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    let file = Path::new(crate::cluster::RUN_DIR).join("operate-sysdump.tar.gz");
    let file_arg = file.to_string_lossy().into_owned();
    let run = flock(bins, &["sysdump", "-o", &file_arg])?;
    run.show(out);
    let mut wanted: Vec<String> = Vec::new();
    for n in &NODES {
        for f in [
            "report.json",
            "store.json",
            "bird.conf",
            "bird-protocols.txt",
            "ip.txt",
            "nftables.txt",
            "metrics.txt",
            "agent.log",
        ] {
            wanted.push(format!("nodes/{}/{f}", n.name));
        }
    }
    wanted.push("cluster/nodeconfigs.yaml".into());
    let wanted: Vec<&str> = wanted.iter().map(String::as_str).collect();
    run.expect(0, &wanted, failures);
    if run.stdout.contains("errors.txt") {
        failures.push("sysdump could not gather everything (errors.txt)".into());
    }
    let listing = sys::output(Command::new("tar").arg("tzf").arg(&file))?;
    if listing.lines().count() < wanted.len() {
        failures.push(format!(
            "sysdump archive holds {} files",
            listing.lines().count()
        ));
    }
    Ok(())
}
