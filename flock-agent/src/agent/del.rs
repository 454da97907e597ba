//! DEL (DESIGN §7.2) and what shares its path: the leak reconcile's release and the drain of
//! DELs the shim queued. Idempotent: an unknown attachment is already released.

use std::path::Path;

use flock_netns::PodSpec;
use flock_rpc::rpc::Request;
use tracing::warn;

use crate::trace::Phases;

use super::{
    Agent, ContainerGuard, HandlerError, Outcome, attachment_key, error, parse_conf, pod_spec,
};
use crate::store::AttachmentKey;

/// When a release deletes the pod's host-side veth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum VethDeletion {
    /// After the answer, once requests pause (a DEL: the runtime waits on it, the kernel work
    /// need not, and the next requests should not wait on the kernel behind it; see `lull`).
    AfterAnswer,
    /// Before returning (GC, the leak reconcile and the drain of queued DELs: nobody waits on
    /// them, and what they report is then already true).
    Before,
}

/// The veth an attachment flock has no record of would have had: its first name, unless
/// another attachment owns that name (then it is not this one's to delete).
pub fn unrecorded_veth(key: &AttachmentKey, owned: impl Fn(&str) -> bool) -> Option<String> {
    let name = flock_netns::host_ifname(&key.container_id, &key.if_name, 0);
    (!owned(&name)).then_some(name)
}

impl Agent {
    pub(super) async fn del(
        &self,
        req: &Request,
        phases: &mut Phases,
        veth: VethDeletion,
    ) -> Outcome {
        // A configuration that is not flock's (wrong type, bad mtu) is an error even for DEL.
        parse_conf(req)?;
        let key = attachment_key(req)?;
        let guard = self.lock_container(&req.container_id).await;
        phases.mark("lock");
        self.del_locked(&key, &req.netns, guard, veth, phases).await
    }

    /// Tears down and releases one attachment by key, as a DEL would (used by the Kubernetes
    /// leak reconcile for pods gone from the node).
    /// Unlike a DEL, nobody waits on the answer, so the veth is gone when this returns.
    pub async fn release_attachment(&self, key: &AttachmentKey) -> Result<(), HandlerError> {
        let guard = self.lock_container(&key.container_id).await;
        self.del_locked(key, "", guard, VethDeletion::Before, &mut Phases::start())
            .await
    }

    /// Tears down and releases one attachment; `guard` is its container's lock.
    ///
    /// The pod's anycast nexthops go synchronously, then its record and addresses. Deleting
    /// the veth, and with it the pod's host routes (tens of milliseconds of kernel time),
    /// happens as `veth` says: for a DEL, after the answer and once the agent's requests
    /// pause (at most half a second later), in a task that keeps the container locked and the
    /// veth's name claimed until the veth is gone, so neither a new ADD of the same container
    /// nor another attachment whose name collides can race it. A crash before that deletion
    /// leaves a veth without a record, which start-up removes.
    pub(super) async fn del_locked(
        &self,
        key: &AttachmentKey,
        netns: &str,
        guard: ContainerGuard,
        veth: VethDeletion,
        phases: &mut Phases,
    ) -> Outcome {
        let record = self.state().record(key).cloned();
        let Some(record) = record else {
            // Unknown attachment: nothing is allocated, but make sure no veth of it lingers
            // (an ADD that crashed before its record was readable, a DEL queued twice).
            let Some(host_if) = unrecorded_veth(key, |n| self.state().owns_host_if(n)) else {
                return Ok(());
            };
            let spec = PodSpec {
                container_id: key.container_id.clone(),
                netns: netns.into(),
                if_name: key.if_name.clone(),
                host_if,
                mtu: flock_rpc::defaults::DEFAULT_MTU,
                addresses: Vec::new(),
                anycast: Vec::new(),
                default_route: true,
                routes: vec![],
            };
            return self
                .kernel
                .teardown(&spec)
                .await
                .map_err(|e| kernel_error("tear down", key, e));
        };
        let spec = pod_spec(&record, (!netns.is_empty()).then_some(netns));
        // The pod's host routes go with its veth: the kernel drops a link's routes when it
        // deletes it. Until then a new pod given one of these addresses is still routed
        // right, as its set-up replaces a host route, never adds one, and the old veth's
        // deletion takes only routes through it. An anycast route cannot wait: IPv4 drops the
        // whole multipath route when one nexthop's device goes, so its new set goes in now.
        if !spec.anycast.is_empty() {
            self.kernel
                .detach(&spec)
                .await
                .map_err(|e| kernel_error("detach", key, e))?;
        }
        phases.mark("kernel");
        self.fail_at("del-after-detach");
        self.delete_stored(key).await?;
        phases.mark("store_delete");
        self.fail_at("del-after-delete");
        self.forget_policy(&record.host_if);
        {
            let mut state = self.state();
            state.remove(key);
            // The name stays claimed until the veth is gone.
            state.claim_host_if(&record.host_if);
        }
        let host_if = record.host_if.clone();
        let kernel = self.kernel.clone();
        let state = self.state.clone();
        let remove = async move {
            if let Err(e) = kernel.remove_host_iface(&host_if).await {
                warn!(iface = %host_if, error = %error::cause_chain(&e),
                    "deleting a released pod's veth failed; start-up or GC will retry");
            }
            state
                .lock()
                .expect("node state lock")
                .host_if_done(&host_if);
            drop(guard);
        };
        match veth {
            VethDeletion::AfterAnswer => {
                let lull = self.lull.clone();
                tokio::spawn(async move {
                    lull.pause().await;
                    remove.await;
                });
            }
            VethDeletion::Before => remove.await,
        }
        self.refresh_metrics();
        // Always re-render: besides `addresses` and anycast, a pod left from a node CIDR that
        // has since changed is announced on its own, until it goes. The writer is debounced
        // and writes nothing when the bytes do not change.
        self.refresh_bird();
        phases.mark("release");
        Ok(())
    }

    /// Runs every DEL the shim queued while the agent was unreachable; returns how many ran.
    /// Nobody waits on their answers: each deletes its veth before the next runs, so the node
    /// is clean once the drain is done (the one at start-up runs before the agent serves).
    pub async fn drain_del_queue(&self, dir: &Path) -> usize {
        let queue = flock_rpc::DelQueue::new(dir);
        let mut done = 0;
        let pending = match queue.pending() {
            Ok(p) => p,
            Err(e) => {
                warn!(dir = %dir.display(), error = %error::cause_chain(&e), "reading the DEL queue failed");
                return 0;
            }
        };
        for (path, request) in pending {
            match request {
                Ok(request) => {
                    let (response, _) = self
                        .handle_as(request, &mut Phases::start(), VethDeletion::Before)
                        .await;
                    if let Some(e) = &response.error {
                        warn!(file = %path.display(), msg = %e.msg, details = %e.details,
                            "queued DEL failed; kept for the next drain");
                        continue;
                    }
                    done += 1;
                }
                Err(e) => {
                    warn!(file = %path.display(), error = %error::cause_chain(&e),
                        "unreadable queued DEL; removing it");
                }
            }
            if let Err(e) = queue.remove(&path) {
                warn!(file = %path.display(), error = %error::cause_chain(&e), "removing a drained DEL failed");
            }
        }
        done
    }
}

fn kernel_error(
    op: &'static str,
    key: &AttachmentKey,
    source: impl std::error::Error + Send + Sync + 'static,
) -> HandlerError {
    HandlerError::Kernel {
        op,
        container_id: key.container_id.clone(),
        if_name: key.if_name.clone(),
        source: Box::new(source),
    }
}
