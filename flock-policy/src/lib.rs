//! Kubernetes NetworkPolicy and ClusterNetworkPolicy semantics for flock, enforced with
//! nftables. Pure: no I/O.
//!
//! - Input: [`Policy`] (with [`Rule`], [`Peer`], [`PortSpec`], [`LabelSelector`]),
//!   [`ClusterPolicy`] (with [`ClusterRule`], [`ClusterPeer`], [`ClusterPort`]),
//!   [`Namespace`] and [`Pod`], plain structs the agent fills from the API objects.
//! - [`build`] resolves them into the node's per-pod rule model, a [`Ruleset`]: for each
//!   local pod (keyed by its host veth) whether it is isolated for ingress and for egress,
//!   and the [`Allow`] rules that admit traffic, over named address sets.
//! - [`Ruleset::render`] writes it as one `nft -f` script (deterministic bytes; one
//!   transaction replaces flock's table); [`Ruleset::update_from`] writes set-element
//!   changes only, when nothing but selector membership changed.
//! - [`Ruleset::verdict`] evaluates a [`Packet`] exactly as the rendered table does.
//! - [`Model::explain`] answers "what happens to this [`Flow`], and why": the verdict and, for
//!   the sender's egress and the receiver's ingress, the policy rule that decided (an
//!   [`Explanation`], one line for a log), from the chains the ruleset holds.
//!
//! # Semantics
//!
//! As the Kubernetes API documents them: a pod is isolated for a direction when any policy
//! of its namespace selects it with that direction in its (defaulted) `policyTypes`; then
//! only the union of those policies' rules is allowed. A connection passes when the
//! sender's egress *and* the receiver's ingress allow it — each node checks its own pods:
//! traffic a pod sends enters the node's namespace through its host veth (`iifname`: its
//! egress), traffic to a pod leaves through it (`oifname`: its ingress). Decisions where the
//! API leaves room:
//!
//! - **Peers are addresses.** Policies are enforced on packets, so a `Pods` peer is the set
//!   of every address of the selected pods (its /128, /32, fixed `addresses`, anycast), and
//!   an address carried by several pods (anycast) stands for each of them. `ipBlock` matches
//!   by address and so matches cluster pods' addresses too (the API leaves this to the
//!   implementation; matching by address is what the packet shows and what users expect of
//!   `0.0.0.0/0`). An `ipBlock` of `/0` with no except is "every address of the family".
//! - **Named ports** resolve on the destination pod, matching name *and* protocol. For
//!   ingress that is the selected pod, so each pod's chain holds its own numbers; a name the
//!   pod lacks matches nothing (a rule whose ports all fail to resolve allows nothing — not
//!   "all ports"). For egress the destination is found by address: the rule matches a
//!   (destination address, port) pair of a set holding every pod address with the port
//!   number that name has on that pod. So an egress named port to an `ipBlock` matches only
//!   pods inside the block that have the name; addresses outside the cluster never match a
//!   name.
//! - **Node traffic always passes**: the table hooks only `forward`. Traffic between a pod
//!   and its own node (kubelet probes, host services) goes through `input`/`output` and is
//!   never looked at; traffic from other nodes is ordinary traffic subject to `ipBlock`.
//! - **Replies pass**: `ct state established,related accept` comes first, so only the
//!   first packet of a connection is judged, and ICMP errors about allowed connections pass.
//! - **ICMP that keeps the network working** is never dropped: ICMPv6 packet-too-big and
//!   router/neighbour solicitation/advertisement, ICMPv4 fragmentation-needed. Everything else,
//!   echo included, is policy-controlled: a rule with ports admits only those protocols.
//! - A namespace the caller does not list has only the `kubernetes.io/metadata.name` label,
//!   which is also added to listed namespaces that lack it (the API server sets it on all).
//! - `hostNetwork` pods are not flock's: leave them out (their traffic is the node's).
//!
//! # Cluster policies
//!
//! A [`ClusterPolicy`] (network-policy-api's `ClusterNetworkPolicy`) judges a direction of
//! its subject's traffic only through its rules: selecting a pod does not isolate it. Each
//! direction of a local pod is judged by the Admin tier first — its policies by priority
//! (lower first; equal priorities by name, a choice the API leaves to implementations), each
//! one's rules in order, the first matching rule deciding: Accept allows the direction,
//! Deny drops, Pass skips the rest of the tier. Then, if a NetworkPolicy isolates the pod,
//! NetworkPolicy decides; otherwise the Baseline tier does the same as Admin (Pass there
//! allows), and what no rule matched passes. Peers and ports are those of NetworkPolicy:
//! `namespaces` and `pods` peers are pods' addresses, `networks` are CIDRs that match pods
//! too, a named port resolves on the destination pod whatever its protocol. Build with
//! [`Model::with_cluster_policies`].
//!
//! # Ruleset layout
//!
//! One table, `inet flock_policy`, in the node's namespace:
//!
//! - sets `pods<N>_v6`/`pods<N>_v4` (one pair per distinct namespace scope and pod
//!   selector, both families always present even when empty, so a pod joining a selector is
//!   one element added), `block<N>_v4|v6` (an `ipBlock` minus its excepts, as disjoint
//!   ranges, `flags interval`), `port<N>_v6|v4` (address `.` port, egress named ports);
//! - verdict maps `ingress_pods` (`oifname` → `jump ingress_<veth>`) and `egress_pods`
//!   (`iifname` → `jump egress_<veth>`), holding isolated pods only;
//! - chain `forward` (hook forward, priority filter, policy accept): conntrack, ICMP, then
//!   the egress map, then the ingress map;
//! - per isolated pod, a chain of allow rules ending in `drop` (egress rules `return` to
//!   `forward` so the receiver's ingress is checked next; ingress rules `accept`); with
//!   cluster policies, the Admin rules come first (Accept as `return`/`accept`, Deny as
//!   `drop`), and a Pass is `goto CHAIN_next`, a chain holding the NetworkPolicy allows or
//!   the Baseline rules.
//!
//! A script starts with `table inet flock_policy {}` and `delete table inet flock_policy`,
//! so one `nft -f` replaces the table whether or not it existed, atomically; with no
//! isolated pod the script is only those two lines ([`REMOVE_SCRIPT`]). The table accepts
//! or drops in its own base chain only, beside kube-proxy's tables, whose DNAT happens
//! before `forward` (policies see a Service's backend address).
//!
//! # Applying it (the agent's part)
//!
//! The simplest way: rebuild the [`Ruleset`] on every change of a policy, a namespace's
//! labels or a pod (labels, addresses, named ports, phase); feed `nft -f -` in the node's
//! namespace [`update_from`](Ruleset::update_from)'s commands when it has them (membership
//! changes only), else [`render`](Ruleset::render)'s script. The way that scales: keep a
//! [`Model`], hand it pods joining and leaving ([`Model::add_pod`], [`Model::remove_pod`])
//! and new policies and namespaces ([`Model::update_policies`], which keeps the sets that
//! stay), and apply [`Ruleset::update`] of its [`Model::take_delta`]: sets and chains come
//! and go in place, in one transaction. At start-up, whatever the kernel holds is unknown:
//! apply the full script once. Do not apply anything before the pods and policies are known
//! (an empty model removes the table, which opens everything).
//!
//! # Example
//!
//! ```
//! use flock_policy::{
//!     build, Hop, LabelSelector, Namespace, Packet, Peer, Pod, Policy, PortSpec, Protocol,
//!     Rule, Transport, Verdict,
//! };
//!
//! let web = Pod {
//!     namespace: "shop".into(),
//!     name: "web-0".into(),
//!     labels: std::sync::Arc::new([("app".into(), "web".into())].into()),
//!     addresses: vec!["2001:db8:0:1::10".parse()?, "10.244.1.10".parse()?],
//!     host_if: Some("flock0000000a".into()),
//!     ports: vec![],
//! };
//! let client = Pod {
//!     name: "client".into(),
//!     labels: std::sync::Arc::new([("role".into(), "client".into())].into()),
//!     addresses: vec!["2001:db8:0:2::20".parse()?],
//!     host_if: None, // on another node
//!     ..web.clone()
//! };
//! let policy = Policy {
//!     namespace: "shop".into(),
//!     name: "web-from-clients".into(),
//!     pod_selector: LabelSelector::labels([("app", "web")]),
//!     ingress: vec![Rule {
//!         peers: vec![Peer::pods(LabelSelector::labels([("role", "client")]))],
//!         ports: vec![PortSpec::number(Protocol::Tcp, 443)],
//!     }],
//!     ..Default::default()
//! };
//! let namespaces = [Namespace { name: "shop".into(), ..Default::default() }];
//! let ruleset = build(&[policy], &namespaces, &[web, client])?;
//! let to_web = |transport| Packet {
//!     src: "2001:db8:0:2::20".parse().unwrap(),
//!     dst: "2001:db8:0:1::10".parse().unwrap(),
//!     transport,
//!     from: Hop::Link("eth0".into()),
//!     to: Hop::Link("flock0000000a".into()),
//! };
//! assert_eq!(ruleset.verdict(&to_web(Transport::Tcp(443))), Verdict::Accept);
//! assert_ne!(ruleset.verdict(&to_web(Transport::Tcp(80))), Verdict::Accept);
//! assert!(ruleset.render().contains("ip6 saddr @pods0_v6 tcp dport 443 accept"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod addr;
mod allows;
mod cluster;
mod error;
mod explain;
mod input;
mod model;
mod render;
mod selector;
mod state;

pub use addr::{AddrRange, Family};
pub use cluster::{
    Action, ClusterPeer, ClusterPolicy, ClusterPort, ClusterRule, MAX_PRIORITY, Tier,
};
pub use error::{Error, Result};
pub use explain::{Explanation, Judgement, LocalPod, PolicyRef, Reason, RuleRef};
pub use input::{
    NamedPort, Namespace, Peer, Pod, Policy, PolicyTypes, Port, PortSpec, Protocol, Rule,
};
pub use model::{
    AddrSet, Allow, Chain, Direction, Elements, Flow, Hop, LOG_GROUP, LogMode, Member, Packet,
    Ports, Ruleset, TierRule, Transport, Verdict, log_prefix, parse_log_prefix,
};
pub use render::{Element, ElementOp, REMOVE_SCRIPT, TABLE, Update};
pub use selector::{LabelSelector, Labels, NAMESPACE_NAME_LABEL, Operator, Requirement};
pub use state::{ChainChange, Delta, Model, SetChange, build};

#[cfg(test)]
mod tests;

/// The README's example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
