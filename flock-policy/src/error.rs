//! The one error type of this crate.

/// What is wrong with a [`Policy`](crate::Policy) or a [`Pod`](crate::Pod); every variant names
/// the object, the field and the value, so the message alone says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A label selector requirement that Kubernetes would refuse.
    #[error("{policy}: {field} {key:?} {operator}: {reason}")]
    Selector {
        /// The policy: its kind and name (`networkpolicy shop/web`, `clusternetworkpolicy deny-all`).
        policy: String,
        /// Where (`spec.podSelector.matchExpressions[0]`).
        field: String,
        /// The requirement's key.
        key: String,
        /// The operator (`In`, `NotIn`, `Exists`, `DoesNotExist`).
        operator: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// A peer with neither `podSelector` nor `namespaceSelector` (nor `ipBlock`).
    #[error("{policy}: {field} selects nothing: give podSelector, namespaceSelector or ipBlock")]
    EmptyPeer {
        /// The policy: its kind and name (`networkpolicy shop/web`, `clusternetworkpolicy deny-all`).
        policy: String,
        /// Where (`spec.ingress[0].from[1]`).
        field: String,
    },
    /// An `ipBlock.cidr` or `except` entry that is not a CIDR.
    #[error("{policy}: {field} {value:?} is not a CIDR (like 10.0.0.0/8 or 2001:db8::/32)")]
    Cidr {
        /// The policy: its kind and name (`networkpolicy shop/web`, `clusternetworkpolicy deny-all`).
        policy: String,
        /// Where (`spec.egress[0].to[0].ipBlock.cidr`).
        field: String,
        /// The value as given.
        value: String,
        /// Why it did not parse.
        #[source]
        source: ipnet::AddrParseError,
    },
    /// An `ipBlock.except` entry that is not strictly inside its `cidr`.
    #[error("{policy}: {field} {value} is not strictly inside ipBlock.cidr {cidr}")]
    ExceptOutside {
        /// The policy: its kind and name (`networkpolicy shop/web`, `clusternetworkpolicy deny-all`).
        policy: String,
        /// Where (`spec.ingress[0].from[0].ipBlock.except[1]`).
        field: String,
        /// The except entry.
        value: String,
        /// The block's CIDR.
        cidr: String,
    },
    /// Port 0.
    #[error("{policy}: {field} 0 is not a port (1 to 65535)")]
    PortZero {
        /// The policy: its kind and name (`networkpolicy shop/web`, `clusternetworkpolicy deny-all`).
        policy: String,
        /// Where (`spec.ingress[0].ports[0].port`).
        field: String,
    },
    /// A port name Kubernetes would refuse (IANA service name syntax).
    #[error("{policy}: {field} {value:?} is not a port name: {reason}")]
    PortName {
        /// The policy: its kind and name (`networkpolicy shop/web`, `clusternetworkpolicy deny-all`).
        policy: String,
        /// Where (`spec.ingress[0].ports[0].port`).
        field: String,
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// `endPort` without a numeric `port`.
    #[error(
        "{policy}: {field} {end_port} needs a numeric port (a named port or no port cannot start a range)"
    )]
    EndPortWithoutNumber {
        /// The policy: its kind and name (`networkpolicy shop/web`, `clusternetworkpolicy deny-all`).
        policy: String,
        /// Where (`spec.ingress[0].ports[0].endPort`).
        field: String,
        /// The value as given.
        end_port: u16,
    },
    /// `endPort` below `port`.
    #[error("{policy}: {field} {end_port} is below port {port}")]
    EndPortBelowPort {
        /// The policy: its kind and name (`networkpolicy shop/web`, `clusternetworkpolicy deny-all`).
        policy: String,
        /// Where (`spec.ingress[0].ports[0].endPort`).
        field: String,
        /// The range's start.
        port: u16,
        /// The value as given.
        end_port: u16,
    },
    /// A value the API's schema refuses (a cluster policy's priority, peer kind, port range).
    #[error("{policy}: {field} {value:?}: {reason}")]
    Invalid {
        /// The policy: its kind and name.
        policy: String,
        /// Where (`spec.priority`).
        field: String,
        /// The value.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A pod's host interface name that cannot be a Linux interface or an nftables name.
    #[error("pod {pod}: host interface {value:?} {reason}")]
    HostIf {
        /// `namespace/name` of the pod.
        pod: String,
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A flow to explain that no packet could be, or whose answer depends on which of several
    /// local pods sends or receives it.
    #[error("cannot explain the flow: {field} {value} {reason}")]
    Flow {
        /// Which part of the flow (`src`, `dst`, `transport`).
        field: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The same pod (namespace, name and host interface) given twice.
    #[error("pod {pod} is given twice (on the same host interface, if any)")]
    DuplicatePod {
        /// `namespace/name`.
        pod: String,
    },
    /// Two local pods on the same host interface.
    #[error("pods {first} and {second} both claim host interface {host_if:?}")]
    DuplicateHostIf {
        /// The interface.
        host_if: String,
        /// `namespace/name` of one pod.
        first: String,
        /// `namespace/name` of the other.
        second: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
