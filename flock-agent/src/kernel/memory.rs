//! [`MemoryKernel`]: the kernel state the agent programs, kept in memory.
//!
//! It models what the agent relies on — host veths and the pod interfaces behind them, host
//! routes, anycast next-hop sets, blackholes, which namespace files exist, the boot ID — with
//! the real kernel's idempotence, and lets a test fail a chosen operation. It outlives an
//! agent, as the kernel outlives a crashed process, so a test can restart the agent on it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use flock_netns::{AnycastMember, Mismatch, PodSpec, RouteSpec, SetupOutcome, Side, TeardownError};
use ipnet::IpNet;

use super::{BoxFuture, Kernel, KernelError};

/// One host veth and the pod interface at its other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryVeth {
    /// The pod's namespace file.
    pub netns: PathBuf,
    /// The pod-side name.
    pub if_name: String,
    /// The MTU of both ends.
    pub mtu: u32,
    /// The addresses on the pod interface.
    pub addresses: Vec<IpNet>,
}

/// An operation a test can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultOp {
    /// [`Kernel::setup`].
    Setup,
    /// [`Kernel::detach`] and the routing part of [`Kernel::teardown`].
    Detach,
    /// [`Kernel::remove_host_iface`].
    RemoveIface,
    /// [`Kernel::ensure_blackholes`].
    Blackholes,
}

/// The whole in-memory kernel state, readable by tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryState {
    /// The boot ID.
    pub boot_id: String,
    /// Namespace files that exist.
    pub namespaces: BTreeSet<PathBuf>,
    /// Host veths by name.
    pub veths: BTreeMap<String, MemoryVeth>,
    /// Host routes `/128` and `/32` → host veth.
    pub host_routes: BTreeMap<IpNet, String>,
    /// Anycast address → host veths of its next hops.
    pub anycast: BTreeMap<IpAddr, BTreeSet<String>>,
    /// Blackhole routes.
    pub blackholes: BTreeSet<IpNet>,
    /// The uplink's MTU ([`Kernel::uplink_mtu`]): `None`, no route to the neighbor.
    pub uplink_mtu: Option<u32>,
}

/// The in-memory kernel.
#[derive(Debug, Default)]
pub struct MemoryKernel {
    state: Mutex<MemoryState>,
    faults: Mutex<BTreeMap<FaultOp, u32>>,
}

impl MemoryKernel {
    /// An empty kernel with this boot ID.
    pub fn new(boot_id: &str) -> MemoryKernel {
        MemoryKernel {
            state: Mutex::new(MemoryState {
                boot_id: boot_id.to_owned(),
                ..MemoryState::default()
            }),
            faults: Mutex::default(),
        }
    }

    /// Sets the uplink's MTU ([`Kernel::uplink_mtu`]; `None`: no route to the neighbor).
    pub fn set_uplink_mtu(&self, mtu: Option<u32>) {
        self.lock().uplink_mtu = mtu;
    }

    /// A copy of the current state.
    pub fn state(&self) -> MemoryState {
        self.lock().clone()
    }

    /// Creates a namespace file (what a runtime does before ADD).
    pub fn add_netns(&self, path: impl Into<PathBuf>) {
        self.lock().namespaces.insert(path.into());
    }

    /// Deletes a namespace file and, as the kernel does, every veth whose pod end was in it.
    pub fn remove_netns(&self, path: &Path) {
        let mut s = self.lock();
        s.namespaces.remove(path);
        let gone: Vec<String> = s
            .veths
            .iter()
            .filter(|(_, v)| v.netns == path)
            .map(|(n, _)| n.clone())
            .collect();
        for name in &gone {
            s.veths.remove(name);
        }
        s.host_routes.retain(|_, dev| !gone.contains(dev));
        for members in s.anycast.values_mut() {
            members.retain(|m| !gone.contains(m));
        }
        s.anycast.retain(|_, m| !m.is_empty());
    }

    /// A reboot: a new boot ID and no namespace, veth or route left.
    pub fn reboot(&self, boot_id: &str) {
        *self.lock() = MemoryState {
            boot_id: boot_id.to_owned(),
            ..MemoryState::default()
        };
    }

    /// Makes the next `times` calls of `op` fail.
    pub fn fail_next(&self, op: FaultOp, times: u32) {
        self.faults.lock().expect("faults lock").insert(op, times);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().expect("memory kernel lock")
    }

    fn fault(&self, op: FaultOp, what: &str) -> Result<(), KernelError> {
        let mut faults = self.faults.lock().expect("faults lock");
        match faults.get_mut(&op) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(KernelError::NetnsThread {
                    path: PathBuf::from(what),
                    source: std::io::Error::from_raw_os_error(5), // EIO
                })
            }
            _ => Ok(()),
        }
    }

    fn detach_locked(s: &mut MemoryState, spec: &PodSpec) {
        for addr in &spec.addresses {
            let host = host_prefix(addr.addr());
            if s.host_routes.get(&host) == Some(&spec.host_if) {
                s.host_routes.remove(&host);
            }
        }
        for a in &spec.anycast {
            if let Some(members) = s.anycast.get_mut(a) {
                members.remove(&spec.host_if);
                if members.is_empty() {
                    s.anycast.remove(a);
                }
            }
        }
    }
}

fn host_prefix(addr: IpAddr) -> IpNet {
    IpNet::new(addr, if addr.is_ipv4() { 32 } else { 128 }).expect("a host prefix is valid")
}

impl Kernel for MemoryKernel {
    fn setup<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<SetupOutcome, KernelError>> {
        Box::pin(async move {
            self.fault(FaultOp::Setup, &spec.host_if)?;
            let mut s = self.lock();
            if !s.namespaces.contains(&spec.netns) {
                return Err(KernelError::OpenNetns {
                    path: spec.netns.clone(),
                    source: std::io::Error::from_raw_os_error(2), // ENOENT
                });
            }
            s.veths.insert(
                spec.host_if.clone(),
                MemoryVeth {
                    netns: spec.netns.clone(),
                    if_name: spec.if_name.clone(),
                    mtu: spec.mtu,
                    addresses: spec.addresses.clone(),
                },
            );
            for addr in &spec.addresses {
                s.host_routes
                    .insert(host_prefix(addr.addr()), spec.host_if.clone());
            }
            for a in &spec.anycast {
                s.anycast
                    .entry(*a)
                    .or_default()
                    .insert(spec.host_if.clone());
            }
            Ok(SetupOutcome {
                host_if: spec.host_if.clone(),
                host_mac: "02:00:00:00:00:01".into(),
                pod_if: spec.if_name.clone(),
                pod_mac: "02:00:00:00:00:02".into(),
                sandbox: spec.netns.clone(),
                timing: flock_netns::SetupTiming::default(),
            })
        })
    }

    fn check<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<Vec<Mismatch>, KernelError>> {
        Box::pin(async move {
            let s = self.lock();
            let mut out = Vec::new();
            if !s.namespaces.contains(&spec.netns) {
                out.push(Mismatch::NetnsMissing {
                    path: spec.netns.clone(),
                });
            }
            match s.veths.get(&spec.host_if) {
                None => out.push(Mismatch::LinkMissing {
                    side: Side::Host,
                    ifname: spec.host_if.clone(),
                }),
                Some(veth) => {
                    for addr in spec
                        .addresses
                        .iter()
                        .filter(|a| !veth.addresses.contains(a))
                    {
                        out.push(Mismatch::AddressMissing {
                            side: Side::Pod,
                            ifname: spec.if_name.clone(),
                            addr: *addr,
                        });
                    }
                    for addr in veth
                        .addresses
                        .iter()
                        .filter(|a| !spec.addresses.contains(a))
                    {
                        out.push(Mismatch::AddressExtra {
                            side: Side::Pod,
                            ifname: spec.if_name.clone(),
                            addr: *addr,
                        });
                    }
                }
            }
            for addr in &spec.addresses {
                let dst = host_prefix(addr.addr());
                if s.host_routes.get(&dst) != Some(&spec.host_if) {
                    out.push(Mismatch::RouteMissing {
                        side: Side::Host,
                        route: RouteSpec {
                            dst,
                            gateway: None,
                            dev: spec.host_if.clone(),
                            onlink: false,
                        },
                    });
                }
            }
            for a in &spec.anycast {
                if !s.anycast.get(a).is_some_and(|m| m.contains(&spec.host_if)) {
                    out.push(Mismatch::AnycastNexthopMissing {
                        addr: *a,
                        host_if: spec.host_if.clone(),
                    });
                }
            }
            Ok(out)
        })
    }

    fn detach<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<(), TeardownError>> {
        Box::pin(async move {
            self.fault(FaultOp::Detach, &spec.host_if)
                .map_err(|e| TeardownError { errors: vec![e] })?;
            Self::detach_locked(&mut self.lock(), spec);
            Ok(())
        })
    }

    fn teardown<'a>(&'a self, spec: &'a PodSpec) -> BoxFuture<'a, Result<(), TeardownError>> {
        Box::pin(async move {
            self.fault(FaultOp::Detach, &spec.host_if)
                .map_err(|e| TeardownError { errors: vec![e] })?;
            let mut s = self.lock();
            Self::detach_locked(&mut s, spec);
            s.veths.remove(&spec.host_if);
            Ok(())
        })
    }

    fn host_ifaces(&self) -> BoxFuture<'_, Result<Vec<String>, KernelError>> {
        Box::pin(async move { Ok(self.lock().veths.keys().cloned().collect()) })
    }

    fn remove_host_iface<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, KernelError>> {
        Box::pin(async move {
            self.fault(FaultOp::RemoveIface, name)?;
            let mut s = self.lock();
            // The kernel drops a deleted link's routes with it.
            s.host_routes.retain(|_, dev| dev != name);
            Ok(s.veths.remove(name).is_some())
        })
    }

    fn sync_anycast<'a>(
        &'a self,
        addr: IpAddr,
        members: &'a [AnycastMember],
    ) -> BoxFuture<'a, Result<(), KernelError>> {
        Box::pin(async move {
            let mut s = self.lock();
            let set: BTreeSet<String> = members.iter().map(|m| m.host_if.clone()).collect();
            if set.is_empty() {
                s.anycast.remove(&addr);
            } else {
                s.anycast.insert(addr, set);
            }
            Ok(())
        })
    }

    fn ensure_blackholes<'a>(
        &'a self,
        cidrs: &'a [IpNet],
    ) -> BoxFuture<'a, Result<(), KernelError>> {
        Box::pin(async move {
            self.fault(FaultOp::Blackholes, "blackholes")?;
            self.lock().blackholes.extend(cidrs.iter().copied());
            Ok(())
        })
    }

    fn remove_blackhole(&self, cidr: IpNet) -> BoxFuture<'_, Result<(), KernelError>> {
        Box::pin(async move {
            self.lock().blackholes.remove(&cidr);
            Ok(())
        })
    }

    fn boot_id(&self) -> String {
        self.lock().boot_id.clone()
    }

    fn netns_exists(&self, path: &Path) -> bool {
        self.lock().namespaces.contains(path)
    }

    fn uplink_mtu<'a>(
        &'a self,
        _toward: flock_netns::Toward<'a>,
    ) -> BoxFuture<'a, Result<Option<u32>, KernelError>> {
        let mtu = self.lock().uplink_mtu;
        Box::pin(async move { Ok(mtu) })
    }
}
