//! The security life test: what flock's own pods may do, and what an ordinary pod on a node
//! and a router sending more than it should cannot make flock do.
//!
//! - **privileges**: each of flock's processes as the kernel shows it (`/proc/PID/status`,
//!   `mountinfo`): its capabilities, seccomp mode, `no_new_privs`, user and root filesystem,
//!   beside what its pod asks for. Goal: the agent holds NET_ADMIN and SYS_ADMIN and nothing
//!   else, BIRD NET_ADMIN and NET_BIND_SERVICE, the controller nothing and is not root; each
//!   under a seccomp filter, on a read-only root filesystem; no container privileged.
//! - **an ordinary pod** on node1 (no host path, no host network): the agent's socket is not
//!   in its filesystem; the agent's metrics and health port, which the node itself reaches
//!   on 127.0.0.1, refuses it at every address of the node it can reach; a BGP speaker in a
//!   pod (BIRD, given NET_ADMIN in its own namespace so that its sockets work) opening
//!   sessions to its node's BIRD at the node's address and at the gateway `fe80::1` is reset,
//!   never Established, and what it offers (a more-specific of node2's pod CIDRs, default
//!   routes) reaches neither node1's kernel nor the router.
//! - **a router sending what flock did not ask for**: default routes of both families and
//!   more-specifics of node1's own pod CIDRs. Goal: node1's BIRD receives and filters them
//!   (its import counters rise), its kernel installs none of them.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ipnet::IpNet;

use crate::cluster::{NODES, Node, images, kubectl, kubectl_stdin, node, site};
use crate::sys;

/// The namespace of the test's pods (deleted after).
const NS: &str = "security";
/// The agent's metrics and health port (`FLOCK_METRICS_ADDR` of the DaemonSet).
const METRICS_PORT: u16 = 9641;
/// The rogue BGP speaker's ASN.
const ROGUE_ASN: u32 = 65099;

/// The capabilities by number (`include/uapi/linux/capability.h`).
const CAPS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The names of the capabilities in a `/proc/PID/status` mask (hex).
fn cap_names(mask: &str) -> Result<Vec<String>> {
    let bits = u64::from_str_radix(mask.trim(), 16)
        .with_context(|| format!("capability mask {mask:?} is not hex"))?;
    Ok((0..64)
        .filter(|b| bits & (1 << b) != 0)
        .map(|b| {
            CAPS.get(b as usize)
                .map_or_else(|| format!("cap{b}"), |n| (*n).to_owned())
        })
        .collect())
}

/// A process's privileges as the kernel shows them.
#[derive(Debug)]
struct Privileges {
    effective: Vec<String>,
    bounding: Vec<String>,
    /// `Seccomp:` 0 none, 1 strict, 2 filter.
    seccomp: String,
    no_new_privs: bool,
    uid: String,
    root_read_only: bool,
}

fn privileges(pid: u32) -> Result<Privileges> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let field = |name: &str| -> Result<String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .with_context(|| format!("read /proc/{pid}/mountinfo"))?;
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS …: the last mount at `/` is what it sees
    let root_options = mountinfo
        .lines()
        .rev()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(4) == Some(&"/")).then(|| f.get(5).copied().unwrap_or_default().to_owned())
        })
        .with_context(|| format!("no root mount in /proc/{pid}/mountinfo"))?;
    Ok(Privileges {
        effective: cap_names(&field("CapEff:")?)?,
        bounding: cap_names(&field("CapBnd:")?)?,
        seccomp: field("Seccomp:")?,
        no_new_privs: field("NoNewPrivs:")? == "1",
        uid: field("Uid:")?
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned(),
        root_read_only: root_options.split(',').any(|o| o == "ro"),
    })
}

pub(super) fn security(out: &mut String) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    processes(out, &mut failures)?;
    specs(out, &mut failures)?;
    let n = &NODES[0];
    let other = &NODES[1];
    super::fresh_namespace(NS)?;
    let result = (|| -> Result<()> {
        ordinary_pod(out, n, &mut failures)?;
        rogue_speaker(out, n, other, &mut failures)?;
        rogue_router(out, n, &mut failures)
    })();
    let _ = kubectl(&["delete", "namespace", NS, "--wait=true", "--timeout=120s"]);
    result?;
    Ok(failures)
}

/// flock's processes on every node, with what each may hold.
fn processes(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    // (process name (`comm`, 15 bytes at most), what it is, the capabilities it may hold,
    // may it be root)
    let expected: [(&str, &str, &[&str], bool); 3] = [
        ("flock-agent", "agent", &["NET_ADMIN", "SYS_ADMIN"], true),
        ("bird", "BIRD", &["NET_ADMIN", "NET_BIND_SERVICE"], true),
        ("flock-controlle", "controller", &[], false),
    ];
    let _ = writeln!(
        out,
        "\nSECURITY: flock's processes as the kernel shows them (/proc/PID/status, mountinfo)"
    );
    let _ = writeln!(
        out,
        "{:<6} {:<11} {:>4} {:<34} {:<8} {:<6} {:<13} goal",
        "node",
        "process",
        "uid",
        "capabilities (effective = bounding)",
        "seccomp",
        "nnp",
        "root fs",
    );
    let mut controllers = 0;
    for n in &NODES {
        for (comm, what, allowed, root_ok) in expected {
            let pid = match super::pid_in(n, comm) {
                Ok(pid) => pid,
                // one controller runs on one of the nodes (hostNetwork)
                Err(_) if what == "controller" => continue,
                Err(e) => return Err(e),
            };
            if what == "controller" {
                controllers += 1;
            }
            let p = privileges(pid)?;
            let extra: Vec<&String> = p
                .bounding
                .iter()
                .filter(|c| !allowed.contains(&c.as_str()))
                .collect();
            let mut wrong = Vec::new();
            if !extra.is_empty() {
                wrong.push(format!("holds {extra:?} beyond {allowed:?}"));
            }
            if p.effective != p.bounding && !p.effective.is_empty() {
                wrong.push(format!(
                    "effective {:?} differs from bounding {:?}",
                    p.effective, p.bounding
                ));
            }
            if p.seccomp != "2" {
                wrong.push(format!("seccomp mode {} (2: a filter)", p.seccomp));
            }
            if !p.root_read_only {
                wrong.push("its root filesystem is writable".to_owned());
            }
            if !root_ok && p.uid == "0" {
                wrong.push("runs as root".to_owned());
            }
            let _ = writeln!(
                out,
                "{:<6} {:<11} {:>4} {:<34} {:<8} {:<6} {:<13} {}",
                n.name,
                what,
                p.uid,
                if p.bounding.is_empty() {
                    "none".to_owned()
                } else {
                    p.bounding.join(",")
                },
                if p.seccomp == "2" {
                    "filter"
                } else {
                    &p.seccomp
                },
                if p.no_new_privs { "yes" } else { "no" },
                if p.root_read_only {
                    "read-only"
                } else {
                    "writable"
                },
                if wrong.is_empty() {
                    "ok".to_owned()
                } else {
                    wrong.join("; ")
                }
            );
            failures.extend(
                wrong
                    .into_iter()
                    .map(|w| format!("{what} on {}: {w}", n.name)),
            );
        }
    }
    if controllers == 0 {
        failures.push("no flock-controller process found on any node".to_owned());
    }
    Ok(())
}

/// What flock's pods ask for: no container privileged, each under RuntimeDefault seccomp.
fn specs(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    let _ = writeln!(out, "\nSECURITY: what flock's pods ask for (their spec)");
    for app in ["flock", "flock-bird", "flock-controller"] {
        let pods = crate::cluster::report::json(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/name={app}"),
            "-o",
            "json",
        ])?;
        let Some(pod) = pods["items"].as_array().and_then(|i| i.first()).cloned() else {
            failures.push(format!("no pod of {app}"));
            continue;
        };
        let spec = &pod["spec"];
        let seccomp = spec["securityContext"]["seccompProfile"]["type"]
            .as_str()
            .unwrap_or("none");
        if seccomp != "RuntimeDefault" {
            failures.push(format!(
                "{app}: seccompProfile {seccomp}, not RuntimeDefault"
            ));
        }
        let containers = spec["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(spec["containers"].as_array().into_iter().flatten());
        for c in containers {
            let name = c["name"].as_str().unwrap_or("?");
            let sc = &c["securityContext"];
            let add: Vec<&str> = sc["capabilities"]["add"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str())
                .collect();
            let drop_all = sc["capabilities"]["drop"]
                .as_array()
                .is_some_and(|d| d.iter().any(|v| v == "ALL"));
            let _ = writeln!(
                out,
                "  {app}/{name}: privileged {}, drop ALL {}, add {:?}, readOnlyRootFilesystem {}, seccomp {seccomp}",
                sc["privileged"].as_bool().unwrap_or(false),
                drop_all,
                add,
                sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
            );
            if sc["privileged"].as_bool() == Some(true) {
                failures.push(format!("{app}/{name} is privileged"));
            }
            if !drop_all {
                failures.push(format!("{app}/{name} does not drop ALL capabilities"));
            }
            if sc["readOnlyRootFilesystem"].as_bool() != Some(true) {
                failures.push(format!("{app}/{name}: root filesystem not read-only"));
            }
        }
    }
    Ok(())
}

fn pod_yaml(name: &str, n: &Node, image: &str, command: &str, extra: &str) -> String {
    super::pinned_pod(NS, name, "", n.name, image, command, extra)
}

fn wait_ready(pod: &str) -> Result<()> {
    kubectl(&[
        "-n",
        NS,
        "wait",
        "--for=condition=Ready",
        &format!("pod/{pod}"),
        "--timeout=60s",
    ])?;
    Ok(())
}

/// Runs `script` in `pod`; (exit code, output).
fn exec(pod: &str, script: &str) -> Result<(i32, String)> {
    let out = crate::cluster::kubectl_command()
        .args(["-n", NS, "exec", pod, "--", "sh", "-c", script])
        .output()
        .context("kubectl exec")?;
    Ok((
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .trim()
        .to_owned(),
    ))
}

/// The agent's socket and metrics, from an ordinary pod on `n`.
fn ordinary_pod(out: &mut String, n: &Node, failures: &mut Vec<String>) -> Result<()> {
    const POD: &str = "ordinary";
    kubectl_stdin(
        &["apply", "-f", "-"],
        &pod_yaml(POD, n, images::NET, "[sleep, infinity]", ""),
    )?;
    wait_ready(POD)?;
    let _ = writeln!(out, "\nSECURITY: an ordinary pod on {}", n.name);
    // the socket: not in its filesystem
    let (code, said) = exec(POD, "ls -l /run/flock/agent.sock")?;
    let _ = writeln!(
        out,
        "  the agent's socket /run/flock/agent.sock: {}",
        if code == 0 { &said } else { "not there" }
    );
    if code == 0 {
        failures.push(format!("an ordinary pod sees the agent's socket: {said}"));
    }
    // the metrics: open to the node itself (or the check below proves nothing) …
    let node_side = node::place(n)?.run(&[
        "bash",
        "-c",
        &format!("exec 3<>/dev/tcp/127.0.0.1/{METRICS_PORT} && echo open"),
    ]);
    let open = node_side.as_deref().is_ok_and(|s| s.trim() == "open");
    let _ = writeln!(
        out,
        "  the agent's port {METRICS_PORT} from the node itself (127.0.0.1): {}",
        if open { "open" } else { "closed" }
    );
    if !open {
        failures.push(format!(
            "the agent's port {METRICS_PORT} is not open on the node itself: {node_side:?}"
        ));
    }
    // … and refused to the pod at every address of its node it can reach
    for addr in [n.addr, n.router_id, "fe80::1%eth0", "169.254.1.1"] {
        let (code, said) = exec(
            POD,
            &format!("nc -w 2 {addr} {METRICS_PORT} </dev/null && echo connected"),
        )?;
        let _ = writeln!(
            out,
            "  the agent's port at {addr}: {}",
            if code == 0 {
                "CONNECTED"
            } else {
                said.lines().next().unwrap_or("failed")
            }
        );
        if code == 0 {
            failures.push(format!(
                "an ordinary pod connects to the agent's port at {addr}"
            ));
        }
    }
    Ok(())
}

/// `net` cut to `len` at its start (a more-specific of it).
fn more_specific(net: &str, len: u8) -> Result<IpNet> {
    let net: IpNet = net.parse().with_context(|| format!("{net:?} is no CIDR"))?;
    IpNet::new(net.network(), len).with_context(|| format!("/{len} of {net}"))
}

/// Whether `n`'s kernel has a route to exactly `prefix` that BIRD installed.
fn bird_route_on(n: &Node, prefix: &IpNet) -> Result<bool> {
    let family = if matches!(prefix, IpNet::V6(_)) {
        "-6"
    } else {
        "-4"
    };
    let out = crate::cluster::proc::Place::Net(n.ns()).run(&[
        "ip",
        family,
        "route",
        "show",
        "exact",
        &prefix.to_string(),
        "proto",
        "bird",
    ])?;
    Ok(!out.trim().is_empty())
}

/// A BGP speaker in a pod on `n` offering routes to its node's BIRD.
fn rogue_speaker(
    out: &mut String,
    n: &Node,
    other: &Node,
    failures: &mut Vec<String>,
) -> Result<()> {
    const POD: &str = "rogue-bgp";
    let offered = [
        more_specific(other.cidr6, 80)?,
        more_specific(other.cidr4, 25)?,
        "::/0".parse()?,
        "0.0.0.0/0".parse()?,
    ];
    let statics = |v6: bool| {
        offered
            .iter()
            .filter(|r| matches!(r, IpNet::V6(_)) == v6)
            .map(|r| format!("route {r} blackhole; "))
            .collect::<String>()
    };
    // to the node's address (not on the pod's link: multihop) and to the gateway on eth0
    let session = |name: &str, neighbor: &str, multihop: bool| {
        format!(
            "    protocol bgp {name} {{
      local as {ROGUE_ASN};{multihop}
      neighbor {neighbor} as {asn};
      connect retry time 1;
      error wait time 1, 5;
      ipv6 {{ import none; export all; }};
      ipv4 {{ extended next hop on; import none; export all; }};
    }}
",
            asn = n.asn,
            multihop = if multihop { "\n      multihop;" } else { "" },
        )
    };
    let conf = format!(
        "    router id 10.99.0.1;
    protocol device {{ }}
    protocol static offered6 {{ ipv6; {v6}}}
    protocol static offered4 {{ ipv4; {v4}}}
{to_node}{to_gateway}",
        v6 = statics(true),
        v4 = statics(false),
        to_node = session("to_node", n.addr, true),
        to_gateway = session("to_gateway", "fe80::1%eth0", false),
    );
    kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1
kind: ConfigMap
metadata: {{ name: {POD}, namespace: {NS} }}
data:
  bird.conf: |
{conf}---
{pod}",
            pod = pod_yaml(
                POD,
                n,
                images::FLOCK,
                "[bird, -f, -c, /conf/bird.conf, -s, /tmp/bird.ctl]",
                &format!(
                    "      securityContext:
        capabilities: {{ add: [NET_ADMIN] }}
      volumeMounts:
        - {{ name: conf, mountPath: /conf }}
  volumes:
    - {{ name: conf, configMap: {{ name: {POD} }} }}
"
                )
            )
        ),
    )?;
    wait_ready(POD)?;
    // enough for a few connection attempts each (retry 1 s, error wait 1-5 s)
    std::thread::sleep(Duration::from_secs(12));
    let (code, shown) = exec(POD, "birdc -s /tmp/bird.ctl show protocols")?;
    if code != 0 {
        bail!("the rogue speaker's BIRD does not answer: {shown}");
    }
    let _ = writeln!(
        out,
        "\nSECURITY: a BGP speaker in a pod on {} (AS {ROGUE_ASN}) offering {}",
        n.name,
        offered
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    for name in ["to_node", "to_gateway"] {
        let line = shown
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or("(absent)");
        let _ = writeln!(out, "  {line}");
        if line.contains("Established") || !line.contains("BGP") {
            failures.push(format!("the rogue speaker's session {name}: {line}"));
        }
    }
    for r in &offered {
        let on_node = bird_route_on(n, r)?;
        let at_router = site::router_paths(&r.to_string()) > 0;
        let _ = writeln!(
            out,
            "  {r}: {} {}, {} the router",
            if on_node { "IN" } else { "not in" },
            n.name,
            if at_router { "AT" } else { "not at" }
        );
        if on_node || at_router {
            failures.push(format!(
                "the rogue speaker's {r} was installed (node: {on_node}, router: {at_router})"
            ));
        }
    }
    Ok(())
}

/// The routes `n`'s BIRD filtered on import, over all its protocols (`show protocols all`:
/// `Import updates:` received, rejected, filtered, …).
fn filtered_on_import(n: &Node) -> Result<u64> {
    let socket = node::host_path(n, "/run/flock")
        .context("the node's /run/flock")?
        .join("bird.ctl");
    let shown = sys::output(
        std::process::Command::new("birdc")
            .arg("-s")
            .arg(&socket)
            .args(["show", "protocols", "all"]),
    )?;
    Ok(shown
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Import updates:"))
        .filter_map(|rest| rest.split_whitespace().nth(2)?.parse::<u64>().ok())
        .sum())
}

/// The router announcing to every node what flock did not ask for.
fn rogue_router(out: &mut String, n: &Node, failures: &mut Vec<String>) -> Result<()> {
    let sent: Vec<IpNet> = vec![
        "::/0".parse()?,
        "0.0.0.0/0".parse()?,
        more_specific(n.cidr6, 80)?,
        more_specific(n.cidr4, 25)?,
    ];
    let before = filtered_on_import(n)?;
    site::announce(&sent)?;
    let result = (|| -> Result<()> {
        let mut now = before;
        let arrived = sys::wait_for(Duration::from_secs(20), || {
            now = filtered_on_import(n).unwrap_or(now);
            now >= before + sent.len() as u64
        })
        .is_ok();
        let _ = writeln!(
            out,
            "\nSECURITY: the router ({}) announcing what flock did not ask for",
            site::router_kind()
        );
        let _ = writeln!(
            out,
            "  {}'s BIRD filtered on import: {before} before, {now} after ({} sent)",
            n.name,
            sent.len()
        );
        if !arrived {
            failures.push(format!(
                "{}'s BIRD filtered {} of the router's {} rogue routes within 20 s",
                n.name,
                now - before,
                sent.len()
            ));
        }
        for r in &sent {
            let installed = bird_route_on(n, r)?;
            let _ = writeln!(
                out,
                "  {r}: {} {}'s kernel",
                if installed { "IN" } else { "not in" },
                n.name
            );
            if installed {
                failures.push(format!("the router's rogue {r} is in {}'s kernel", n.name));
            }
        }
        Ok(())
    })();
    site::announce(&[])?;
    result
}
