//! The handlers' side of NetworkPolicy: an ADD waits until its pod's rules are in place, a
//! DEL (or any release) drops them, start-up hands every kept pod to the enforcer.
//!
//! Decided here, purely: what the enforcer is told of a pod ([`local_pod`]).

use crate::pods::PodInfo;
use crate::policy::view::LocalPod;
use crate::store::AllocationRecord;

use super::{Agent, HandlerError, Outcome};

/// The pod of `record` as the enforcer sees it: every address of the record (its /128,
/// /32, fixed `addresses`, anycast) with the labels and named ports ADD resolved. `None` for
/// a record that names no pod (standalone mode, a runtime without `K8S_POD_NAME`): no
/// NetworkPolicy can select it; and `None` for a secondary network's attachment: Kubernetes
/// NetworkPolicy is about the pod's cluster network interface (its `podIPs`), so traffic on
/// a secondary network is not filtered by it.
pub fn local_pod(record: &AllocationRecord, info: Option<&PodInfo>) -> Option<LocalPod> {
    if record.flock_network.is_some() {
        return None;
    }
    let pod = record.pod.as_ref()?;
    let mut addresses = record.pooled_addresses();
    addresses.extend(record.anycast.iter().copied());
    addresses.sort();
    addresses.dedup();
    Some(LocalPod {
        key: (pod.namespace.clone(), pod.name.clone()),
        uid: pod.uid.clone(),
        addresses,
        labels: info.map(|i| i.labels.clone()).unwrap_or_default(),
        ports: info.map(|i| i.ports.clone()).unwrap_or_default(),
    })
}

impl Agent {
    /// Start-up: every kept record's pod joins the model (its labels come from the cluster
    /// cache once listed; nothing is applied before that).
    pub(super) fn restore_policy_pods(&self) {
        let Some(policy) = &self.policy else {
            return;
        };
        for record in self.state().records() {
            if let Some(pod) = local_pod(record, None) {
                policy.restore(record.host_if.clone(), pod);
            }
        }
    }

    /// ADD: the pod's rules are in the kernel when this returns `Ok`.
    pub(super) async fn admit_policy(&self, record: &AllocationRecord, info: &PodInfo) -> Outcome {
        let (Some(policy), Some(pod)) = (&self.policy, local_pod(record, Some(info))) else {
            return Ok(());
        };
        let id = format!("{}/{}", pod.key.0, pod.key.1);
        policy
            .admit(record.host_if.clone(), pod, self.pod_wait)
            .await
            .map_err(|source| HandlerError::Policy { pod: id, source })
    }

    /// A released or undone attachment's rules go with the next apply.
    pub(super) fn forget_policy(&self, host_if: &str) {
        if let Some(policy) = &self.policy {
            policy.forget(host_if);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{PodRef, RecordState, STORE_FORMAT};

    fn record(pod: Option<PodRef>) -> AllocationRecord {
        AllocationRecord {
            format: STORE_FORMAT,
            state: RecordState::Committed,
            network: "flock".into(),
            container_id: "c".into(),
            if_name: "eth0".into(),
            netns: "/run/netns/c".into(),
            boot_id: "b".into(),
            pod,
            ipv6: Some("2001:db8:1::5".parse().unwrap()),
            ipv4: Some("10.244.1.5".parse().unwrap()),
            addresses: vec!["2001:db8:9::1".parse().unwrap()],
            anycast: vec!["2001:db8:a::1".parse().unwrap()],
            mtu: 1500,
            host_if: "flock00000001".into(),
            host_mac: String::new(),
            pod_mac: String::new(),
            flock_network: None,
            default_route: true,
            routes: Vec::new(),
        }
    }

    #[test]
    fn a_pod_carries_every_address_of_its_record_and_adds_labels() {
        let r = record(Some(PodRef {
            namespace: "shop".into(),
            name: "web".into(),
            uid: "u1".into(),
        }));
        let info = PodInfo {
            labels: [("app".into(), "web".into())].into(),
            ..PodInfo::default()
        };
        let pod = local_pod(&r, Some(&info)).expect("a named pod");
        assert_eq!(pod.key, ("shop".into(), "web".into()));
        assert_eq!(pod.uid, "u1");
        let addrs: Vec<String> = pod.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(
            addrs,
            [
                "10.244.1.5",
                "2001:db8:1::5",
                "2001:db8:9::1",
                "2001:db8:a::1"
            ]
        );
        assert_eq!(pod.labels["app"], "web");
        assert!(local_pod(&r, None).expect("named").labels.is_empty());
    }

    #[test]
    fn a_record_without_a_pod_is_not_policy_material() {
        assert_eq!(local_pod(&record(None), None), None);
    }
}
