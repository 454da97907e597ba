//! GC (DESIGN §7.5): for the network named in the config, remove every allocation and host
//! interface whose attachment is not in the runtime's list; other networks' attachments are
//! untouched. Keeps going past errors and reports them all.
//!
//! Decided here, purely: which records go ([`gc_victims`]) and which host interfaces are
//! orphans ([`orphan_ifaces`]).

use std::collections::BTreeSet;

use flock_cni_proto::NetConf;
use flock_rpc::rpc::Request;
use tracing::{info, warn};

use super::del::VethDeletion;
use super::{Agent, HandlerError, Outcome, error, parse_conf};
use crate::store::{AllocationRecord, AttachmentKey};

/// The attachments of `network` that are not in `valid` (container ID, interface name).
pub fn gc_victims<'a>(
    records: impl IntoIterator<Item = &'a AllocationRecord>,
    network: &str,
    valid: &BTreeSet<(String, String)>,
) -> Vec<AttachmentKey> {
    records
        .into_iter()
        .filter(|r| r.network == network)
        .filter(|r| !valid.contains(&(r.container_id.clone(), r.if_name.clone())))
        .map(AllocationRecord::key)
        .collect()
}

/// The host interfaces no attachment owns. `ifaces` must have been listed *before* `owned`
/// was read (a record is always written before its interface exists).
pub fn orphan_ifaces(ifaces: Vec<String>, owned: &BTreeSet<String>) -> Vec<String> {
    ifaces.into_iter().filter(|i| !owned.contains(i)).collect()
}

impl Agent {
    pub(super) async fn gc(&self, req: &Request) -> Outcome {
        let conf = parse_conf(req)?;
        let netconf = NetConf::from_value(&req.config)?;
        let valid: BTreeSet<(String, String)> = netconf
            .gc_attachments()
            .ok_or(HandlerError::GcWithoutList)?
            .iter()
            .map(|a| (a.container_id.clone(), a.ifname.clone()))
            .collect();
        let victims = gc_victims(self.state().records(), &conf.name, &valid);
        let mut failures = Vec::new();
        for key in victims {
            let guard = self.lock_container(&key.container_id).await;
            let phases = &mut crate::trace::Phases::start();
            if let Err(e) = self
                .del_locked(&key, "", guard, VethDeletion::Before, phases)
                .await
            {
                failures.push((key, e));
            }
        }
        self.remove_orphan_ifaces().await;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(HandlerError::Gc { failures })
        }
    }

    /// Removes `flock*` host interfaces that no attachment owns; returns how many.
    pub(super) async fn remove_orphan_ifaces(&self) -> usize {
        // Kernel first, records second: see the module documentation.
        let ifaces = match self.kernel.host_ifaces().await {
            Ok(i) => i,
            Err(e) => {
                warn!(error = %error::cause_chain(&e), "listing host interfaces failed");
                return 0;
            }
        };
        let owned = self.state().owned_host_ifs();
        let mut removed = 0;
        for iface in orphan_ifaces(ifaces, &owned) {
            match self.kernel.remove_host_iface(&iface).await {
                Ok(_) => {
                    info!(%iface, "removed a host interface no allocation owns");
                    removed += 1;
                }
                Err(e) => {
                    warn!(%iface, error = %error::cause_chain(&e), "removing orphan interface failed")
                }
            }
        }
        removed
    }
}
