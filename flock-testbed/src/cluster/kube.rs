//! The binaries a cluster runs, for the Kubernetes release it runs.
//!
//! Every component is built from its Go module by [`crate::components`] and cached per
//! version. `up` records the release it starts in `RUN_DIR/kubernetes`, so that every later
//! command against that cluster (`kubectl`, `e2e`, `life`) finds the same binaries.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::RUN_DIR;
use crate::components::{self, Built};
use crate::versions::Kubernetes;

pub use crate::components::cache_dir;

/// Every binary of one cluster: Kubernetes, containerd, runc, etcd, CoreDNS and the reference
/// CNI plugins.
#[derive(Debug, Clone)]
pub struct KubeBuild {
    /// The release.
    pub kubernetes: Kubernetes,
    kube: Built,
    containerd: Built,
    runc: Built,
    etcd: Built,
    coredns: Built,
    cni: Built,
    /// The suites' binaries ([`KubeBuild::with_e2e`]), once built.
    e2e: Option<Built>,
}

impl KubeBuild {
    /// A binary of Kubernetes (`kubelet`, `kubectl` …), or of its suites (`e2e.test`,
    /// `agnhost`, `ginkgo` …) once [`with_e2e`](Self::with_e2e) has built them.
    pub fn tool(&self, name: &str) -> PathBuf {
        match &self.e2e {
            Some(e2e) if !self.kube.bin.join(name).exists() => e2e.tool(name),
            _ => self.kube.tool(name),
        }
    }

    /// The same, with the binaries Kubernetes' own suites need (`e2e.test`, agnhost,
    /// ginkgo), building them when the cache lacks them.
    pub fn with_e2e(mut self) -> Result<KubeBuild> {
        if self.e2e.is_none() {
            let list = [components::kubernetes_e2e(self.kubernetes)];
            self.e2e = components::ensure_all(&list)?.pop();
        }
        Ok(self)
    }

    /// containerd's folder: `containerd`, `containerd-shim-runc-v2`, `ctr`.
    pub fn containerd_bin(&self) -> &Path {
        &self.containerd.bin
    }

    /// `ctr`, containerd's client.
    pub fn ctr(&self) -> PathBuf {
        self.containerd.tool("ctr")
    }

    /// runc.
    pub fn runc(&self) -> PathBuf {
        self.runc.tool("runc")
    }

    /// The etcd server.
    pub fn etcd(&self) -> PathBuf {
        self.etcd.tool("etcd")
    }

    /// CoreDNS.
    pub fn coredns(&self) -> PathBuf {
        self.coredns.tool("coredns")
    }

    /// A reference CNI plugin (`loopback`, `ptp`, `host-local`, `portmap`, `bandwidth`).
    pub fn cni_plugin(&self, name: &str) -> PathBuf {
        self.cni.tool(name)
    }
}

/// The file in which `up` records the release of the cluster that is up.
fn release_file() -> PathBuf {
    Path::new(RUN_DIR).join("kubernetes")
}

/// The release of the cluster that is up; the newest when none is.
pub fn current() -> Kubernetes {
    std::fs::read_to_string(release_file())
        .ok()
        .and_then(|t| Kubernetes::parse(&t).ok())
        .unwrap_or_else(Kubernetes::newest)
}

/// Records `k` as the release of the cluster that is coming up.
pub fn record(k: Kubernetes) -> Result<()> {
    std::fs::write(release_file(), k.to_string())
        .with_context(|| format!("write {}", release_file().display()))
}

/// `kubectl` of the cluster that is up (or of the newest release).
pub fn kubectl() -> PathBuf {
    components::kubernetes(current()).dir().join("bin/kubectl")
}

/// The binaries of the cluster that is up, building what is missing.
pub fn ensure_built() -> Result<KubeBuild> {
    ensure_release(current())
}

/// Every binary of a cluster of release `k`, building what the cache lacks (printing each
/// component's build time).
pub fn ensure_release(k: Kubernetes) -> Result<KubeBuild> {
    let list = components::cluster(k);
    let built = components::ensure_all(&list)?;
    let of = |name: &str| {
        list.iter()
            .zip(&built)
            .find(|(c, _)| c.name == name)
            .map(|(_, b)| b.clone())
            .with_context(|| format!("the cluster's components have no {name}"))
    };
    let (cni, runc, etcd) = (of("cni-plugins")?, of("runc")?, of("etcd")?);
    let (containerd, coredns, kube) = (of("containerd")?, of("coredns")?, of("kubernetes")?);
    Ok(KubeBuild {
        kubernetes: k,
        kube,
        containerd,
        runc,
        etcd,
        coredns,
        cni,
        e2e: None,
    })
}
