//! The crate's one error type.

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;

/// What can go wrong while programming, reading or removing kernel state.
///
/// Every variant names the operation and the object (interface, address,
/// route, sysctl); the message does not repeat the cause. The kernel's answer is
/// the [`std::error::Error::source`] — for netlink an [`io::Error`] of the errno
/// the kernel returned — so a cause-chain formatter prints, e.g.,
/// `cannot replace route 2001:db8::1/128 dev flock1234abcd in current netns: File exists (os error 17)`,
/// and [`Error::errno`] gives the number.
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
        /// Why (the errno, as an OS error: no `nix` type in this crate's API).
        #[source]
        source: io::Error,
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
        /// The kernel's answer: its errno as an [`io::Error`] (or what else
        /// went wrong with the netlink request).
        #[source]
        source: io::Error,
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
        /// The kernel's answer: its errno as an [`io::Error`] (or what else
        /// went wrong with the netlink request).
        #[source]
        source: io::Error,
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
        /// The kernel's answer: its errno as an [`io::Error`] (or what else
        /// went wrong with the netlink request).
        #[source]
        source: io::Error,
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
    /// A sysctl of the node has a value flock cannot work with and cannot be written (a
    /// read-only `/proc/sys`, as in a container that is not privileged).
    #[error(
        "sysctl {path} in {ns} is {actual}, flock needs {want}, and writing it failed \
         (set it on the node: sysctl -w {dotted}={want})",
        dotted = path.replace('/', ".")
    )]
    SysctlWanted {
        /// The path under `/proc/sys`.
        path: String,
        /// The namespace.
        ns: String,
        /// The value found.
        actual: String,
        /// The value flock needs.
        want: &'static str,
        /// Why the write failed.
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
            | Error::Route { source, .. }
            | Error::OpenNetns { source, .. }
            | Error::Sysctl { source, .. }
            | Error::SysctlWanted { source, .. }
            | Error::Connect { source, .. }
            | Error::NetnsThread { source, .. }
            | Error::EnterNetns { source, .. } => source.raw_os_error(),
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
            source: kernel_answer(source),
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
            source: kernel_answer(source),
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
            source: kernel_answer(source),
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

/// What the kernel answered, as the source of an [`Error`]: a NACK becomes the [`io::Error`]
/// of its errno (`File exists (os error 17)`), anything else (a malformed or unexpected
/// message) keeps rtnetlink's error inside an [`io::Error`].
fn kernel_answer(e: rtnetlink::Error) -> io::Error {
    match nl_errno(&e) {
        Some(errno) => io::Error::from_raw_os_error(errno),
        None => io::Error::other(e),
    }
}

/// `pub type Result<T, E = Error>`, as everywhere in flock.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error a teardown met; teardown keeps going past each of them.
///
/// Several errors have several cause chains, and [`std::error::Error::source`] can name only
/// one: so the message lists every error with its whole chain (the kernel's errno included),
/// and `source()` is `None`, so a cause-chain formatter prints nothing twice.
#[derive(Debug, thiserror::Error)]
#[error("teardown failed with {} error(s): {}", errors.len(), summary(errors))]
pub struct TeardownError {
    /// The errors, in the order they happened; each keeps its own source chain.
    pub errors: Vec<Error>,
}

/// Each error and its causes, `: `-joined; the errors `; `-joined.
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

#[cfg(test)]
mod tests {
    use std::num::NonZeroI32;

    use super::*;

    /// The message and every source below it, `: `-joined (what a caller's formatter prints).
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(cause) = next {
            out.push_str(": ");
            out.push_str(&cause.to_string());
            next = cause.source();
        }
        out
    }

    fn nack(errno: i32) -> rtnetlink::Error {
        let mut m = rtnetlink::packet_core::ErrorMessage::default();
        m.code = NonZeroI32::new(-errno);
        rtnetlink::Error::NetlinkError(m)
    }

    #[test]
    fn a_failed_setns_is_an_os_error_with_its_errno() {
        let e = Error::EnterNetns {
            path: "/run/netns/gone".into(),
            source: io::Error::from(nix::errno::Errno::EPERM),
        };
        assert_eq!(
            chain(&e),
            "cannot enter network namespace /run/netns/gone: Operation not permitted (os error 1)"
        );
        assert_eq!(e.errno(), Some(1));
    }

    #[test]
    fn the_kernel_errno_is_the_source() {
        let e = Error::route(
            "add",
            "2001:db8::1/128 dev flock1234abcd",
            "current netns",
            nack(17),
        );
        assert_eq!(
            e.to_string(),
            "cannot add route 2001:db8::1/128 dev flock1234abcd in current netns"
        );
        assert_eq!(
            chain(&e),
            "cannot add route 2001:db8::1/128 dev flock1234abcd in current netns: File exists (os error 17)"
        );
        assert_eq!(e.errno(), Some(17));
        let e = Error::link("delete", "flock1234abcd", "/run/netns/n", nack(19));
        assert!(
            chain(&e).ends_with(": No such device (os error 19)"),
            "{}",
            chain(&e)
        );
        // not a NACK: no errno, but the cause is still in the chain
        let e = Error::address(
            "add",
            "fe80::1/64".parse().unwrap(),
            "flock1234abcd",
            "current netns",
            rtnetlink::Error::RequestFailed,
        );
        assert_eq!(e.errno(), None);
        assert!(
            chain(&e).ends_with(": A netlink request failed"),
            "{}",
            chain(&e)
        );
    }

    #[test]
    fn a_teardown_error_lists_every_chain_once() {
        let t = TeardownError {
            errors: vec![
                Error::route("delete", "10.0.0.1/32 dev flock1", "current netns", nack(1)),
                Error::link("delete", "flock1", "current netns", nack(16)),
            ],
        };
        assert_eq!(
            chain(&t),
            "teardown failed with 2 error(s): cannot delete route 10.0.0.1/32 dev flock1 in current netns: Operation not permitted (os error 1); cannot delete link flock1 in current netns: Device or resource busy (os error 16)"
        );
        assert!(std::error::Error::source(&t).is_none());
    }
}
