//! flock's CustomResourceDefinitions as YAML (`flock-agent crd`), as `deploy/crds/` holds them.

use flock_k8s_api::{NodeConfig, NodePool};
use kube::CustomResourceExt;

/// The NodeConfig CustomResourceDefinition as YAML.
pub fn node_config_yaml() -> String {
    serde_yaml::to_string(&NodeConfig::crd()).expect("the CRD serializes to YAML")
}

/// The NodePool CustomResourceDefinition as YAML.
pub fn node_pool_yaml() -> String {
    serde_yaml::to_string(&NodePool::crd()).expect("the CRD serializes to YAML")
}
