//! Where a request's time goes: [`Phases`] marks the end of each phase of one request, and
//! [`Tracer`] (`flock-agent run --trace FILE`) appends one JSON line per request:
//!
//! ```json
//! {"op":"ADD","containerId":"c1","ifName":"eth0","outcome":"ok","totalUs":812,
//!  "phases":{"read":21,"lock":1,"resolve":9,"allocate":3,"store_pending":48,"kernel":611,
//!            "store_commit":41,"bird":1,"reply":30},
//!  "kernel":{"veth":402,"host":150,"pod":141,"anycast":0}}
//! ```
//!
//! Phases follow each other, so they add up to `totalUs` (from the accepted connection to the
//! written reply); `kernel` details the kernel phase, whose host and pod sides overlap.
//! `startMonoUs` and `endMonoUs` are the machine's `CLOCK_MONOTONIC` at those two points, so a
//! caller that reads the same clock can tell how long the call took to reach the agent and
//! how long the reply took to reach it. `cargo xtask bench` reads these lines for its
//! per-phase table.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The phases of one request, in order.
#[derive(Debug)]
pub struct Phases {
    started: Instant,
    /// `CLOCK_MONOTONIC` at `started` (`None` if it could not be read).
    started_mono: Option<Duration>,
    last: Instant,
    marks: Vec<(&'static str, Duration)>,
    kernel: Option<flock_netns::SetupTiming>,
}

impl Default for Phases {
    fn default() -> Self {
        Phases::start()
    }
}

impl Phases {
    /// Starts the clock.
    pub fn start() -> Phases {
        let now = Instant::now();
        Phases {
            started: now,
            started_mono: monotonic(),
            last: now,
            marks: Vec::with_capacity(12),
            kernel: None,
        }
    }

    /// Ends the phase `name` now (it began where the previous one ended).
    pub fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.marks.push((name, now - self.last));
        self.last = now;
    }

    /// Records how the kernel phase of an ADD split up.
    pub fn kernel_detail(&mut self, timing: flock_netns::SetupTiming) {
        self.kernel = Some(timing);
    }

    /// Since the start.
    pub fn total(&self) -> Duration {
        self.last - self.started
    }

    /// The marked phases, in order.
    pub fn marks(&self) -> &[(&'static str, Duration)] {
        &self.marks
    }
}

/// The machine's `CLOCK_MONOTONIC`: the clock `Instant` reads, as a number another process
/// can compare.
pub fn monotonic() -> Option<Duration> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .ok()
        .map(Duration::from)
}

/// What a trace line says of the request besides its phases.
#[derive(Debug, Clone, Default)]
pub struct RequestTag {
    /// `ADD`, `DEL`, …
    pub op: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub if_name: String,
    /// `ok` or the CNI error code.
    pub outcome: String,
}

/// Appends one JSON line per request to a file.
///
/// Lines are flushed once no request is in flight, so a reader sees every line of the
/// requests done so far, and a burst of requests costs one write, not one each (a write per
/// request on the agent's thread was work the agent does only when traced).
#[derive(Debug)]
pub struct Tracer {
    out: Mutex<BufWriter<File>>,
    /// Requests begun ([`Tracer::begin`]) and not yet done.
    in_flight: AtomicUsize,
}

impl Tracer {
    /// Creates (or truncates) the trace file.
    pub fn create(path: &Path) -> std::io::Result<Tracer> {
        Ok(Tracer {
            out: Mutex::new(BufWriter::new(File::create(path)?)),
            in_flight: AtomicUsize::new(0),
        })
    }

    /// A request begins; its line, if it gets one, is written with [`Traced::record`].
    pub fn begin(&self) -> Traced<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Traced { tracer: self }
    }
}

/// A request in flight, for its tracer: dropped (recorded or not), the request is done, and
/// the last one done flushes every line written.
#[derive(Debug)]
pub struct Traced<'a> {
    tracer: &'a Tracer,
}

impl Traced<'_> {
    /// Writes the line of the finished request.
    pub fn record(self, tag: &RequestTag, phases: &Phases) {
        let line = trace_line(tag, phases);
        let _ = self
            .tracer
            .out
            .lock()
            .expect("trace lock")
            .write_all(line.as_bytes());
    }
}

impl Drop for Traced<'_> {
    fn drop(&mut self) {
        if self.tracer.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _ = self.tracer.out.lock().expect("trace lock").flush();
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The JSON line of one request, newline included. Written field by field rather than built
/// as a `serde_json::Value`: the agent writes one per request when tracing, on the request's
/// thread.
pub fn trace_line(tag: &RequestTag, phases: &Phases) -> String {
    use std::fmt::Write as _;
    // A phase marked twice (a retried step) adds up; phases keep the order they were first
    // marked in.
    let mut by_phase: Vec<(&str, u64)> = Vec::with_capacity(phases.marks().len());
    for (name, d) in phases.marks() {
        match by_phase.iter_mut().find(|(n, _)| n == name) {
            Some((_, sum)) => *sum += micros(*d),
            None => by_phase.push((name, micros(*d))),
        }
    }
    let string = |s: &str| serde_json::to_string(s).expect("a string serializes");
    let mut line = String::with_capacity(384);
    let _ = write!(
        line,
        "{{\"op\":{},\"containerId\":{},\"ifName\":{},\"outcome\":{},\"totalUs\":{},\"phases\":{{",
        string(&tag.op),
        string(&tag.container_id),
        string(&tag.if_name),
        string(&tag.outcome),
        micros(phases.total()),
    );
    for (i, (name, us)) in by_phase.iter().enumerate() {
        let comma = if i == 0 { "" } else { "," };
        // Phase names are the agent's own identifiers: nothing to escape.
        let _ = write!(line, "{comma}\"{name}\":{us}");
    }
    line.push('}');
    if let Some(start) = phases.started_mono {
        let _ = write!(
            line,
            ",\"startMonoUs\":{},\"endMonoUs\":{}",
            micros(start),
            micros(start + phases.total())
        );
    }
    if let Some(k) = phases.kernel {
        let _ = write!(
            line,
            ",\"kernel\":{{\"veth\":{},\"host\":{},\"pod\":{},\"anycast\":{}}}",
            micros(k.veth),
            micros(k.host),
            micros(k.pod),
            micros(k.anycast)
        );
    }
    line.push_str("}\n");
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_to_the_total() {
        let mut p = Phases::start();
        p.mark("read");
        std::thread::sleep(Duration::from_millis(2));
        p.mark("kernel");
        p.mark("reply");
        let text = trace_line(
            &RequestTag {
                op: "ADD".into(),
                container_id: "c\"1".into(),
                if_name: "eth0".into(),
                outcome: "ok".into(),
            },
            &p,
        );
        assert!(
            text.ends_with('\n') && text.matches('\n').count() == 1,
            "{text:?}"
        );
        let line: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(line["containerId"], "c\"1", "{line}");
        let phases = line["phases"].as_object().unwrap();
        assert_eq!(
            phases.keys().collect::<Vec<_>>(),
            ["kernel", "read", "reply"]
        );
        // Each phase is truncated to whole microseconds on its own.
        let sum: u64 = phases.values().map(|v| v.as_u64().unwrap()).sum();
        let total = line["totalUs"].as_u64().unwrap();
        assert!(sum <= total && total - sum < 3, "{line}");
        assert!(phases["kernel"].as_u64().unwrap() >= 2000, "{line}");
        let (start, end) = (
            line["startMonoUs"].as_u64().unwrap(),
            line["endMonoUs"].as_u64().unwrap(),
        );
        assert!(end - start >= total && end - start - total < 2, "{line}");
        let now = micros(monotonic().unwrap());
        assert!(
            start <= now && end <= now,
            "{line}: the clock is read by other processes too"
        );
    }

    #[test]
    fn lines_are_flushed_once_no_request_is_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.jsonl");
        let tracer = Tracer::create(&path).unwrap();
        let tag = |id: &str| RequestTag {
            op: "ADD".into(),
            container_id: id.into(),
            if_name: "eth0".into(),
            outcome: "ok".into(),
        };
        let lines = || std::fs::read_to_string(&path).unwrap().lines().count();
        let (first, second) = (tracer.begin(), tracer.begin());
        first.record(&tag("c1"), &Phases::start());
        assert_eq!(lines(), 0, "another request is in flight");
        // A request that ends without a line (an unreadable one) counts as done too.
        let third = tracer.begin();
        second.record(&tag("c2"), &Phases::start());
        assert_eq!(lines(), 0);
        drop(third);
        assert_eq!(lines(), 2);
        tracer.begin().record(&tag("c3"), &Phases::start());
        assert_eq!(
            lines(),
            3,
            "alone, a request's line is there when it is done"
        );
    }
}
