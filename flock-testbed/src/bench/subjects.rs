//! What the bench measures: the [`Subject`] trait, the reference plugins and flock (the
//! shim and a standalone agent), and the list of subjects in column order.

use std::path::{Path, PathBuf};

use anyhow::Result;
use flock_testkit::Netns;
use flock_testkit::node::{AgentLayout, spawn_agent, wait_until_serving};
use serde_json::{Value, json};

use crate::binaries::FLOCK;

/// Everything a subject needs to set itself up.
pub struct SetupContext<'a> {
    /// The stand-in node namespace the plugins run in (and a daemon, if any).
    pub node: &'a Netns,
    /// A scratch directory of this subject, removed after the run.
    pub work_dir: &'a Path,
    /// `target/release`, holding the packages of [`Subject::release_packages`]
    /// freshly built.
    pub release_dir: &'a Path,
}

/// What a subject hands the runtime: its network configuration list and the
/// plugin search path.
pub struct SubjectConfig {
    /// The conflist (`cniVersion`, `name`, `plugins`).
    pub conflist: Value,
    /// Searched in order for each plugin's `type` (`CNI_PATH`).
    pub bin_dirs: Vec<PathBuf>,
}

/// One CNI implementation under measurement.
pub trait Subject: Send + Sync {
    /// Short key: `reference` and `flock` get a ratio column.
    fn key(&self) -> &str;
    /// Column header, e.g. `reference (ptp + host-local)`.
    fn label(&self) -> &str;
    /// Workspace packages this subject needs built with `--release`
    /// (built once, before any subject is set up).
    fn release_packages(&self) -> &[&'static str] {
        &[]
    }
    /// Prepares the subject in the node namespace (starts its daemon, writes
    /// its files under `work_dir`) and returns its CNI configuration.
    fn setup(&mut self, ctx: &SetupContext<'_>) -> Result<SubjectConfig>;
    /// The pid of the subject's long-running daemon, for its RSS.
    fn daemon_pid(&self) -> Option<u32> {
        None
    }
    /// The daemon's per-request trace (one JSON line per request with its phases), when the
    /// subject writes one.
    fn trace(&self) -> Option<String> {
        None
    }
    /// Stops what `setup` started. (The node namespace's drop kills whatever
    /// is left inside it anyway.)
    fn teardown(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The reference: Debian's `ptp` with `host-local` IPAM, dual stack.
pub struct ReferencePtp;

impl Subject for ReferencePtp {
    fn key(&self) -> &str {
        "reference"
    }

    fn label(&self) -> &str {
        "reference (ptp + host-local)"
    }

    fn setup(&mut self, ctx: &SetupContext<'_>) -> Result<SubjectConfig> {
        // The reference plugins built from their Go module (v1.10, cached per version).
        let plugins = crate::components::cni_plugins().ensure_built()?;
        Ok(SubjectConfig {
            conflist: json!({
                "cniVersion": "1.0.0",
                "name": "bench-ref",
                "plugins": [{
                    "type": "ptp",
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": ctx.work_dir.join("ipam"),
                        "ranges": [[{ "subnet": "10.99.0.0/16" }], [{ "subnet": "2001:db8:99::/64" }]],
                        "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
                    }
                }]
            }),
            bin_dirs: vec![plugins.bin],
        })
    }
}

/// flock: the release shim and a standalone release agent in the node namespace, dual stack.
#[derive(Default)]
pub struct Flock {
    agent: Option<std::process::Child>,
    trace: Option<PathBuf>,
}

impl Subject for Flock {
    fn key(&self) -> &str {
        "flock"
    }

    fn label(&self) -> &str {
        "flock (shim + agent)"
    }

    fn release_packages(&self) -> &[&'static str] {
        FLOCK
    }

    fn setup(&mut self, ctx: &SetupContext<'_>) -> Result<SubjectConfig> {
        let layout = AgentLayout::new(&ctx.work_dir.join("agent"));
        std::fs::create_dir_all(ctx.work_dir.join("agent"))?;
        std::fs::write(
            &layout.node_config,
            "apiVersion: flock.fritzlab.net/v1alpha1\nkind: NodeConfig\nmetadata:\n  name: bench\n\
             spec:\n  cidr6: 2001:db8:98::/64\n  cidr4: 10.98.0.0/16\n",
        )?;
        let trace = ctx.work_dir.join("agent-trace.jsonl");
        let mut child = spawn_agent(
            ctx.node.name(),
            &ctx.release_dir.join("flock-agent"),
            &layout,
            &[
                ("FLOCK_LOG".into(), "warn".into()),
                ("FLOCK_TRACE".into(), trace.display().to_string()),
            ],
        )
        .map_err(anyhow::Error::msg)?;
        wait_until_serving(&mut child, &layout).map_err(anyhow::Error::msg)?;
        self.agent = Some(child);
        self.trace = Some(trace);
        Ok(SubjectConfig {
            conflist: layout.conflist("bench-flock"),
            bin_dirs: vec![ctx.release_dir.to_owned()],
        })
    }

    fn daemon_pid(&self) -> Option<u32> {
        self.agent.as_ref().map(std::process::Child::id)
    }

    fn trace(&self) -> Option<String> {
        std::fs::read_to_string(self.trace.as_ref()?).ok()
    }

    fn teardown(&mut self) -> Result<()> {
        if let Some(mut child) = self.agent.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }
}

/// Every subject the harness knows, in column order.
pub fn subjects() -> Vec<Box<dyn Subject>> {
    vec![Box::new(Flock::default()), Box::new(ReferencePtp)]
}
