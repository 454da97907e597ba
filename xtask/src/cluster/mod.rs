//! `cargo xtask cluster [up|down|check|build|kubectl ARGS…]`: a real Kubernetes cluster in
//! network namespaces, with flock deployed into it from `deploy/`.

use anyhow::{Result, bail};

use crate::sys;

pub mod kube;

/// `cargo xtask cluster …`.
pub fn cluster(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("build") => {
            sys::require_root("cargo xtask cluster build")?;
            let build = kube::ensure_built()?;
            println!("Kubernetes {} in {}", kube::VERSION, build.bin.display());
            Ok(())
        }
        Some(other) => bail!("unknown cluster command {other:?}"),
        None => bail!("usage: cargo xtask cluster [up|down|check|build|kubectl ARGS…]"),
    }
}
