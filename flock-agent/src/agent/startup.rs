//! Start-up (DESIGN §7.6): reserve committed addresses, undo pending ones, release
//! allocations whose namespace is gone (a reboot, a deleted netns), remove host interfaces no
//! record owns, re-sync anycast routes and install the node CIDR blackholes — then serve.
//!
//! Decided here, purely: what becomes of each record ([`disposition`]).

use std::path::Path;

use tracing::{info, warn};

use super::{Agent, error, pod_spec};
use crate::store::{AllocationRecord, RecordState};

/// What start-up found and did, for the log and the tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StartupReport {
    /// Committed allocations kept.
    pub kept: usize,
    /// Pending allocations undone.
    pub undone_pending: usize,
    /// Allocations released because their namespace is gone (reboot or deleted netns).
    pub released_stale: usize,
    /// Host interfaces removed that no record owned.
    pub removed_orphan_ifaces: usize,
    /// Queued DELs processed.
    pub drained_dels: usize,
}

/// What start-up does with one stored record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// A committed allocation whose pod still exists: reserve its addresses.
    Keep,
    /// An ADD that never committed: undo it.
    UndoPending,
    /// A committed allocation whose namespace is gone: release it.
    Release(&'static str),
}

/// The fate of `record`, given this boot's ID and whether its namespace file exists.
pub fn disposition(record: &AllocationRecord, boot_id: &str, netns_exists: bool) -> Disposition {
    match record.state {
        RecordState::Pending => Disposition::UndoPending,
        RecordState::Committed if record.boot_id != boot_id => {
            Disposition::Release("the node rebooted since")
        }
        RecordState::Committed if !netns_exists => {
            Disposition::Release("its network namespace is gone")
        }
        RecordState::Committed => Disposition::Keep,
    }
}

impl Agent {
    pub(super) async fn reconcile_at_start(
        &self,
        records: Vec<AllocationRecord>,
    ) -> crate::Result<StartupReport> {
        let mut report = StartupReport::default();
        for record in records {
            let exists = self.kernel.netns_exists(Path::new(&record.netns));
            let reason = match disposition(&record, &self.boot_id, exists) {
                Disposition::Keep => {
                    for (addr, e) in self.state().adopt(record.clone()) {
                        // Two records claiming one address can only come from a store
                        // edited by hand; keep the first and say so loudly.
                        warn!(container_id = %record.container_id, %addr, error = %e,
                            "address of a committed record could not be reserved");
                    }
                    report.kept += 1;
                    continue;
                }
                Disposition::UndoPending => {
                    report.undone_pending += 1;
                    "pending at the last stop"
                }
                Disposition::Release(reason) => {
                    report.released_stale += 1;
                    reason
                }
            };
            info!(container_id = %record.container_id, if_name = %record.if_name,
                reason, "releasing allocation at start-up");
            if let Err(e) = self.kernel.teardown(&pod_spec(&record, None)).await {
                warn!(container_id = %record.container_id, error = %error::cause_chain(&e),
                    "teardown at start-up reported errors");
            }
            self.delete_stored(&record.key())
                .await
                .map_err(|e| crate::Error::StoreRecord {
                    reason: error::cause_chain(&e),
                })?;
        }
        report.removed_orphan_ifaces = self.remove_orphan_ifaces().await;
        self.sync_anycast_routes().await;
        self.install_blackholes().await;
        self.refresh_metrics();
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::STORE_FORMAT;

    fn record(state: RecordState, boot: &str) -> AllocationRecord {
        AllocationRecord {
            format: STORE_FORMAT,
            state,
            network: "flock".into(),
            container_id: "c".into(),
            if_name: "eth0".into(),
            netns: "/run/netns/c".into(),
            boot_id: boot.into(),
            pod: None,
            ipv6: None,
            ipv4: None,
            addresses: vec![],
            anycast: vec![],
            mtu: 1500,
            host_if: "flock00000000".into(),
            host_mac: String::new(),
            pod_mac: String::new(),
            flock_network: None,
            default_route: true,
            routes: Vec::new(),
        }
    }

    #[test]
    fn pending_is_undone_whatever_else_holds() {
        let r = record(RecordState::Pending, "b1");
        assert_eq!(disposition(&r, "b1", true), Disposition::UndoPending);
        assert_eq!(disposition(&r, "b2", false), Disposition::UndoPending);
    }

    #[test]
    fn committed_is_kept_only_in_the_same_boot_with_its_namespace() {
        let r = record(RecordState::Committed, "b1");
        assert_eq!(disposition(&r, "b1", true), Disposition::Keep);
        assert!(
            matches!(disposition(&r, "b2", true), Disposition::Release(why) if why.contains("rebooted"))
        );
        assert!(
            matches!(disposition(&r, "b1", false), Disposition::Release(why) if why.contains("namespace"))
        );
    }
}
