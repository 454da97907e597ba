//! CHECK (DESIGN §7.3): compare the runtime's `prevResult` and the kernel (both namespaces)
//! with the record, and report every difference.
//!
//! Decided here, purely: whether `prevResult` is the allocation ([`compare_prev_result`]).

use std::collections::BTreeSet;

use flock_cni_proto::{CniResult, NetConf};
use flock_rpc::rpc::Request;

use super::{Agent, HandlerError, Outcome, attachment_key, cni_result, parse_conf, pod_spec};
use crate::store::AllocationRecord;

/// `Ok` when `prev` lists exactly the record's addresses.
pub fn compare_prev_result(record: &AllocationRecord, prev: &CniResult) -> Outcome {
    let ours = cni_result(record);
    let want: BTreeSet<String> = ours.ips.iter().map(|i| i.address.to_string()).collect();
    let got: BTreeSet<String> = prev.ips.iter().map(|i| i.address.to_string()).collect();
    if want == got {
        Ok(())
    } else {
        Err(HandlerError::PrevResultMismatch {
            got: got.into_iter().collect(),
            want: want.into_iter().collect(),
        })
    }
}

impl Agent {
    pub(super) async fn check(&self, req: &Request) -> Outcome {
        let conf = parse_conf(req)?;
        if !conf.cni_version.has_check() {
            return Err(HandlerError::CheckUnsupported {
                version: conf.cni_version.to_string(),
            });
        }
        let key = attachment_key(req)?;
        let _guard = self.lock_container(&req.container_id).await;
        let record =
            self.state()
                .record(&key)
                .cloned()
                .ok_or_else(|| HandlerError::UnknownAttachment {
                    container_id: key.container_id.clone(),
                    if_name: key.if_name.clone(),
                })?;
        let netconf = NetConf::from_value(&req.config)?;
        if let Some(prev) = netconf.prev_result()? {
            compare_prev_result(&record, &prev)?;
        }
        let spec = pod_spec(
            &record,
            (!req.netns.is_empty()).then_some(req.netns.as_str()),
        );
        let mismatches = self
            .kernel
            .check(&spec)
            .await
            .map_err(|e| HandlerError::Kernel {
                op: "check",
                container_id: key.container_id.clone(),
                if_name: key.if_name.clone(),
                source: Box::new(e),
            })?;
        if mismatches.is_empty() {
            return Ok(());
        }
        Err(HandlerError::KernelMismatch {
            mismatches: mismatches.iter().map(|m| m.to_string()).collect(),
        })
    }
}
