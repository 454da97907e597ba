//! `life upgrade`: a rolling update of flock's DaemonSet under ping and HTTP probes from a
//! pod on each node, with `web` scaled up and down meanwhile.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::super::deploy::{DEMO_NS, web_service_ip};
use super::super::kubectl;
use super::{PodView, cluster_now, exec, pods, sandbox_failures_since};
use crate::sys;

/// The ping and GET interval of the upgrade's probes.
const PROBE_INTERVAL: &str = "0.05";

/// The probe each pinger pod runs in the background until `/tmp/life.stop` exists: a ping
/// to each address of its peer, and a GET of the Service, every 50 ms.
fn probe_script(peer: &[String], service: &str) -> String {
    let mut s = String::from(
        "rm -f /tmp/life.*; \
         http() { printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 \"$1\" 80 2>/dev/null | tail -n 1; }; ",
    );
    for (i, addr) in peer.iter().enumerate() {
        let _ = write!(
            s,
            "ping -i {PROBE_INTERVAL} {addr} > /tmp/life.ping{i} 2>&1 & echo $! >> /tmp/life.pids; "
        );
    }
    let _ = write!(
        s,
        "( ok=0; bad=0; while [ ! -e /tmp/life.stop ]; do \
             b=$(http {service}); if [ -n \"$b\" ]; then ok=$((ok+1)); else bad=$((bad+1)); fi; \
             sleep {PROBE_INTERVAL}; done; echo \"$ok $bad\" > /tmp/life.http ) \
         > /dev/null 2>&1 &"
    );
    s
}

/// The pods that probe a roll, the anycast pod of each node, and the `web` Service's address
/// they GET.
pub(crate) fn probers() -> Result<(PodView, PodView, String)> {
    let pingers = pods(DEMO_NS, "app=anycast")?;
    let [a, b] = pingers.as_slice() else {
        bail!("want one anycast pod per node, found {}", pingers.len());
    };
    Ok((a.clone(), b.clone(), web_service_ip()?))
}

/// Starts [`probe_script`] in `pod` (demo namespace) against `peer`'s addresses and `service`.
pub(crate) fn start_probe(pod: &str, peer: &[String], service: &str) -> Result<()> {
    exec(pod, &probe_script(peer, service))
        .map(drop)
        .with_context(|| format!("start the probe in {pod}"))
}

/// What a probe counted: per peer address (pings sent, received), and (GETs ok, failed).
type ProbeCounts = (Vec<(u64, u64)>, (u64, u64));

/// Stops the probe and returns its counts.
pub(crate) fn stop_probe(pod: &str, peers: usize) -> Result<ProbeCounts> {
    exec(
        pod,
        "touch /tmp/life.stop; kill -INT $(cat /tmp/life.pids); \
         for i in 1 2 3 4 5 6 7 8 9 10; do [ -e /tmp/life.http ] && break; sleep 0.5; done",
    )?;
    let mut pings = Vec::new();
    for i in 0..peers {
        let text = exec(pod, &format!("cat /tmp/life.ping{i}"))?;
        pings.push(
            ping_counts(&text)
                .with_context(|| format!("no ping statistics from {pod} (ping {i}): {text:?}"))?,
        );
    }
    let http = exec(pod, "cat /tmp/life.http")?;
    let mut it = http.split_whitespace().map(str::parse::<u64>);
    let (Some(Ok(ok)), Some(Ok(bad))) = (it.next(), it.next()) else {
        bail!("no GET counts from {pod}: {http:?}");
    };
    Ok((pings, (ok, bad)))
}

/// (transmitted, received) from ping's statistics line.
pub(super) fn ping_counts(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.contains("packets transmitted"))?;
    let mut numbers = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(str::parse::<u64>);
    let transmitted = numbers.next()?.ok()?;
    let received = numbers.next()?.ok()?;
    // The probe ends ping with SIGINT, and ping counts a request still in flight then as
    // lost. One request after the last reply is that one, not a loss; more are losses.
    let replies: std::collections::BTreeSet<u64> = text
        .lines()
        .filter(|l| !l.contains("DUP!"))
        .filter_map(|l| l.split("seq=").nth(1))
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect();
    let Some(last) = replies.last() else {
        // Quiet (`-q`) or no reply at all: the statistics line is all there is.
        return Some((transmitted, received));
    };
    let sent = if transmitted == last + 2 {
        last + 1
    } else {
        transmitted
    };
    Some((sent, replies.len() as u64))
}

/// Starts the rolling update, as the cluster was installed: a value of the Helm release
/// changed (`agent.leakGrace`, between 5m and 6m), or an environment variable of the
/// DaemonSet set (`FLOCK_ROLLOUT_MARK`, stamped `since`). Says which.
fn roll(since: &str) -> Result<String> {
    use super::super::deploy::{self, Installer};
    match deploy::installed_with() {
        Installer::Helm => {
            // the release's values, defaults included
            let values: serde_json::Value = serde_json::from_str(&deploy::helm(&[
                "get",
                "values",
                crate::helm::RELEASE,
                "--namespace",
                crate::helm::NAMESPACE,
                "--all",
                "--output",
                "json",
            ])?)
            .context("helm get values")?;
            let current = values["agent"]["leakGrace"]
                .as_str()
                .context("the release has no agent.leakGrace")?
                .to_owned();
            let next = if current.trim() == "5m" { "6m" } else { "5m" };
            let set = format!("agent.leakGrace={next}");
            deploy::helm(&[
                "upgrade",
                crate::helm::RELEASE,
                crate::helm::CHART,
                "--namespace",
                crate::helm::NAMESPACE,
                "--reuse-values",
                "--set",
                &set,
            ])?;
            Ok(format!("helm upgrade --reuse-values --set {set}"))
        }
        Installer::Manifests => {
            let mark = format!("FLOCK_ROLLOUT_MARK={}", since.replace(':', ""));
            kubectl(&[
                "-n",
                "kube-system",
                "set",
                "env",
                "daemonset/flock",
                "-c",
                "agent",
                &mark,
            ])?;
            Ok(format!("kubectl set env {mark}"))
        }
    }
}

pub(super) fn upgrade(out: &mut String) -> Result<Vec<String>> {
    rolled(
        out,
        "rolling update of daemonset/flock",
        roll,
        RolledOut::Agents,
    )
}

/// What a roll replaces, and so what [`rolled`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RolledOut {
    /// The agents' DaemonSet.
    Agents,
    /// Every part of flock: both DaemonSets and the controller.
    Everything,
}

/// A roll of flock under probes: a ping to each address of the other node's prober and a GET
/// of the Service every 50 ms from a pod on each node, with `web` scaled up and down
/// meanwhile; `start` begins the roll (given the cluster's time at the start) and says how.
/// Lost pings, failed GETs, failed pod creations and changed addresses are failures.
fn rolled(
    out: &mut String,
    what: &str,
    start: impl FnOnce(&str) -> Result<String>,
    waits: RolledOut,
) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let (a, b, service) = probers()?;
    let (a, b) = (&a, &b);
    let before: BTreeMap<String, Vec<String>> = pods(DEMO_NS, "app in (web, anycast)")?
        .into_iter()
        .map(|p| (p.name, p.ips))
        .collect();
    let agents_before: Vec<String> = pods("kube-system", "app.kubernetes.io/name=flock")?
        .into_iter()
        .map(|p| p.name)
        .collect();
    let since = cluster_now()?;
    for (from, to) in [(a, b), (b, a)] {
        start_probe(&from.name, &to.ips, &service)?;
    }
    // Let the probes run before the update starts, so a loss at its start would show.
    std::thread::sleep(Duration::from_secs(2));

    let t = Instant::now();
    let how = start(&since)?;
    // Pods come and go while the agents are replaced, one node after the other.
    let scaling = std::thread::spawn(|| -> Result<()> {
        super::super::deploy::scale_web(
            super::super::deploy::WEB_REPLICAS * 2,
            Duration::from_secs(180),
        )?;
        super::super::deploy::scale_web(
            super::super::deploy::WEB_REPLICAS,
            Duration::from_secs(180),
        )?;
        Ok(())
    });
    let rollout = match waits {
        RolledOut::Agents => kubectl(&[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "daemonset/flock",
            "--timeout=300s",
        ])
        .map(drop),
        RolledOut::Everything => super::super::deploy::wait_rolled_out(),
    };
    let rollout_took = t.elapsed();
    let scaled = scaling
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the scaling thread panicked")));
    let scale_up_down = t.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let mut rows = Vec::new();
    for (from, to) in [(a, b), (b, a)] {
        let (pings, (ok, bad)) = stop_probe(&from.name, to.ips.len())?;
        for (addr, (sent, got)) in to.ips.iter().zip(&pings) {
            let lost = sent.saturating_sub(*got);
            if lost > 0 {
                failures.push(format!(
                    "{} -> {addr}: {lost} of {sent} pings lost",
                    from.name
                ));
            }
            rows.push(vec![
                format!("{} ({})", from.name, from.node),
                format!("ping {addr}"),
                sent.to_string(),
                lost.to_string(),
            ]);
        }
        if bad > 0 {
            failures.push(format!(
                "{} -> Service {service}: {bad} of {} GETs failed",
                from.name,
                ok + bad
            ));
        }
        rows.push(vec![
            format!("{} ({})", from.name, from.node),
            format!("GET Service {service}"),
            (ok + bad).to_string(),
            bad.to_string(),
        ]);
    }
    rollout.context("the DaemonSet's rollout did not complete")?;
    scaled.context("web's scaling during the rollout")?;
    let agents_after: Vec<String> = pods("kube-system", "app.kubernetes.io/name=flock")?
        .into_iter()
        .map(|p| p.name)
        .collect();
    if agents_after.iter().any(|n| agents_before.contains(n)) {
        failures.push(format!(
            "the rollout replaced no agent pod: before {agents_before:?}, after {agents_after:?}"
        ));
    }
    let after = pods(DEMO_NS, "app in (web, anycast)")?;
    let changed: Vec<String> = after
        .iter()
        .filter_map(|p| {
            let was = before.get(&p.name)?;
            (was != &p.ips).then(|| format!("{}: {was:?} -> {:?}", p.name, p.ips))
        })
        .collect();
    let kept = after
        .iter()
        .filter(|p| before.contains_key(&p.name))
        .count();
    let creations = sandbox_failures_since(&since)?;
    if !changed.is_empty() {
        failures.push(format!("addresses changed: {}", changed.join("; ")));
    }
    if !creations.is_empty() {
        failures.push(format!("failed pod creations: {}", creations.join("; ")));
    }

    let _ = writeln!(
        out,
        "UPGRADE ({what} by {how}: agents {} -> {}; web scaled {} -> {} -> {} meanwhile; probes every {PROBE_INTERVAL} s)",
        agents_before.join(" "),
        agents_after.join(" "),
        super::super::deploy::WEB_REPLICAS,
        super::super::deploy::WEB_REPLICAS * 2,
        super::super::deploy::WEB_REPLICAS
    );
    sys::table(out, &["from", "probe", "sent", "lost"], &rows);
    let summary = vec![
        vec![
            "rollout complete after".to_owned(),
            format!("{:.1} s", rollout_took.as_secs_f64()),
        ],
        vec![
            "scale up and down done after".to_owned(),
            format!("{:.1} s", scale_up_down.as_secs_f64()),
        ],
        vec![
            "failed pod creations (FailedCreatePodSandBox)".to_owned(),
            creations.len().to_string(),
        ],
        vec![
            "pods whose address changed".to_owned(),
            format!("{} of {kept} that lived through it", changed.len()),
        ],
    ];
    sys::table(out, &["", ""], &summary);
    out.push('\n');
    Ok(failures)
}

/// `life upgrade --from REV`: flock at REV installed, then rolled to the working tree and
/// back (a rollback), each roll under [`rolled`]'s probes; between them the other version's
/// shim adds and deletes a pod through the agent that runs (the RPC across versions, both
/// ways), and each agent's start-up report shows it read the store the other wrote. The
/// cluster ends on the working tree's build, as it came up.
pub(super) fn upgrade_from(out: &mut String, rev: &str) -> Result<Vec<String>> {
    use crate::cluster::deploy::{self, Installer};
    use crate::cluster::{NODES, images, kube, node};
    if deploy::installed_with() == Installer::Helm {
        bail!(
            "life upgrade --from rolls between revisions' deploy/ manifests (a revision may have \
             no chart), and this cluster was installed with Helm: bring it up with \
             `cargo xtask cluster up --install manifests`"
        );
    }
    let repo = crate::cluster::repo_root();
    let kube = kube::ensure_built()?;
    let old = crate::revision::build(&repo, rev)?;
    let old_image = format!("localhost/flock:{}", old.short);
    let archive = images::build_flock_image_as(
        &old.bins,
        &old.src,
        &old_image,
        &format!("flock-{}", old.short),
    )?;
    for n in &NODES {
        images::import(&kube, &node::containerd_socket(n), &archive)
            .with_context(|| format!("import {old_image} on {}", n.name))?;
    }
    // A roll between versions restarts BIRD too (the image changes). On a session with BFD, a
    // router in `bfd on` mode ends the session the moment BIRD's BFD stops and loses the
    // node's traffic until BIRD is back (about 1.3 s; docs/bgp.md, "Graceful restart and
    // BFD"); in `bfd graceful` mode it restarts gracefully. The rolls run with the latter,
    // as an operator who wants hitless upgrades configures the router.
    let was_graceful = crate::cluster::site::is_bfd_graceful();
    crate::cluster::site::bfd_graceful(true)?;
    let result = rolls(out, rev, &repo, &old, &old_image);
    crate::cluster::site::bfd_graceful(was_graceful)?;
    result
}

/// The rolls of [`upgrade_from`]: install `old`, upgrade, rollback, and back to the working
/// tree.
fn rolls(
    out: &mut String,
    rev: &str,
    repo: &std::path::Path,
    old: &crate::revision::Revision,
    old_image: &str,
) -> Result<Vec<String>> {
    use crate::cluster::deploy;
    use crate::cluster::{NODES, images};
    let new_shim = crate::lab::debug_bins().join("flock");
    let old_shim = old.bins.join("flock");
    let mut failures = Vec::new();

    let t = Instant::now();
    deploy::apply_version(&old.src, old_image)?;
    deploy::wait_rolled_out()?;
    let _ = writeln!(
        out,
        "UPGRADE FROM {rev} ({}): installed from its deploy/ with {old_image} in {:.1} s; the \
         router's BFD sessions in `bfd graceful` mode for the rolls",
        old.short,
        t.elapsed().as_secs_f64()
    );
    failures.extend(startup_reports(out, rev)?);
    failures.extend(shim_with_agent(
        out,
        &NODES[0],
        &new_shim,
        "the working tree's shim",
        rev,
    )?);
    failures.extend(rolled(
        out,
        &format!("upgrade from {rev} to the working tree"),
        |_| {
            deploy::apply_version(repo, images::FLOCK)?;
            Ok(format!("kubectl apply of deploy/ with {}", images::FLOCK))
        },
        RolledOut::Everything,
    )?);
    failures.extend(startup_reports(out, "the working tree")?);
    failures.extend(shim_with_agent(
        out,
        &NODES[0],
        &old_shim,
        &format!("{rev}'s shim"),
        "the working tree",
    )?);
    failures.extend(rolled(
        out,
        &format!("rollback from the working tree to {rev}"),
        |_| {
            deploy::apply_version(&old.src, old_image)?;
            Ok(format!("kubectl apply of {rev}'s deploy/ with {old_image}"))
        },
        RolledOut::Everything,
    )?);
    failures.extend(startup_reports(out, rev)?);
    // back to the build the cluster came up with
    deploy::apply_version(repo, images::FLOCK)?;
    deploy::wait_rolled_out()?;
    out.push('\n');
    Ok(failures)
}

/// Each node's agent's start-up report (the running container's log): what it found in the
/// store it started on; a store or record it refused is a failure.
fn startup_reports(out: &mut String, version: &str) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    for p in pods("kube-system", "app.kubernetes.io/name=flock")? {
        let log = kubectl(&["-n", "kube-system", "logs", &p.name, "-c", "agent"])?;
        let report = log
            .lines()
            .find(|l| l.contains("start-up reconcile done"))
            .map_or("(no start-up report in its log)", str::trim);
        let _ = writeln!(out, "  agent of {version} on {}: {report}", p.node);
        for refused in log
            .lines()
            .filter(|l| l.contains("store format") || l.contains("record format"))
        {
            failures.push(format!(
                "the agent of {version} on {} refused what the other version wrote: {}",
                p.node,
                refused.trim()
            ));
        }
    }
    Ok(failures)
}

/// A pod added and deleted on `n` through `shim` (put in the node's `/opt/cni/bin/flock` for
/// the while) and the agent of `agent` running there: the RPC between the two versions.
fn shim_with_agent(
    out: &mut String,
    n: &crate::cluster::Node,
    shim: &std::path::Path,
    shim_is: &str,
    agent: &str,
) -> Result<Vec<String>> {
    use crate::cluster::{images, kubectl_stdin, node};
    const POD: &str = "shim-compat";
    let bin = node::host_path(n, "/opt/cni/bin").context("the node's /opt/cni/bin")?;
    let installed = bin.join("flock");
    let kept = bin.join(".flock.kept");
    let trial = bin.join(".flock.trial");
    std::fs::copy(shim, &trial).with_context(|| format!("copy {}", shim.display()))?;
    std::fs::rename(&installed, &kept).context("keep the installed shim")?;
    std::fs::rename(&trial, &installed).context("put the other version's shim in place")?;
    let result = (|| -> Result<(Vec<String>, Duration)> {
        let t = Instant::now();
        kubectl_stdin(
            &["apply", "-f", "-"],
            &super::pinned_pod(
                DEMO_NS,
                POD,
                "",
                n.name,
                images::NET,
                "[sleep, infinity]",
                "",
            ),
        )?;
        kubectl(&[
            "-n",
            DEMO_NS,
            "wait",
            "--for=condition=Ready",
            &format!("pod/{POD}"),
            "--timeout=90s",
        ])?;
        let ips = pods(DEMO_NS, "")?
            .into_iter()
            .find(|p| p.name == POD)
            .map(|p| p.ips)
            .unwrap_or_default();
        kubectl(&[
            "-n",
            DEMO_NS,
            "delete",
            "pod",
            POD,
            "--wait=true",
            "--timeout=60s",
        ])?;
        Ok((ips, t.elapsed()))
    })();
    std::fs::rename(&kept, &installed).context("put the installed shim back")?;
    let mut failures = Vec::new();
    match result {
        Ok((ips, took)) => {
            let _ = writeln!(
                out,
                "  {shim_is} with the agent of {agent} on {}: pod added ({}) and deleted in {:.1} s",
                n.name,
                ips.join(" "),
                took.as_secs_f64()
            );
            if ips.len() != 2 {
                failures.push(format!(
                    "{shim_is} with the agent of {agent}: the pod got {ips:?}, not an address of each family"
                ));
            }
        }
        Err(e) => {
            let _ = kubectl(&["-n", DEMO_NS, "delete", "pod", POD, "--wait=false"]);
            failures.push(format!("{shim_is} with the agent of {agent}: {e:#}"));
        }
    }
    Ok(failures)
}

// ---------------------------------------------------------------------------------------
// reboot

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_statistics() {
        let reply = |seq: u64| format!("64 bytes from x: seq={seq} ttl=62 time=0.1 ms\n");
        let stats = |sent: u64, got: u64| {
            format!(
                "--- x ping statistics ---\n{sent} packets transmitted, {got} packets received\n"
            )
        };
        // seq 2 lost, seq 5 in flight when ping was stopped: not a loss.
        let text: String = [0, 1, 3, 4].map(reply).concat() + &stats(6, 4);
        assert_eq!(ping_counts(&text), Some((5, 4)));
        // Two after the last reply: the path was gone at the end, both lost.
        let text: String = [0, 1].map(reply).concat() + &stats(4, 2);
        assert_eq!(ping_counts(&text), Some((4, 2)));
        // A duplicate counts once; no reply at all is every request lost.
        let text = reply(0) + &reply(0).replace("ms", "ms (DUP!)") + &stats(1, 1);
        assert_eq!(ping_counts(&text), Some((1, 1)));
        assert_eq!(ping_counts(&stats(3, 0)), Some((3, 0)));
        // Quiet: the statistics line.
        assert_eq!(ping_counts(&stats(120, 118)), Some((120, 118)));
        assert_eq!(ping_counts("ping: sendto: Network unreachable"), None);
    }
}
