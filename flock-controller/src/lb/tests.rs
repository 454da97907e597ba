use serde_json::{Value, json};

use super::*;

fn pool(cidrs: &[&str]) -> NodePool {
    serde_json::from_value(json!({
        "apiVersion": "flock.fritzlab.net/v1alpha1", "kind": "NodePool",
        "metadata": {"name": "rack1"},
        "spec": {"cidr6": "2001:db8:1::/48", "nodePrefix6": 64,
                 "services": {"loadBalancerCIDRs": cidrs}}
    }))
    .unwrap()
}

fn svc(name: &str, extra: Value) -> Service {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name},
        "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv6", "IPv4"]},
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn ip(t: &str) -> IpAddr {
    t.parse().unwrap()
}

#[test]
fn a_new_dual_stack_service_gets_both_families_and_a_held_one_keeps_its_status() {
    let pools = [pool(&["2001:db8:5::/120", "203.0.113.0/28"])];
    let held = svc(
        "old",
        json!({"status": {"loadBalancer": {"ingress": [{"ip": "2001:db8:5::1"}, {"ip": "203.0.113.1"}]}}}),
    );
    let d = decide_lb(&pools, &[svc("new", json!({})), held]);
    assert_eq!(
        d.writes,
        [IngressWrite {
            service: ServiceKey::new("default", "new"),
            ips: vec![ip("2001:db8:5::2"), ip("203.0.113.2")],
        }],
        "the held Service is not rewritten"
    );
    assert!(d.problems.is_empty(), "{:?}", d.problems);
}

#[test]
fn another_class_is_left_alone_and_a_type_change_releases_the_address() {
    let pools = [pool(&["2001:db8:5::/120"])];
    let other_field = svc(
        "metallb",
        json!({"spec": {"loadBalancerClass": "metallb.io/lb"}}),
    );
    let other_annotation = svc(
        "cloud",
        json!({"metadata": {"annotations": {LB_CLASS_ANNOTATION: "cloud"}},
               "status": {"loadBalancer": {"ingress": [{"ip": "2001:db8:5::9"}]}}}),
    );
    let was_lb = svc(
        "was",
        json!({"spec": {"type": "ClusterIP"},
               "status": {"loadBalancer": {"ingress": [{"ip": "2001:db8:5::1"}]}}}),
    );
    assert!(!is_flocks(&other_field) && !is_flocks(&other_annotation));
    let d = decide_lb(&pools, &[other_field, other_annotation, was_lb]);
    assert_eq!(
        d.writes,
        [IngressWrite {
            service: ServiceKey::new("default", "was"),
            ips: vec![],
        }]
    );
}

#[test]
fn requested_addresses_come_from_the_field_and_the_annotation() {
    let pools = [pool(&["2001:db8:5::/120", "203.0.113.0/28"])];
    let s = svc(
        "web",
        json!({"spec": {"loadBalancerIP": "203.0.113.9"},
               "metadata": {"annotations": {LB_IPS_ANNOTATION: "2001:db8:5::80, nonsense"}}}),
    );
    let d = decide_lb(&pools, &[s]);
    assert_eq!(
        d.writes[0].ips,
        vec![ip("2001:db8:5::80"), ip("203.0.113.9")]
    );
    assert_eq!(
        d.problems,
        [(
            ServiceKey::new("default", "web"),
            format!("metadata.annotations[{LB_IPS_ANNOTATION}] \"nonsense\" is not an IP address")
        )]
    );
}
