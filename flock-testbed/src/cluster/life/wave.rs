//! `life join`'s second half: a wave of Nodes of one rack created at once, twice, with the
//! pool controller's leader killed or frozen in the middle; no prefix may land on two nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::BufRead as _;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::ms;
use crate::cluster::deploy::RACK_LABEL;
use crate::cluster::{JOINER, kubectl, kubectl_stdin};
use crate::sys;

/// Node objects created at once in each wave of the leader test.
const WAVE: usize = 30;

/// One version of a NodeConfig, as the watch saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    name: String,
    cidr6: String,
    cidr4: String,
}

/// `kubectl get nodeconfigs --watch`, every version of every NodeConfig.
struct Watch {
    child: Child,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Watch {
    fn start() -> Result<Watch> {
        let mut cmd = crate::cluster::kubectl_command();
        cmd.args([
            "get",
            "nodeconfigs",
            "--watch",
            "--no-headers",
            "-o",
            "custom-columns=N:.metadata.name,V6:.spec.cidr6,V4:.spec.cidr4",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .context("spawn kubectl get nodeconfigs --watch")?;
        let stdout = child.stdout.take().context("the watch's stdout")?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let f: Vec<&str> = line.split_whitespace().collect();
                if let [name, cidr6, cidr4] = f.as_slice() {
                    sink.lock().expect("watch lock").push(Seen {
                        name: (*name).to_owned(),
                        cidr6: (*cidr6).to_owned(),
                        cidr4: (*cidr4).to_owned(),
                    });
                }
            }
        });
        Ok(Watch { child, seen })
    }

    fn names(&self, prefix: &str) -> BTreeSet<String> {
        self.seen
            .lock()
            .expect("watch lock")
            .iter()
            .filter(|s| s.name.starts_with(prefix))
            .map(|s| s.name.clone())
            .collect()
    }

    fn stop(mut self) -> Vec<Seen> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::take(&mut *self.seen.lock().expect("watch lock"))
    }
}

/// What the watch saw that must never be: a prefix on two nodes, a node whose prefix
/// changed.
fn double_assignments(seen: &[Seen]) -> Vec<String> {
    let mut by_prefix: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut by_node: BTreeMap<&str, BTreeSet<(&str, &str)>> = BTreeMap::new();
    for s in seen {
        for p in [&s.cidr6, &s.cidr4] {
            if p != "<none>" {
                by_prefix.entry(p).or_default().insert(&s.name);
            }
        }
        by_node
            .entry(&s.name)
            .or_default()
            .insert((&s.cidr6, &s.cidr4));
    }
    let mut bad: Vec<String> = by_prefix
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|(p, names)| format!("{p} seen on {names:?}"))
        .collect();
    bad.extend(
        by_node
            .into_iter()
            .filter(|(_, prefixes)| prefixes.len() > 1)
            .map(|(n, prefixes)| format!("{n} seen with {prefixes:?}")),
    );
    bad
}

/// How the leader is taken out in a wave.
#[derive(Clone, Copy)]
enum Blow {
    /// SIGKILL: no chance to release the Lease; its container restarts.
    Kill,
    /// SIGSTOP until the wave is done (by the standby, once the Lease expired), then
    /// SIGCONT: a leader that hung, woken up with a plan it made before — it must not write.
    Freeze,
}

impl Blow {
    fn name(self) -> &'static str {
        match self {
            Blow::Kill => "kill",
            Blow::Freeze => "freeze",
        }
    }
}

/// The Nodes of one wave: `WAVE` of the joiner's rack, tainted so nothing runs on them.
fn wave_nodes(wave: &str) -> String {
    (0..WAVE)
        .map(|i| {
            format!(
                "apiVersion: v1
kind: Node
metadata:
  name: wave-{wave}-{i:02}
  labels: {{ {RACK_LABEL}: {rack}, flock.fritzlab.net/life-test: wave }}
spec:
  taints: [{{ key: flock.fritzlab.net/no-machine, effect: NoSchedule }}]
",
                rack = JOINER.rack
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

pub(super) fn delete_wave() -> Result<String> {
    kubectl(&[
        "delete",
        "nodes",
        "-l",
        "flock.fritzlab.net/life-test=wave",
        "--wait=false",
    ])
}

/// The controller holding the Lease: its pod's name and its process.
pub(super) fn leader() -> Result<(String, u32)> {
    let holder = kubectl(&[
        "-n",
        "kube-system",
        "get",
        "lease",
        "flock-controller",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])?
    .trim()
    .to_owned();
    if holder.is_empty() {
        bail!("nobody holds the Lease kube-system/flock-controller");
    }
    let wanted = format!("FLOCK_POD_NAME={holder}");
    for p in std::fs::read_dir("/proc").context("read /proc")?.flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        if !program.ends_with(b"flock-controller") {
            continue;
        }
        let environ = std::fs::read(p.path().join("environ")).unwrap_or_default();
        if environ.split(|b| *b == 0).any(|e| e == wanted.as_bytes()) {
            return Ok((holder, pid));
        }
    }
    bail!("no process of the leading controller {holder} on this machine")
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}

pub(super) fn leader_kill(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    let watch = Watch::start()?;
    // The watch lists what exists first.
    sys::wait_for(Duration::from_secs(10), || !watch.names("").is_empty())
        .context("the NodeConfig watch printed nothing")?;
    let mut rows = Vec::new();
    for blow in [Blow::Kill, Blow::Freeze] {
        wave(blow, &watch, &mut rows, failures)?;
    }
    // Deleting the Nodes returns their prefixes: none of them ever reported an allocation.
    let t_release = Instant::now();
    delete_wave()?;
    let released = sys::wait_for(Duration::from_secs(120), || {
        kubectl(&["get", "nodeconfigs", "-o", "name"]).is_ok_and(|names| !names.contains("/wave-"))
    });
    let release_time = t_release.elapsed();
    if released.is_err() {
        failures.push("leader: the waves' NodeConfigs outlived their Nodes by 120 s".into());
    }
    let seen = watch.stop();
    let bad = double_assignments(&seen);
    for b in &bad {
        failures.push(format!("leader: {b}"));
    }
    rows.push(vec![
        "versions of NodeConfigs watched; prefixes seen on two nodes or moved".to_owned(),
        format!("{}; {}", seen.len(), bad.len()),
    ]);
    rows.push(vec![
        format!(
            "all {} Nodes deleted → their NodeConfigs gone, prefixes free",
            2 * WAVE
        ),
        ms(release_time),
    ]);
    let _ = writeln!(
        out,
        "CONTROLLER LEADER ({WAVE} Nodes of rack {} created at once, twice; the leading controller \
         killed (SIGKILL), then frozen (SIGSTOP, SIGCONT once the wave is done), at its first NodeConfig of the wave)",
        JOINER.rack
    );
    sys::table(out, &["", ""], &rows);
    Ok(())
}

fn wave(
    blow: Blow,
    watch: &Watch,
    rows: &mut Vec<Vec<String>>,
    failures: &mut Vec<String>,
) -> Result<()> {
    let name = blow.name();
    let prefix = format!("wave-{name}-");
    let (leader_pod, pid) = leader()?;
    let t = Instant::now();
    kubectl_stdin(&["apply", "-f", "-"], &wave_nodes(name))?;
    let first = sys::wait_for(Duration::from_secs(60), || !watch.names(&prefix).is_empty());
    let at_blow = watch.names(&prefix).len();
    let blown_after = t.elapsed();
    signal(
        pid,
        if matches!(blow, Blow::Kill) {
            "-KILL"
        } else {
            "-STOP"
        },
    );
    if first.is_err() {
        failures.push(format!(
            "leader {name}: no NodeConfig for the wave's Nodes in 60 s"
        ));
    }
    let done = sys::wait_for(Duration::from_secs(120), || {
        watch.names(&prefix).len() == WAVE
    });
    let completed = t.elapsed();
    if done.is_err() {
        failures.push(format!(
            "leader {name}: {} of {WAVE} NodeConfigs 120 s after the leader was taken out",
            watch.names(&prefix).len()
        ));
    }
    let successor = leader()
        .map(|(p, _)| p)
        .unwrap_or_else(|e| format!("? ({e:#})"));
    let mut woken = String::new();
    if let Blow::Freeze = blow {
        signal(pid, "-CONT");
        // Woken past its renew deadline it must find it no longer leads, write nothing, and
        // end (its container restarts as a candidate); the watch sees any write it makes.
        let ended = sys::wait_for(Duration::from_secs(20), || {
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
        woken = if ended.is_ok() {
            "ended".into()
        } else {
            "still running".into()
        };
        if ended.is_err() {
            failures.push(format!(
                "leader freeze: {leader_pod}, woken, still runs after 20 s"
            ));
        }
        if successor == leader_pod {
            failures.push(format!(
                "leader freeze: the frozen {leader_pod} still holds the Lease"
            ));
        }
    }
    rows.push(vec![
        format!("{name}: leader {leader_pod}; NodeConfigs of the wave by then"),
        format!("{at_blow} at {}", ms(blown_after)),
    ]);
    rows.push(vec![
        format!(
            "{name}: all {WAVE} written, Lease held by {successor}{}",
            if woken.is_empty() {
                String::new()
            } else {
                format!("; the woken leader {woken}")
            }
        ),
        ms(completed),
    ]);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// leave

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(name: &str, cidr6: &str, cidr4: &str) -> Seen {
        Seen {
            name: name.into(),
            cidr6: cidr6.into(),
            cidr4: cidr4.into(),
        }
    }

    #[test]
    fn a_prefix_on_two_nodes_or_a_moved_prefix_is_reported() {
        let fine = [
            seen("a", "2001:db8:c7::/64", "10.202.0.0/24"),
            seen("a", "2001:db8:c7::/64", "10.202.0.0/24"),
            seen("b", "2001:db8:c7:1::/64", "<none>"),
        ];
        assert!(double_assignments(&fine).is_empty());
        let twice = [
            seen("a", "2001:db8:c7::/64", "10.202.0.0/24"),
            seen("b", "2001:db8:c7:1::/64", "10.202.0.0/24"),
        ];
        assert_eq!(double_assignments(&twice).len(), 1);
        let moved = [
            seen("a", "2001:db8:c7::/64", "10.202.0.0/24"),
            seen("a", "2001:db8:c7:1::/64", "10.202.0.0/24"),
        ];
        assert_eq!(double_assignments(&moved).len(), 1);
    }

    #[test]
    fn the_wave_is_of_the_joiners_rack_and_runs_nothing() {
        let text = wave_nodes("kill");
        assert_eq!(text.matches("kind: Node").count(), WAVE);
        assert!(text.contains(&format!("{RACK_LABEL}: {}", JOINER.rack)));
        assert!(text.contains("effect: NoSchedule"));
    }
}
