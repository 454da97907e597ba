//! Where an ADD's and a DEL's time goes, per phase, p50/p99, beside the kernel floor measured
//! in the same run.
//!
//! - The agent's phases come from its `--trace` file (one JSON line per request, see
//!   `flock_agent::trace`).
//! - "outside the agent" is what the runtime stand-in measured for the call minus the agent's
//!   total: exec'ing the shim, its connect, the transfer both ways, the stand-in's own work.
//!   It splits at the agent's `startMonoUs` / `endMonoUs` (`CLOCK_MONOTONIC`, read by the
//!   stand-in too): "to the agent" (the stand-in's work before the exec, the exec, the shim's
//!   start and connect, the agent's accept) and "from the agent" (the reply's way to the
//!   shim, its output and exit, the stand-in's reading of it and its own work after).
//! - The floor: `flock-netns` alone setting up (and detaching) the same dual-stack pods in
//!   fresh namespaces, measured before any subject runs (a quiet kernel), and the shim exec'd
//!   for `VERSION` by the same runtime stand-in in the same node namespace (which never
//!   leaves the shim).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{Floor, percentile_ms};

/// The phases of the agent's ADD and DEL, in the order they happen.
const ADD_PHASES: &[&str] = &[
    "read",
    "lock",
    "resolve",
    "allocate",
    "store_pending",
    "kernel",
    "policy",
    "store_commit",
    "bird",
    "reply",
];
const DEL_PHASES: &[&str] = &["read", "lock", "kernel", "store_delete", "release", "reply"];
const KERNEL_DETAIL: &[&str] = &["veth", "host", "pod"];

/// One call the runtime stand-in timed.
#[derive(Debug, Clone)]
pub struct Observed {
    /// `ADD` or `DEL`.
    pub op: &'static str,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// What the stand-in measured.
    pub elapsed: Duration,
    /// `CLOCK_MONOTONIC` when the stand-in began the call.
    pub started_mono: Option<Duration>,
}

/// The machine's `CLOCK_MONOTONIC`, the clock of the agent's `startMonoUs` / `endMonoUs`.
pub fn monotonic() -> Option<Duration> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .ok()
        .map(Duration::from)
}

/// Per phase, the samples of each op.
#[derive(Debug, Default)]
pub struct Breakdown {
    /// (op, phase) → samples.
    samples: BTreeMap<(String, String), Vec<Duration>>,
}

impl Breakdown {
    /// Reads the agent's trace lines for the calls in `observed`.
    pub fn from_trace(trace: &str, observed: &[Observed]) -> Result<Breakdown> {
        let mut by_call: BTreeMap<(String, String), Value> = BTreeMap::new();
        for (n, line) in trace.lines().enumerate() {
            let v: Value = serde_json::from_str(line)
                .with_context(|| format!("trace line {}: {line:?}", n + 1))?;
            let op = v["op"].as_str().unwrap_or_default().to_owned();
            let cid = v["containerId"].as_str().unwrap_or_default().to_owned();
            by_call.insert((op, cid), v);
        }
        let mut b = Breakdown::default();
        for call in observed {
            let Some(line) = by_call.get(&(call.op.to_owned(), call.container_id.clone())) else {
                bail!(
                    "the agent's trace has no {} of {}",
                    call.op,
                    call.container_id
                );
            };
            let us = |v: &Value| Duration::from_micros(v.as_u64().unwrap_or(0));
            let total = us(&line["totalUs"]);
            b.push(
                call.op,
                "outside the agent",
                call.elapsed.saturating_sub(total),
            );
            b.push(call.op, "agent total", total);
            if let (Some(started), Some(start), Some(end)) = (
                call.started_mono,
                line["startMonoUs"].as_u64(),
                line["endMonoUs"].as_u64(),
            ) {
                let (start, end) = (Duration::from_micros(start), Duration::from_micros(end));
                b.push(call.op, "to the agent", start.saturating_sub(started));
                b.push(
                    call.op,
                    "from the agent",
                    (started + call.elapsed).saturating_sub(end),
                );
            }
            if let Some(phases) = line["phases"].as_object() {
                for (phase, d) in phases {
                    b.push(call.op, phase, us(d));
                }
            }
            if let Some(kernel) = line["kernel"].as_object() {
                for (part, d) in kernel {
                    b.push(call.op, &format!("kernel: {part}"), us(d));
                }
            }
        }
        Ok(b)
    }

    fn push(&mut self, op: &str, phase: &str, d: Duration) {
        self.samples
            .entry((op.to_owned(), phase.to_owned()))
            .or_default()
            .push(d);
    }

    /// Adds another round's samples.
    pub fn absorb(&mut self, round: Breakdown) {
        for (key, samples) in round.samples {
            self.samples.entry(key).or_default().extend(samples);
        }
    }

    fn get(&self, op: &str, phase: &str) -> Option<&Vec<Duration>> {
        self.samples.get(&(op.to_owned(), phase.to_owned()))
    }
}

/// The breakdown table (markdown) and the floor rows under it.
pub fn render(b: &Breakdown, floor: &Floor) -> String {
    let mut out = String::from(
        "| phase (sequential) | ADD p50 | ADD p99 | DEL p50 | DEL p99 |\n|---|---:|---:|---:|---:|\n",
    );
    let cell = |op: &str, phase: &str, p: f64| {
        b.get(op, phase)
            .map_or("—".to_owned(), |s| format!("{:.3}", percentile_ms(s, p)))
    };
    let mut phases: Vec<String> = vec![
        "outside the agent".into(),
        "to the agent".into(),
        "from the agent".into(),
    ];
    for p in ADD_PHASES.iter().chain(DEL_PHASES) {
        if !phases.iter().any(|q| q == p) {
            phases.push((*p).to_owned());
        }
    }
    phases.extend(KERNEL_DETAIL.iter().map(|p| format!("kernel: {p}")));
    phases.push("agent total".into());
    for phase in &phases {
        out.push_str(&format!(
            "| {phase} | {} | {} | {} | {} |\n",
            cell("ADD", phase, 50.0),
            cell("ADD", phase, 99.0),
            cell("DEL", phase, 50.0),
            cell("DEL", phase, 99.0)
        ));
    }
    let floor_row = |name: &str, add: &[Duration], del: &[Duration]| {
        let f = |s: &[Duration], p| {
            if s.is_empty() {
                "—".to_owned()
            } else {
                format!("{:.3}", percentile_ms(s, p))
            }
        };
        format!(
            "| {name} | {} | {} | {} | {} |\n",
            f(add, 50.0),
            f(add, 99.0),
            f(del, 50.0),
            f(del, 99.0)
        )
    };
    out.push_str(&floor_row(
        "**floor**: flock-netns alone (setup / detach)",
        &floor.setup,
        &floor.detach,
    ));
    out.push_str(&floor_row(
        "**floor**: flock-netns alone, each setup right after a shim exec",
        &floor.setup_after_exec,
        &[],
    ));
    out.push_str(&floor_row(
        "**floor**: shim exec of VERSION",
        &floor.version_exec,
        &floor.version_exec,
    ));
    out.push_str(&floor_row(
        "**floor**: a whole ADD / DEL, runtime → shim → a daemon that only decodes, sets up (ADD) and answers",
        &floor.handed_off_add,
        &floor.handed_off_del,
    ));
    out.push_str(&floor_row(
        "**floor**: Unix socket round trip to an idle thread",
        &floor.idle_round_trip,
        &floor.idle_round_trip,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_the_agent_is_the_runtimes_time_less_the_agents() {
        let trace = concat!(
            r#"{"op":"ADD","containerId":"a","ifName":"eth0","outcome":"ok","totalUs":800,"#,
            r#""phases":{"read":20,"kernel":700,"reply":80},"kernel":{"veth":400,"host":200,"pod":150,"anycast":0},"#,
            r#""startMonoUs":5000400,"endMonoUs":5001200}"#,
            "\n",
            r#"{"op":"DEL","containerId":"a","ifName":"eth0","outcome":"ok","totalUs":300,"phases":{"kernel":300}}"#,
        );
        let observed = [
            Observed {
                op: "ADD",
                container_id: "a".into(),
                elapsed: Duration::from_micros(1300),
                started_mono: Some(Duration::from_micros(5_000_000)),
            },
            Observed {
                op: "DEL",
                container_id: "a".into(),
                elapsed: Duration::from_micros(1000),
                // a trace line without the clock (an older agent): no split
                started_mono: Some(Duration::from_micros(6_000_000)),
            },
        ];
        let b = Breakdown::from_trace(trace, &observed).unwrap();
        assert_eq!(
            b.get("ADD", "outside the agent").unwrap(),
            &vec![Duration::from_micros(500)]
        );
        // 400 µs before the agent started, 100 µs after it ended: 500 µs outside
        assert_eq!(
            b.get("ADD", "to the agent").unwrap(),
            &vec![Duration::from_micros(400)]
        );
        assert_eq!(
            b.get("ADD", "from the agent").unwrap(),
            &vec![Duration::from_micros(100)]
        );
        assert!(b.get("DEL", "to the agent").is_none());
        assert_eq!(
            b.get("ADD", "kernel: veth").unwrap(),
            &vec![Duration::from_micros(400)]
        );
        let table = render(&b, &Floor::default());
        assert!(
            table.contains("| outside the agent | 0.500 | 0.500 | 0.700 | 0.700 |"),
            "{table}"
        );
        assert!(
            table.contains("| kernel | 0.700 | 0.700 | 0.300 | 0.300 |"),
            "{table}"
        );
        let missing = Breakdown::from_trace("", &observed).unwrap_err();
        assert!(missing.to_string().contains("no ADD of a"), "{missing}");
    }

    #[test]
    fn the_floor_after_an_exec_and_the_idle_round_trip_get_rows_of_their_own() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&us| Duration::from_micros(us))
                .collect::<Vec<_>>()
        };
        let mut floor = Floor {
            setup: ms(&[500, 550, 600]),
            version_exec: ms(&[150, 170, 190]),
            idle_round_trip: ms(&[90, 100, 110]),
            ..Floor::default()
        };
        floor.setup_after_exec = ms(&[600, 650, 700]);
        let table = render(&Breakdown::default(), &floor);
        assert!(
            table.contains(
                "| **floor**: flock-netns alone, each setup right after a shim exec | 0.650 | 0.700 | — | — |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| **floor**: Unix socket round trip to an idle thread | 0.100 | 0.110 | 0.100 | 0.110 |"),
            "{table}"
        );
    }
}
