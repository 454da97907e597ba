//! A mocked API server for the Kubernetes-mode tests: `tower_test::mock::pair` behind
//! `kube::Client`, so each test sees the exact requests and answers them with fixtures.
use std::time::Duration;

use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// The test's side of the mocked API server.
pub type ApiHandle = tower_test::mock::Handle<http::Request<Body>, http::Response<Body>>;
/// Answers one request.
pub type Reply = tower_test::mock::SendResponse<http::Response<Body>>;

/// A client talking to a mocked API server.
pub fn mock_client() -> (Client, ApiHandle) {
    let (service, handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
    (Client::new(service, "default"), handle)
}

/// The next request the client sends (fails the test after 10 s).
pub async fn next_request(handle: &mut ApiHandle) -> (http::Request<Body>, Reply) {
    tokio::time::timeout(Duration::from_secs(10), handle.next_request())
        .await
        .expect("the client sent no request within 10 s")
        .expect("the client is gone")
}

/// Answers with one JSON document.
pub fn reply_json(reply: Reply, body: &Value) {
    reply.send_response(
        http::Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("response"),
    );
}

/// Answers a WATCH with these events (one JSON object per line); the stream then ends and the
/// watcher sends its next WATCH.
pub fn reply_events(reply: Reply, events: &[Value]) {
    let mut body = Vec::new();
    for e in events {
        body.extend(serde_json::to_vec(e).expect("json"));
        body.push(b'\n');
    }
    reply.send_response(
        http::Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("response"),
    );
}

/// Whether a request's query has `key=value` (value compared url-decoded).
pub fn query_param(req: &http::Request<Body>, key: &str) -> Option<String> {
    let query = req.uri().query()?;
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).expect("utf-8")
}

/// A list response.
pub fn list(kind: &str, api_version: &str, resource_version: &str, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": { "resourceVersion": resource_version },
        "items": items,
    })
}

/// A watch event.
pub fn event(kind: &str, object: Value) -> Value {
    json!({ "type": kind, "object": object })
}

/// A pod of `node` owned by the ReplicaSet of Deployment `web` (pod-template-hash label).
pub fn deployment_pod(namespace: &str, name: &str, node: &str, rv: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": format!("uid-{name}"),
            "resourceVersion": rv,
            "labels": { "app": "web", "pod-template-hash": "7d4b9c6f5" },
            "annotations": { "flock.fritzlab.net/ip-algo": "workload" },
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c6f5",
                "uid": "rs-uid", "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "nodeName": node,
            "containers": [{ "name": "web", "image": "registry.example/web:1.4.2" }]
        }
    })
}

/// Answers with an API error (`Status`) of this HTTP code and reason.
pub fn reply_error(reply: Reply, code: u16, reason: &str) {
    let body = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": format!("mock: {reason}"), "reason": reason, "code": code,
    });
    reply.send_response(
        http::Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).expect("json")))
            .expect("response"),
    );
}

/// A request's body as JSON.
pub async fn body_json(req: http::Request<Body>) -> Value {
    let bytes = req.into_body().collect_bytes().await.expect("body");
    serde_json::from_slice(&bytes).expect("a JSON body")
}
