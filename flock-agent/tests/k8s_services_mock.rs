//! Service announcing against a mocked API server: the Service and `discovery.k8s.io/v1`
//! EndpointSlice watches fill the state, and this node's routes follow its ready endpoints
//! (Local policy). No kernel, no root.

use flock_agent::k8s::services::spawn_watches;
use flock_agent::routing::services::ServiceState;
use flock_ipam::ServiceRanges;
use flock_testkit::kube_mock::*;
use flock_testkit::wait::eventually;
use ipnet::IpNet;
use serde_json::{Value, json};

fn lb_service(policy: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": "web", "resourceVersion": "5"},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": policy,
                 "clusterIP": "fd97::10", "ipFamilies": ["IPv6", "IPv4"]},
        "status": {"loadBalancer": {"ingress": [{"ip": "2001:db8:5::1"}, {"ip": "203.0.113.1"}]}}
    })
}

fn slice(node: &str, rv: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "default", "name": "web-6x", "resourceVersion": rv,
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv6",
        "endpoints": [{"addresses": ["2001:db8:0:1::5"], "conditions": {"ready": true},
                       "nodeName": node}]
    })
}

#[tokio::test]
async fn v1_slices_are_watched_and_local_routes_follow_the_endpoint() {
    let (client, mut api) = mock_client();
    let state = ServiceState::new();
    spawn_watches(client, state.clone());
    let ranges = ServiceRanges {
        load_balancer: vec![
            "2001:db8:5::/120".parse().unwrap(),
            "203.0.113.0/28".parse().unwrap(),
        ],
        ..ServiceRanges::default()
    };
    // Both watches list, then watch; the slice watch brings the endpoint to node-b.
    let mut slice_watch = None;
    let mut service_watch = None;
    while slice_watch.is_none() || service_watch.is_none() {
        let (req, reply) = next_request(&mut api).await;
        let path = req.uri().path().to_owned();
        let watch = query_param(&req, "watch").is_some();
        match (path.as_str(), watch) {
            ("/api/v1/services", false) => reply_json(
                reply,
                &list("ServiceList", "v1", "10", vec![lb_service("Local")]),
            ),
            ("/apis/discovery.k8s.io/v1/endpointslices", false) => reply_json(
                reply,
                &list(
                    "EndpointSliceList",
                    "discovery.k8s.io/v1",
                    "10",
                    vec![slice("node-a", "6")],
                ),
            ),
            ("/api/v1/services", true) => service_watch = Some(reply),
            ("/apis/discovery.k8s.io/v1/endpointslices", true) => slice_watch = Some(reply),
            other => panic!("unexpected request {other:?}"),
        }
    }
    let routes = |node: &str| -> Vec<IpNet> {
        state
            .announcement(node, &ranges)
            .routes
            .into_iter()
            .collect()
    };
    eventually("both watches synced", || state.is_synced()).await;
    assert_eq!(
        routes("node-a"),
        [
            "203.0.113.1/32".parse::<IpNet>().unwrap(),
            "2001:db8:5::1/128".parse().unwrap()
        ]
    );
    assert!(routes("node-b").is_empty(), "Local: no endpoint on node-b");
    // The endpoint moves to node-b: node-a withdraws, node-b announces.
    reply_events(
        slice_watch.take().unwrap(),
        &[event("MODIFIED", slice("node-b", "7"))],
    );
    eventually("the route follows the endpoint", || {
        routes("node-a").is_empty() && routes("node-b").len() == 2
    })
    .await;
    drop(service_watch);
}
