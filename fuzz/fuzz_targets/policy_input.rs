//! NetworkPolicy and ClusterNetworkPolicy objects as the API serves them (anyone with the
//! right to create one writes them): converted into flock-policy's input.
#![no_main]

use k8s_openapi::api::networking::v1::NetworkPolicy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(np) = serde_json::from_slice::<NetworkPolicy>(data) {
        let _ = flock_agent::policy::convert::policy(&np);
    }
    if let Ok(object) = serde_json::from_slice::<kube::api::DynamicObject>(data) {
        let _ = flock_agent::policy::cluster::cluster_policy(&object);
    }
});
