//! Service announcing against a mocked API server: discovery picks 1.20's
//! `discovery.k8s.io/v1beta1` EndpointSlices, the Service and EndpointSlice watches fill the
//! state, and this node's routes follow its ready endpoints (Local policy). No kernel, no root.

mod k8s_support;

use std::time::Duration;

use flock_agent::k8s::services::{endpoint_slice_resource, spawn_watches};
use flock_agent::services::ServiceState;
use flock_ipam::ServiceRanges;
use ipnet::IpNet;
use k8s_support::*;
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
        "apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice",
        "metadata": {"namespace": "default", "name": "web-6x", "resourceVersion": rv,
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv6",
        "endpoints": [{"addresses": ["2001:db8:0:1::5"], "conditions": {"ready": true},
                       "topology": {"kubernetes.io/hostname": node}}]
    })
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test]
async fn on_1_20_v1beta1_slices_are_watched_and_local_routes_follow_the_endpoint() {
    let (client, mut api) = mock_client();
    let discovery = tokio::spawn({
        let client = client.clone();
        async move { endpoint_slice_resource(&client).await }
    });
    // 1.20 serves EndpointSlices only as v1beta1.
    let (req, reply) = next_request(&mut api).await;
    assert_eq!(req.uri().path(), "/apis");
    reply_json(
        reply,
        &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [{
            "name": "discovery.k8s.io",
            "versions": [{"groupVersion": "discovery.k8s.io/v1beta1", "version": "v1beta1"}],
            "preferredVersion": {"groupVersion": "discovery.k8s.io/v1beta1", "version": "v1beta1"}
        }]}),
    );
    let (req, reply) = next_request(&mut api).await;
    assert_eq!(req.uri().path(), "/apis/discovery.k8s.io/v1beta1");
    reply_json(
        reply,
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "discovery.k8s.io/v1beta1",
                "resources": [{"name": "endpointslices", "singularName": "", "namespaced": true,
                               "kind": "EndpointSlice", "verbs": ["list", "watch"]}]}),
    );
    let slices = discovery.await.unwrap().expect("discovery");
    assert_eq!(slices.version, "v1beta1");

    let state = ServiceState::new();
    spawn_watches(client, slices, state.clone());
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
            ("/apis/discovery.k8s.io/v1beta1/endpointslices", false) => reply_json(
                reply,
                &list(
                    "EndpointSliceList",
                    "discovery.k8s.io/v1beta1",
                    "10",
                    vec![slice("node-a", "6")],
                ),
            ),
            ("/api/v1/services", true) => service_watch = Some(reply),
            ("/apis/discovery.k8s.io/v1beta1/endpointslices", true) => slice_watch = Some(reply),
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
