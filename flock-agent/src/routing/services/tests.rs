use serde_json::json;

use super::*;

fn service(value: serde_json::Value) -> Service {
    serde_json::from_value(value).unwrap()
}

fn slice(value: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(value).unwrap()
}

fn web(policy: &str, ingress: &[&str]) -> Service {
    service(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": "web"},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "fd97::10", "clusterIPs": ["fd97::10", "10.96.0.10"],
            "externalIPs": ["2001:db8:e::7"],
            "externalTrafficPolicy": policy,
        },
        "status": {"loadBalancer": {"ingress": ingress.iter().map(|i| json!({"ip": i})).collect::<Vec<_>>()}}
    }))
}

/// An EndpointSlice of `web` with one endpoint on `node`.
fn slice_on(node: &str, ready: Option<bool>) -> EndpointSlice {
    let mut conditions = json!({});
    if let Some(r) = ready {
        conditions["ready"] = json!(r);
    }
    slice(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "default", "name": "web-abc",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv6",
        "endpoints": [{"addresses": ["2001:db8:0:1::5"], "conditions": conditions,
                       "nodeName": node}]
    }))
}

#[test]
fn a_service_is_read_into_the_fields_announcing_needs() {
    let facts = service_facts(&web("Local", &["2001:db8:5::1"])).unwrap();
    assert_eq!(facts.key, ServiceKey::new("default", "web"));
    assert_eq!(facts.service_type, ServiceType::LoadBalancer);
    assert_eq!(facts.cluster_ips, ["fd97::10", "10.96.0.10"]);
    assert_eq!(facts.external_ips, ["2001:db8:e::7"]);
    assert_eq!(facts.ingress_ips, ["2001:db8:5::1"]);
    assert_eq!(facts.external_traffic_policy, TrafficPolicy::Local);
    assert_eq!(facts.internal_traffic_policy, TrafficPolicy::Cluster);
    let mut other_proxy = web("Cluster", &[]);
    other_proxy.metadata.labels =
        Some([(SERVICE_PROXY_NAME_LABEL.to_owned(), "other".to_owned())].into());
    assert_eq!(service_facts(&other_proxy), None);
}

#[test]
fn endpoints_name_their_service_node_and_readiness() {
    let ready = slice_endpoints(&slice_on("node-a", None)).unwrap();
    assert_eq!(ready[0].node.as_deref(), Some("node-a"));
    assert_eq!(ready[0].service, ServiceKey::new("default", "web"));
    assert!(ready[0].ready, "absent ready counts as ready");
    assert!(!slice_endpoints(&slice_on("node-a", Some(false))).unwrap()[0].ready);
    let mut orphan = slice_on("node-a", None);
    orphan.metadata.labels = None;
    assert_eq!(
        slice_endpoints(&orphan),
        None,
        "a slice that names no Service"
    );
}

#[test]
fn local_routes_follow_slice_events_and_a_relist_drops_what_went() {
    let state = ServiceState::new();
    let ranges = ServiceRanges {
        load_balancer: vec!["2001:db8:5::/120".parse().unwrap()],
        ..ServiceRanges::default()
    };
    state.on_service(Event::Init);
    state.on_service(Event::InitApply(web("Local", &["2001:db8:5::1"])));
    state.on_service(Event::InitDone);
    state.on_slice(Event::Init);
    state.on_slice(Event::InitDone);
    assert!(state.is_synced());
    let routes = |s: &ServiceState| s.announcement("node-a", &ranges).routes;
    assert!(routes(&state).is_empty(), "no endpoint yet");
    state.on_slice(Event::Apply(slice_on("node-a", Some(true))));
    assert_eq!(
        routes(&state).into_iter().collect::<Vec<_>>(),
        ["2001:db8:5::1/128".parse().unwrap()]
    );
    // The external IP is outside every allowed range: refused, by name.
    let refused = state.announcement("node-a", &ranges).refused;
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].address, "2001:db8:e::7");
    // The endpoint moves to node-b: withdrawn on node-a.
    state.on_slice(Event::Apply(slice_on("node-b", Some(true))));
    assert!(routes(&state).is_empty());
    // A relist without the Service (deleted while the watch was down).
    state.on_service(Event::Init);
    state.on_service(Event::InitDone);
    assert!(state.announcement("node-b", &ranges).routes.is_empty());
}

#[test]
fn each_refusal_is_reported_once_until_it_goes_away() {
    let r = flock_ipam::Refusal {
        service: ServiceKey::new("default", "web"),
        field: "spec.externalIPs",
        address: "198.51.100.1".into(),
        reason: "outside".into(),
    };
    let mut reported = ReportedRefusals::default();
    assert_eq!(reported.fresh(std::slice::from_ref(&r)).len(), 1);
    assert!(reported.fresh(std::slice::from_ref(&r)).is_empty());
    assert!(reported.fresh(&[]).is_empty());
    assert_eq!(reported.fresh(std::slice::from_ref(&r)).len(), 1);
}
