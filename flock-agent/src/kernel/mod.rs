//! What the agent asks of the kernel, behind one small trait: set up, check, detach and tear
//! down a pod; list and remove host interfaces; anycast routes; node CIDR blackholes; and the
//! two facts start-up needs (the boot ID, whether a namespace file still exists).
//!
//! [`NetnsKernel`] is the real one (`flock-netns` over rtnetlink, in the node's namespace);
//! [`memory::MemoryKernel`] keeps the same state in memory, so the handlers and their
//! property tests run without root.

use std::net::IpAddr;
use std::path::Path;

use flock_netns::{AnycastMember, Mismatch, NodeNs, PodSpec, SetupOutcome, TeardownError};
use ipnet::IpNet;

pub mod memory;

use futures::future::BoxFuture;

/// The kernel's error: `flock-netns`'s, with the operation, the object and the errno.
pub type KernelError = flock_netns::Error;

/// Everything the agent does to (or reads from) the kernel.
///
/// Every method is idempotent in the sense of DESIGN §5: setting up twice yields the same
/// state, and removing what is already gone succeeds.
pub trait Kernel: Send + Sync + 'static {
    /// Creates (or re-creates) the veth pair, addresses and routes of one pod.
    fn setup<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<SetupOutcome, KernelError>>;

    /// Every difference between the kernel and what `spec` says.
    fn check<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<Vec<Mismatch>, KernelError>>;

    /// Removes what routes traffic to the pod (host routes, anycast next hops) but keeps its
    /// veth, whose deletion is slow and may happen later.
    fn detach<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<(), TeardownError>>;

    /// Removes everything of one pod, its veth included.
    fn teardown<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<(), TeardownError>>;

    /// The names of the node's `flock*` host interfaces.
    fn host_ifaces(&self) -> BoxFuture<'_, Result<Vec<String>, KernelError>>;

    /// Deletes one host interface; `Ok(false)` when it did not exist.
    fn remove_host_iface<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, KernelError>>;

    /// Sets the route of an anycast address to exactly `members` (none: no route).
    fn sync_anycast<'a>(
        &'a self,
        addr: IpAddr,
        members: &'a [AnycastMember],
    ) -> BoxFuture<'a, Result<(), KernelError>>;

    /// Installs the blackhole routes of the node CIDRs.
    fn ensure_blackholes<'a>(
        &'a self,
        cidrs: &'a [IpNet],
    ) -> BoxFuture<'a, Result<(), KernelError>>;

    /// Removes the blackhole of a CIDR the node no longer owns.
    fn remove_blackhole(&self, cidr: IpNet) -> BoxFuture<'_, Result<(), KernelError>>;

    /// The kernel's boot ID: a record made under another one has lost its namespace.
    fn boot_id(&self) -> String;

    /// Whether a pod's namespace file still exists.
    fn netns_exists(&self, path: &Path) -> bool;

    /// The MTU of the node's interface toward a BGP neighbor (`None`: no route leads there).
    fn uplink_mtu<'a>(
        &'a self,
        toward: flock_netns::Toward<'a>,
    ) -> BoxFuture<'a, Result<Option<u32>, KernelError>>;
}

/// The real kernel: `flock-netns` in the node's namespace.
#[derive(Debug)]
pub struct NetnsKernel {
    node: NodeNs,
}

impl NetnsKernel {
    /// The kernel as seen from `node` (the agent's own namespace in production).
    pub fn new(node: NodeNs) -> NetnsKernel {
        NetnsKernel { node }
    }
}

impl Kernel for NetnsKernel {
    fn setup<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<SetupOutcome, KernelError>> {
        Box::pin(flock_netns::setup(&self.node, spec))
    }

    fn check<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<Vec<Mismatch>, KernelError>> {
        Box::pin(flock_netns::check(&self.node, spec))
    }

    fn detach<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<(), TeardownError>> {
        Box::pin(flock_netns::detach(&self.node, spec))
    }

    fn teardown<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<(), TeardownError>> {
        Box::pin(flock_netns::teardown(&self.node, spec))
    }

    fn host_ifaces(&self) -> BoxFuture<'_, Result<Vec<String>, KernelError>> {
        Box::pin(async move {
            let ifaces = flock_netns::list_host_ifaces(&self.node).await?;
            Ok(ifaces.into_iter().map(|i| i.name).collect())
        })
    }

    fn remove_host_iface<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, KernelError>> {
        Box::pin(flock_netns::remove_host_iface(&self.node, name))
    }

    fn sync_anycast<'a>(
        &'a self,
        addr: IpAddr,
        members: &'a [AnycastMember],
    ) -> BoxFuture<'a, Result<(), KernelError>> {
        Box::pin(flock_netns::sync_anycast(&self.node, addr, members))
    }

    fn ensure_blackholes<'a>(
        &'a self,
        cidrs: &'a [IpNet],
    ) -> BoxFuture<'a, Result<(), KernelError>> {
        Box::pin(flock_netns::ensure_blackholes(&self.node, cidrs))
    }

    fn remove_blackhole(&self, cidr: IpNet) -> BoxFuture<'_, Result<(), KernelError>> {
        Box::pin(flock_netns::remove_blackhole(&self.node, cidr))
    }

    fn boot_id(&self) -> String {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    }

    fn netns_exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn uplink_mtu<'a>(
        &'a self,
        toward: flock_netns::Toward<'a>,
    ) -> BoxFuture<'a, Result<Option<u32>, KernelError>> {
        Box::pin(async move {
            Ok(flock_netns::uplink(&self.node, toward)
                .await?
                .map(|u| u.mtu))
        })
    }
}
