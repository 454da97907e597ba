//! What a cluster installs for pools: the NodePool CRD, the controller's Deployment and its
//! RBAC (exactly what the controller uses), and the example NodePool.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};

mod deploy_support;
use deploy_support::{committed_crd, documents, read, typed};

#[test]
fn committed_nodepool_crd_is_what_flock_agent_crd_nodepools_prints() {
    let printed = flock_agent::crd::node_pool_yaml();
    let committed = committed_crd("nodepools.flock.fritzlab.net.yaml");
    assert!(
        printed == committed,
        "the chart's charts/flock/crds/nodepools.flock.fritzlab.net.yaml is stale: regenerate it with \
         `cargo run -p flock-agent -- crd nodepools > charts/flock/crds/nodepools.flock.fritzlab.net.yaml`, then \
         `cargo xtask helm render`"
    );
    insta::assert_snapshot!(printed);
}

#[test]
fn nodepool_crd_schema_validates_what_it_can() {
    let crd: serde_yaml::Value =
        serde_yaml::from_str(&flock_agent::crd::node_pool_yaml()).expect("the CRD is YAML");
    assert_eq!(crd["spec"]["group"], "flock.fritzlab.net");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "np");
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert!(version["subresources"]["status"].is_mapping());
    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let required: Vec<&str> = spec["required"]
        .as_sequence()
        .expect("required")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(required, ["cidr6", "nodePrefix6"]);
    let p = &spec["properties"];
    assert_eq!(p["cidr6"]["format"], "cidr");
    assert_eq!(p["cidr4"]["format"], "cidr");
    assert_eq!(p["nodePrefix6"]["maximum"].as_f64(), Some(120.0));
    assert_eq!(p["nodePrefix4"]["minimum"].as_f64(), Some(8.0));
    assert_eq!(p["nodePrefix4"]["maximum"].as_f64(), Some(30.0));
    assert!(p["nodeSelector"]["properties"]["matchLabels"].is_mapping());
    // NodeConfig's own BGP types: the same neighbor checks apply to a pool.
    let neighbor = &p["bgp"]["properties"]["neighbors"]["items"]["properties"];
    assert_eq!(neighbor["bfdIntervalMs"]["maximum"].as_f64(), Some(60000.0));
    assert!(neighbor["passwordSecretRef"].is_mapping());
    assert!(
        p["bgp"]["properties"]["routerId"].is_null(),
        "each node has its own router ID"
    );
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_sequence()
        .expect("columns")
        .iter()
        .filter_map(|c| c["jsonPath"].as_str())
        .collect();
    for path in [".spec.cidr6", ".status.nodes", ".status.ipv6.free"] {
        assert!(columns.contains(&path), "no printer column {path}");
    }
}

#[test]
fn example_nodepool_is_valid() {
    let pool: flock_k8s_api::NodePool =
        serde_yaml::from_str(&read("deploy/nodepool-example.yaml")).expect("parses");
    let p = pool.cluster_pool().expect("validates");
    assert_eq!(p.node_prefix6, 64);
    assert!(
        !p.selector.match_labels.is_empty(),
        "a pool per rack, by label"
    );
}

/// `group/resource:verb` for every rule, with `@name` when limited to names.
fn grants(rules: &[PolicyRule]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for rule in rules {
        assert!(rule.non_resource_urls.is_none());
        let names = rule.resource_names.clone().unwrap_or_default().join(",");
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    let at = if names.is_empty() {
                        String::new()
                    } else {
                        format!("@{names}")
                    };
                    out.insert(format!("{group}/{resource}:{verb}{at}"));
                }
            }
        }
    }
    out
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn controller_rbac_grants_exactly_what_it_uses() {
    let docs = documents("deploy/controller-rbac.yaml");
    let kind = |d: &serde_yaml::Value| d["kind"].as_str().unwrap_or_default().to_owned();
    let kinds: Vec<String> = docs.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            // Helm's order (the manifests are the chart rendered): Roles, then their bindings
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding"
        ]
    );
    let sa: ServiceAccount = typed(&docs[0]);
    let cluster: ClusterRole = typed(&docs[1]);
    assert!(cluster.aggregation_rule.is_none());
    assert_eq!(
        grants(cluster.rules.as_deref().unwrap_or_default()),
        set(&[
            "/nodes:list",
            "/nodes:watch",
            "flock.fritzlab.net/nodepools:list",
            "flock.fritzlab.net/nodepools:watch",
            "flock.fritzlab.net/nodepools/status:patch",
            "flock.fritzlab.net/nodeconfigs:list",
            "flock.fritzlab.net/nodeconfigs:watch",
            "flock.fritzlab.net/nodeconfigs:create",
            "flock.fritzlab.net/nodeconfigs:update",
            "flock.fritzlab.net/nodeconfigs:delete",
            "/services:list",
            "/services:watch",
            "/services/status:patch",
            "events.k8s.io/events:create",
            "events.k8s.io/events:patch",
            "/pods:list",
            "networking.k8s.io/servicecidrs:list",
            "networking.k8s.io/servicecidrs:watch",
        ])
    );
    let lease: Role = typed(&docs[3]);
    assert_eq!(lease.metadata.namespace, sa.metadata.namespace);
    assert_eq!(
        grants(lease.rules.as_deref().unwrap_or_default()),
        set(&[
            "coordination.k8s.io/leases:create",
            "coordination.k8s.io/leases:get@flock-controller",
            "coordination.k8s.io/leases:update@flock-controller",
        ])
    );
    let events: Role = typed(&docs[4]);
    assert_eq!(
        events.metadata.namespace.as_deref(),
        Some("default"),
        "events of cluster-scoped objects"
    );
    assert_eq!(
        grants(events.rules.as_deref().unwrap_or_default()),
        set(&["events.k8s.io/events:create", "events.k8s.io/events:patch"])
    );
    // Every binding names its role and only the controller's ServiceAccount.
    let cluster_binding: ClusterRoleBinding = typed(&docs[2]);
    assert_eq!(
        Some(&cluster_binding.role_ref.name),
        cluster.metadata.name.as_ref()
    );
    let mut subjects = vec![cluster_binding.subjects.clone().unwrap_or_default()];
    for (binding, role) in [(&docs[5], &lease), (&docs[6], &events)] {
        let binding: RoleBinding = typed(binding);
        assert_eq!(binding.role_ref.kind, "Role");
        assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
        assert_eq!(binding.metadata.namespace, role.metadata.namespace);
        subjects.push(binding.subjects.unwrap_or_default());
    }
    for s in subjects {
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].kind, "ServiceAccount");
        assert_eq!(Some(&s[0].name), sa.metadata.name.as_ref());
        assert_eq!(s[0].namespace, sa.metadata.namespace);
    }

    // The agents cannot write NodeConfigs: only the controller can.
    let agent: ClusterRole = typed(&documents("deploy/rbac.yaml")[1]);
    let agent_grants = grants(agent.rules.as_deref().unwrap_or_default());
    for verb in ["create", "update", "delete", "patch"] {
        assert!(!agent_grants.contains(&format!("flock.fritzlab.net/nodeconfigs:{verb}")));
    }
}

#[test]
fn controller_deployment_uses_the_daemonset_image_its_account_and_its_lease() {
    let deployment: Deployment = typed(&documents("deploy/controller.yaml")[0]);
    let ds: DaemonSet = typed(&documents("deploy/daemonset.yaml")[0]);
    let pod = deployment
        .spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .clone()
        .expect("pod");
    let ds_image = ds
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod")
        .containers[0]
        .image
        .clone();
    assert_eq!(pod.containers.len(), 1);
    let c = &pod.containers[0];
    assert_eq!(c.image, ds_image, "the same image as the DaemonSet");
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/local/bin/flock-controller".to_owned()][..])
    );
    assert!(c.args.is_none());
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("flock-controller")
    );
    assert_eq!(
        pod.host_network,
        Some(true),
        "runs before any node can give a pod an address"
    );
    let tolerated: Vec<String> = pod
        .tolerations
        .iter()
        .flatten()
        .filter_map(|t| t.key.clone())
        .collect();
    assert!(tolerated.contains(&"node.kubernetes.io/not-ready".to_owned()));
    assert!(
        deployment
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or(1)
            >= 2,
        "a standby"
    );
    let env = |name: &str| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("env {name}"))
            .clone()
    };
    let field = |name: &str| {
        env(name)
            .value_from
            .and_then(|v| v.field_ref)
            .map(|f| f.field_path)
    };
    assert_eq!(field("FLOCK_POD_NAME").as_deref(), Some("metadata.name"));
    assert_eq!(
        field("FLOCK_LEASE_NAMESPACE").as_deref(),
        Some("metadata.namespace")
    );
    // The Lease it elects with is the one its Role may update.
    let lease_role: Role = typed(&documents("deploy/controller-rbac.yaml")[3]);
    assert_eq!(deployment.metadata.namespace, lease_role.metadata.namespace);
    let lease_name = env("FLOCK_LEASE_NAME").value.expect("value");
    let named: Vec<String> = lease_role
        .rules
        .iter()
        .flatten()
        .flat_map(|r| r.resource_names.clone().unwrap_or_default())
        .collect();
    assert_eq!(named, [lease_name]);
}
