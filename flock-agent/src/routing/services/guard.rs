//! The Service ranges a node announces end at the node. A node that announces a cluster-IP
//! range (`clusterIPCIDRs`) attracts every packet to it; kube-proxy translates those of a
//! Service it has programmed, and the rest — an unallocated address, or a Service created a
//! moment ago that this node's kube-proxy has not programmed yet — would follow the node's
//! default route back into the fabric: there another node that announces the range may
//! translate it (its kube-proxy then keeps the client's session affinity, not this node's),
//! or the router sends it back, until the hop limit.
//!
//! So the node drops, in the forward path, a new connection still addressed to one of its
//! announced ranges after kube-proxy had its chance — its DNAT in prerouting, and its own
//! filter verdicts in forward (it rejects a Service without endpoints there, untranslated),
//! which come first because this chain's priority is `filter + 10`: the same rule
//! kube-proxy's nftables mode keeps for the unallocated addresses of its ServiceCIDRs, here
//! for both kube-proxy modes and for every range the node announces. A dropped SYN is
//! retransmitted, so a client of a Service created a moment ago is served once kube-proxy has
//! caught up, by this node. Traffic the node itself originates (output hook) is not
//! touched: in IPVS mode a cluster IP is a local address and no DNAT happens there.
//!
//! It is one nftables table of its own, `inet flock_services`, replaced in one transaction
//! when the ranges change and removed when there are none; `flock-agent cleanup` removes it.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio::sync::watch;

use crate::metrics::{Component, Health};
use crate::policy::nft::Nft;

/// The table (family `inet`, in the node's namespace).
pub const TABLE: &str = "flock_services";

/// The script that removes the table, whether or not it exists.
pub const REMOVE_SCRIPT: &str = "table inet flock_services {}\ndelete table inet flock_services\n";

/// The table that drops new forwarded connections to `ranges` that no DNAT translated, as an
/// `nft -f` script that replaces it in one transaction; [`REMOVE_SCRIPT`] for no range.
/// Nested and adjacent ranges are merged (an interval set refuses overlapping elements).
pub fn render(ranges: &[IpNet]) -> String {
    let ranges = IpNet::aggregate(&ranges.iter().map(IpNet::trunc).collect());
    if ranges.is_empty() {
        return REMOVE_SCRIPT.to_owned();
    }
    let mut sets = String::new();
    let mut rules = String::new();
    for (family, v6) in [("ip6", true), ("ip", false)] {
        let members: Vec<String> = ranges
            .iter()
            .filter(|r| matches!(r, IpNet::V6(_)) == v6)
            .map(IpNet::to_string)
            .collect();
        if members.is_empty() {
            continue;
        }
        let (set, kind) = if v6 {
            ("announced_v6", "ipv6_addr")
        } else {
            ("announced_v4", "ipv4_addr")
        };
        let _ = write!(
            sets,
            "\tset {set} {{\n\
             \t\ttype {kind}\n\
             \t\tflags interval\n\
             \t\tcomment \"Service ranges this node announces\"\n\
             \t\telements = {{ {} }}\n\
             \t}}\n",
            members.join(", ")
        );
        let _ = writeln!(
            rules,
            "\t\tct state new {family} daddr @{set} counter drop \
             comment \"announced Service range, no Service translated it\""
        );
    }
    format!(
        "# flock: the Service ranges this node announces end here (`nft -f` replaces the table)\n\
         {REMOVE_SCRIPT}\
         table inet {TABLE} {{\n\
         {sets}\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter + 10; policy accept;\n\
         {rules}\
         \t}}\n\
         }}\n"
    )
}

/// Keeps the table in step with the ranges it is given ([`set`](Self::set)); a failed apply
/// is a problem of [`Component::Services`] and is retried.
#[derive(Debug, Clone)]
pub struct ServiceGuard {
    ranges: watch::Sender<Option<Vec<IpNet>>>,
}

impl ServiceGuard {
    /// Starts the task that applies the table with `nft`; nothing is applied until the first
    /// [`set`](Self::set) (an agent that restarts keeps the table it left until it knows its
    /// NodeConfig again).
    pub fn spawn(nft: Arc<dyn Nft>, health: Arc<Health>, retry: Duration) -> ServiceGuard {
        let (tx, mut rx) = watch::channel(None::<Vec<IpNet>>);
        tokio::spawn(async move {
            loop {
                let ranges = rx.borrow_and_update().clone();
                let mut ok = true;
                if let Some(ranges) = ranges {
                    let script = render(&ranges);
                    match nft.apply(script).await {
                        Ok(()) => health.set_problem(Component::Services, None),
                        Err(e) => {
                            let problem = format!(
                                "table inet {TABLE} for {}: {}",
                                list(&ranges),
                                flock_cni_proto::error::cause_chain(&e)
                            );
                            tracing::warn!(%problem, "guarding the announced Service ranges failed");
                            health.set_problem(Component::Services, Some(problem));
                            ok = false;
                        }
                    }
                }
                let changed = if ok {
                    rx.changed().await.is_ok()
                } else {
                    tokio::select! {
                        r = rx.changed() => r.is_ok(),
                        _ = tokio::time::sleep(retry) => true,
                    }
                };
                if !changed {
                    return; // the agent is gone
                }
            }
        });
        ServiceGuard { ranges: tx }
    }

    /// The ranges the node announces now (none: the table goes). Applied only when they
    /// changed.
    pub fn set(&self, mut ranges: Vec<IpNet>) {
        ranges.sort();
        ranges.dedup();
        self.ranges.send_if_modified(|current| {
            let changed = current.as_ref() != Some(&ranges);
            if changed {
                *current = Some(ranges);
            }
            changed
        });
    }
}

fn list(ranges: &[IpNet]) -> String {
    if ranges.is_empty() {
        return "no range".into();
    }
    ranges
        .iter()
        .map(IpNet::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::nft::MemoryNft;
    use flock_testkit::wait::eventually;

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn the_table_drops_untranslated_connections_to_each_announced_family() {
        insta::assert_snapshot!(render(&nets(&["2001:db8:c5::/108", "10.96.0.0/16"])));
    }

    #[test]
    fn nested_and_adjacent_ranges_are_merged_and_no_range_removes_the_table() {
        let script = render(&nets(&[
            "fd97::/108",
            "fd97::/112",
            "fd97:0:0:0:0:0:10:0/108",
            "fd98::1/108",
        ]));
        assert!(
            script.contains("elements = { fd97::/107, fd98::/108 }"),
            "{script}"
        );
        assert!(!script.contains("announced_v4"), "{script}");
        assert_eq!(render(&[]), REMOVE_SCRIPT);
    }

    #[tokio::test]
    async fn the_table_follows_the_ranges_and_a_failure_is_a_problem_until_retried() {
        let nft = Arc::new(MemoryNft::default());
        let health = Arc::new(Health::default());
        let guard = ServiceGuard::spawn(nft.clone(), health.clone(), Duration::from_millis(20));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            nft.scripts().is_empty(),
            "nothing before the ranges are known"
        );

        nft.fail_next(1);
        guard.set(nets(&["2001:db8:c5::/108"]));
        eventually("the failure is reported", || {
            health.problem(Component::Services).is_some()
        })
        .await;
        let problem = health.problem(Component::Services).unwrap();
        assert!(
            problem.contains("flock_services") && problem.contains("2001:db8:c5::/108"),
            "{problem}"
        );
        eventually("retried and applied", || {
            nft.scripts().len() == 1 && health.problem(Component::Services).is_none()
        })
        .await;

        // The same ranges again (a duplicate collapses): nothing to apply.
        guard.set(nets(&["2001:db8:c5::/108", "2001:db8:c5::/108"]));
        guard.set(vec![]);
        eventually("the table is removed", || {
            nft.scripts().last().map(String::as_str) == Some(REMOVE_SCRIPT)
        })
        .await;
        assert_eq!(nft.scripts().len(), 2, "{:?}", nft.scripts());
    }
}
