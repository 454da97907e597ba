//! The crate's one error type.

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;

/// What can go wrong while programming, reading or removing kernel state.
///
/// Every variant names the operation and the object (interface, address,
/// route, sysctl); the kernel's errno stays reachable through
/// [`std::error::Error::source`] and [`Error::errno`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The namespace file could not be opened (missing netns, bad path).
    #[error("cannot open network namespace {path}")]
    OpenNetns {
        /// The namespace file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `setns` into the namespace failed.
    #[error("cannot enter network namespace {path}")]
    EnterNetns {
        /// The namespace file.
        path: PathBuf,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// The dedicated namespace thread could not be started or died.
    #[error("namespace thread for {path} failed")]
    NetnsThread {
        /// The namespace file (or `current`).
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A netlink socket could not be opened.
    #[error("cannot open a netlink socket in {ns}")]
    Connect {
        /// The namespace (`current` or a path).
        ns: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A link operation failed.
    #[error("cannot {op} link {ifname} in {ns}")]
    Link {
        /// What was attempted (`create veth`, `set up`, `delete`, `look up`).
        op: &'static str,
        /// The interface.
        ifname: String,
        /// The namespace.
        ns: String,
        /// The kernel's answer.
        #[source]
        source: Box<rtnetlink::Error>,
    },
    /// An address operation failed.
    #[error("cannot {op} address {addr} on {ifname} in {ns}")]
    Address {
        /// What was attempted (`add`, `delete`, `list`).
        op: &'static str,
        /// The address.
        addr: IpNet,
        /// The interface.
        ifname: String,
        /// The namespace.
        ns: String,
        /// The kernel's answer.
        #[source]
        source: Box<rtnetlink::Error>,
    },
    /// A route operation failed.
    #[error("cannot {op} route {route} in {ns}")]
    Route {
        /// What was attempted (`replace`, `delete`, `list`).
        op: &'static str,
        /// The route, written the way `ip route` shows it.
        route: String,
        /// The namespace.
        ns: String,
        /// The kernel's answer.
        #[source]
        source: Box<rtnetlink::Error>,
    },
    /// Reading or writing a sysctl failed.
    #[error("cannot {op} sysctl {path} in {ns}")]
    Sysctl {
        /// `read` or `write`.
        op: &'static str,
        /// The path under `/proc/sys`.
        path: String,
        /// The namespace.
        ns: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A link that must exist does not.
    #[error("link {ifname} not found in {ns}")]
    LinkNotFound {
        /// The interface.
        ifname: String,
        /// The namespace.
        ns: String,
    },
    /// The pod's interface name is taken by a link flock did not create.
    #[error("interface {ifname} already exists in {ns} and is not flock's veth peer of {host_if}")]
    PodIfaceTaken {
        /// The pod's interface name.
        ifname: String,
        /// The pod's namespace.
        ns: String,
        /// The host veth flock wanted to pair it with.
        host_if: String,
    },
    /// The requested interface name cannot be a Linux interface name.
    #[error("invalid interface name {ifname:?}: {reason}")]
    InvalidIfName {
        /// The name.
        ifname: String,
        /// Why.
        reason: &'static str,
    },
    /// An IPv6 anycast address needs an IPv6 unicast address on the pod
    /// (the kernel cannot build IPv6 ECMP routes from device-only nexthops,
    /// so the pod's address is the nexthop's gateway).
    #[error("anycast address {addr} needs the pod on {host_if} to have an ipv6 address")]
    AnycastNeedsIpv6 {
        /// The anycast address.
        addr: IpAddr,
        /// The pod's host veth.
        host_if: String,
    },
}

impl Error {
    /// The kernel's errno (positive, e.g. `libc::ENODEV` = 19) if this error
    /// came from the kernel.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Link { source, .. }
            | Error::Address { source, .. }
            | Error::Route { source, .. } => nl_errno(source),
            Error::OpenNetns { source, .. }
            | Error::Sysctl { source, .. }
            | Error::Connect { source, .. }
            | Error::NetnsThread { source, .. } => source.raw_os_error(),
            Error::EnterNetns { source, .. } => Some(*source as i32),
            _ => None,
        }
    }
}

impl Error {
    /// A failed link operation `op` on `ifname` in namespace `ns`.
    pub(crate) fn link(
        op: &'static str,
        ifname: impl Into<String>,
        ns: &str,
        source: rtnetlink::Error,
    ) -> Error {
        Error::Link {
            op,
            ifname: ifname.into(),
            ns: ns.to_owned(),
            source: Box::new(source),
        }
    }

    /// A failed address operation `op` on `addr` of `ifname` in namespace `ns`.
    pub(crate) fn address(
        op: &'static str,
        addr: IpNet,
        ifname: &str,
        ns: &str,
        source: rtnetlink::Error,
    ) -> Error {
        Error::Address {
            op,
            addr,
            ifname: ifname.to_owned(),
            ns: ns.to_owned(),
            source: Box::new(source),
        }
    }

    /// A failed route operation `op` on `route` in namespace `ns`.
    pub(crate) fn route(
        op: &'static str,
        route: impl Into<String>,
        ns: &str,
        source: rtnetlink::Error,
    ) -> Error {
        Error::Route {
            op,
            route: route.into(),
            ns: ns.to_owned(),
            source: Box::new(source),
        }
    }
}

/// The positive errno of a netlink NACK.
pub(crate) fn nl_errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| c.get().abs()),
        _ => None,
    }
}

/// `pub type Result<T, E = Error>`, as everywhere in flock.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error a teardown met; teardown keeps going past each of them.
#[derive(Debug, thiserror::Error)]
#[error("teardown failed with {} error(s): {}", errors.len(), summary(errors))]
pub struct TeardownError {
    /// The errors, in the order they happened.
    pub errors: Vec<Error>,
}

fn summary(errors: &[Error]) -> String {
    errors
        .iter()
        .map(|e| {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(inner) = src {
                s.push_str(": ");
                s.push_str(&inner.to_string());
                src = inner.source();
            }
            s
        })
        .collect::<Vec<_>>()
        .join("; ")
}
