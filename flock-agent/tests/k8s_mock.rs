//! Kubernetes mode against a mocked API server (`tower_test::mock::pair` behind
//! `kube::Client`): the pod watcher's requests and lookups, the status PATCH, and the
//! workload-name rule on real owner-reference shapes. No kernel, no root.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flock_agent::k8s::node_status::{StatusInputs, build_status, write_status};
use flock_agent::k8s::pods::{PodWatcher, Presence};
use flock_agent::pods::{PodDirectory, PodInfo};
use flock_agent::policy::{Applied, PolicyStatus};
use flock_agent::store::{AllocationRecord, PodRef, RecordState, STORE_FORMAT};
use flock_cni_proto::ErrorCode;
use flock_k8s_api::NodeConfig;
use flock_testkit::kube_mock::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

const NODE: &str = "node-a";

/// Serves the pod watcher's first LIST (empty) and returns the WATCH that follows, asserting
/// both carry the node's field selector.
async fn serve_empty_listing(api: &mut ApiHandle) -> Reply {
    let (req, reply) = next_request(api).await;
    assert_eq!(req.method(), http::Method::GET);
    assert_eq!(req.uri().path(), "/api/v1/pods");
    let raw = req.uri().query().unwrap_or_default().to_owned();
    assert!(
        raw.contains("fieldSelector=spec.nodeName%3Dnode-a"),
        "LIST must select the node's pods server-side: {raw}"
    );
    assert_eq!(
        query_param(&req, "watch"),
        None,
        "the first request is a LIST: {raw}"
    );
    reply_json(reply, &list("PodList", "v1", "100", vec![]));

    let (req, reply) = next_request(api).await;
    let raw = req.uri().query().unwrap_or_default().to_owned();
    assert_eq!(req.uri().path(), "/api/v1/pods");
    assert_eq!(query_param(&req, "watch").as_deref(), Some("true"), "{raw}");
    assert!(
        raw.contains("fieldSelector=spec.nodeName%3Dnode-a"),
        "WATCH must select the node's pods server-side: {raw}"
    );
    assert_eq!(
        query_param(&req, "fieldSelector").as_deref(),
        Some("spec.nodeName=node-a")
    );
    assert_eq!(query_param(&req, "resourceVersion").as_deref(), Some("100"));
    reply
}

#[tokio::test]
async fn lookup_waits_for_a_pod_that_arrives_by_a_watch_event() {
    let (client, mut api) = mock_client();
    let pods = PodWatcher::spawn(client, NODE);
    assert_eq!(
        pods.exists("shop", "web-7d4b9c6f5-x2x9k"),
        None,
        "not synced yet"
    );
    let watch = serve_empty_listing(&mut api).await;
    assert!(pods.is_synced());
    assert_eq!(pods.exists("shop", "web-7d4b9c6f5-x2x9k"), Some(false));

    let lookup = {
        let pods = pods.clone();
        tokio::spawn(async move {
            pods.lookup("shop", "web-7d4b9c6f5-x2x9k", Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!lookup.is_finished(), "the lookup must wait for the pod");

    reply_events(
        watch,
        &[event(
            "ADDED",
            deployment_pod("shop", "web-7d4b9c6f5-x2x9k", NODE, "101"),
        )],
    );
    let info = tokio::time::timeout(Duration::from_secs(10), lookup)
        .await
        .expect("the watch event must wake the lookup well before its bound")
        .expect("lookup task")
        .expect("the pod arrived");
    assert_eq!(info.pod.namespace, "shop");
    assert_eq!(info.pod.name, "web-7d4b9c6f5-x2x9k");
    assert_eq!(info.pod.uid, "uid-web-7d4b9c6f5-x2x9k");
    assert_eq!(info.workload, "web");
    assert_eq!(info.image.as_deref(), Some("registry.example/web:1.4.2"));
    assert_eq!(
        info.annotations
            .get("flock.fritzlab.net/ip-algo")
            .map(String::as_str),
        Some("workload")
    );
    assert_eq!(pods.exists("shop", "web-7d4b9c6f5-x2x9k"), Some(true));
    let mut record_pod = info.pod.clone();
    assert_eq!(pods.presence(&record_pod), Presence::Present);
    record_pod.uid = "an-older-pod-of-the-same-name".into();
    assert_eq!(pods.presence(&record_pod), Presence::Absent);

    // The watcher re-watches from the last resource version, still with the selector.
    let (req, _hold) = next_request(&mut api).await;
    assert_eq!(
        query_param(&req, "fieldSelector").as_deref(),
        Some("spec.nodeName=node-a")
    );
    assert_eq!(query_param(&req, "resourceVersion").as_deref(), Some("101"));
}

#[tokio::test]
async fn lookup_of_a_pod_that_never_arrives_fails_after_the_bound_and_names_it() {
    let (client, mut api) = mock_client();
    let pods = PodWatcher::spawn(client, NODE);
    let _watch = serve_empty_listing(&mut api).await;
    let started = std::time::Instant::now();
    let err = pods
        .lookup("shop", "ghost", Duration::from_millis(300))
        .await
        .expect_err("the pod never arrives");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "waited the bound"
    );
    assert_eq!(err.code, ErrorCode::TryAgainLater, "retryable: {err:?}");
    assert!(err.msg.contains("shop/ghost"), "names the pod: {}", err.msg);
    assert!(err.msg.contains(NODE), "names the node: {}", err.msg);
    insta::assert_snapshot!(format!("{}\n{}", err.msg, err.details));
}

#[tokio::test]
async fn lookup_before_the_first_listing_says_the_watcher_is_not_synced() {
    let (client, mut api) = mock_client();
    let pods = PodWatcher::spawn(client, NODE);
    // Hold the LIST unanswered.
    let (_req, _hold) = next_request(&mut api).await;
    let err = pods
        .lookup("shop", "web", Duration::from_millis(100))
        .await
        .expect_err("no listing yet");
    assert_eq!(err.code, ErrorCode::TryAgainLater);
    assert!(err.details.contains("first listing"), "{err:?}");
    assert_eq!(
        pods.presence(&PodRef {
            namespace: "shop".into(),
            name: "web".into(),
            uid: String::new()
        }),
        Presence::Unknown
    );
}

fn node_config() -> NodeConfig {
    serde_yaml::from_str(
        "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: node-a
spec:
  cidr6: 2001:db8:0:1::/64
  cidr4: 10.244.1.0/24
  bgp:
    asn: 64512
    routerId: 10.0.0.1
    neighbors:
      - { address: \"2001:db8::fe\", asn: 65000 }
      - { address: \"10.0.0.254\", asn: 65000 }
",
    )
    .expect("fixture")
}

fn record(id: &str, v6: &str, v4: Option<&str>) -> AllocationRecord {
    AllocationRecord {
        format: STORE_FORMAT,
        state: RecordState::Committed,
        network: "flock".into(),
        container_id: id.into(),
        if_name: "eth0".into(),
        netns: format!("/var/run/netns/cni-{id}"),
        boot_id: String::new(),
        pod: Some(PodRef {
            namespace: "shop".into(),
            name: id.into(),
            uid: String::new(),
        }),
        ipv6: Some(v6.parse().expect("v6")),
        ipv4: v4.map(|a| a.parse().expect("v4")),
        addresses: vec![],
        anycast: vec![],
        mtu: 1500,
        host_if: format!("flock{id}"),
        host_mac: String::new(),
        pod_mac: String::new(),
        flock_network: None,
        default_route: true,
        routes: Vec::new(),
    }
}

#[tokio::test]
async fn status_patch_is_a_merge_patch_of_counts_sessions_and_conditions() {
    let settings = node_config().settings().expect("valid");
    let names: Vec<(String, String)> = settings
        .bgp
        .as_ref()
        .expect("bgp")
        .validate()
        .expect("valid model")
        .neighbors()
        .iter()
        .map(|n| (n.peer(), n.name().to_owned()))
        .collect();
    let mut protocols = BTreeMap::new();
    protocols.insert("device1".to_owned(), "up".to_owned());
    for (address, name) in &names {
        // BIRD's Info column: the state, then why a session is down.
        let state = if address.contains(':') {
            "Established"
        } else {
            "Active Socket: Connection refused"
        };
        protocols.insert(name.clone(), state.to_owned());
    }
    let inputs = StatusInputs {
        settings: Some(Arc::new(settings)),
        records: vec![
            record("a", "2001:db8:0:1::a", Some("10.244.1.10")),
            record("b", "2001:db8:0:1::b", None),
        ],
        protocols: Some(Ok(protocols)),
        problems: BTreeMap::new(),
        serving: true,
        policy: None,
    };
    let now = Timestamp::from_second(1_800_000_000).expect("time");
    let status = build_status(&inputs, None, now);
    assert_eq!((status.allocated6, status.allocated4), (2, 1));

    let (client, mut api) = mock_client();
    let write = tokio::spawn(async move { write_status(&client, NODE, &status).await });
    let (req, reply) = next_request(&mut api).await;
    assert_eq!(req.method(), http::Method::PATCH);
    assert_eq!(
        req.uri().path(),
        "/apis/flock.fritzlab.net/v1alpha1/nodeconfigs/node-a/status"
    );
    assert_eq!(
        req.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/merge-patch+json")
    );
    let body = req.into_body().collect_bytes().await.expect("body");
    let body: Value = serde_json::from_slice(&body).expect("json body");
    insta::assert_json_snapshot!(body);
    let mut answer = serde_json::to_value(node_config()).expect("json");
    answer["status"] = body["status"].clone();
    reply_json(reply, &answer);
    write.await.expect("task").expect("patch accepted");
}

#[tokio::test]
async fn the_status_patch_carries_a_network_policy_condition_that_names_a_failed_apply() {
    let applied_at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
    let mut inputs = StatusInputs {
        settings: Some(Arc::new(node_config().settings().expect("valid"))),
        serving: true,
        policy: Some(PolicyStatus {
            applied: Applied {
                policies: 12,
                invalid: 1,
                isolated_pods: 7,
                at: Some(applied_at),
            },
            failed: None,
            not_as_written: vec![
                "clusternetworkpolicy lab: spec.ingress[0].from[0].nodes: unsupported (enforced fail-closed)".into(),
            ],
        }),
        ..StatusInputs::default()
    };
    let now = Timestamp::from_second(1_800_000_060).expect("time");
    let condition = |status: &flock_k8s_api::NodeConfigStatus| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "NetworkPolicy")
            .cloned()
            .expect("a NetworkPolicy condition")
    };
    let ok = build_status(&inputs, None, now);
    let c = condition(&ok);
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Applied"));
    assert!(
        c.message
            .starts_with("12 policies in the cluster (1 not enforced as written"),
        "{}",
        c.message
    );
    assert!(
        c.message
            .ends_with("7 isolated pods on this node, last applied at 2027-01-15T08:00:00Z"),
        "{}",
        c.message
    );

    // the policy not enforced as written, named with its field in a condition of its own
    let valid = ok
        .conditions
        .iter()
        .find(|c| c.type_ == "PoliciesValid")
        .expect("a PoliciesValid condition");
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", "NotAsWritten")
    );
    assert_eq!(
        valid.message,
        "1 not enforced as written: clusternetworkpolicy lab: spec.ingress[0].from[0].nodes: unsupported (enforced fail-closed)"
    );

    let refused = "nft -f - in the current namespace exited with exit status: 1: Error: Could not process rule: No such file or directory";
    inputs.policy.as_mut().expect("policy").failed = Some(refused.into());
    let failed = build_status(&inputs, Some(&ok), now);

    // what the writer PATCHes
    let (client, mut api) = mock_client();
    let write = tokio::spawn(async move { write_status(&client, NODE, &failed).await });
    let (req, reply) = next_request(&mut api).await;
    assert_eq!(req.method(), http::Method::PATCH);
    let body = req.into_body().collect_bytes().await.expect("body");
    let body: Value = serde_json::from_slice(&body).expect("json body");
    let conditions = body["status"]["conditions"].as_array().expect("conditions");
    let np = conditions
        .iter()
        .find(|c| c["type"] == "NetworkPolicy")
        .expect("the condition is in the PATCH");
    assert_eq!(np["status"], "False");
    assert_eq!(np["reason"], "ApplyFailed");
    let message = np["message"].as_str().expect("message");
    assert!(message.contains(refused), "the error nft gave: {message}");
    assert!(message.contains("in force: 12 policies"), "{message}");
    assert_eq!(np["lastTransitionTime"], "2027-01-15T08:01:00Z");
    let mut answer = serde_json::to_value(node_config()).expect("json");
    answer["status"] = body["status"].clone();
    reply_json(reply, &answer);
    write.await.expect("task").expect("patch accepted");

    // off: no condition at all
    inputs.policy = None;
    assert!(
        build_status(&inputs, None, now)
            .conditions
            .iter()
            .all(|c| c.type_ != "NetworkPolicy")
    );
}

fn pod(value: Value) -> Pod {
    serde_json::from_value(value).expect("pod fixture")
}

fn owned_pod(name: &str, owner: Option<(&str, &str)>, hash: Option<&str>) -> Pod {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "shop", "uid": format!("uid-{name}") },
        "spec": { "containers": [{ "name": "c", "image": "registry.example/app:1" }] }
    });
    if let Some((kind, owner_name)) = owner {
        let api_version = if kind == "Job" { "batch/v1" } else { "apps/v1" };
        v["metadata"]["ownerReferences"] = json!([
            // A non-controller owner first: only the controller counts.
            { "apiVersion": "v1", "kind": "ConfigMap", "name": "not-the-controller", "uid": "x" },
            { "apiVersion": api_version, "kind": kind, "name": owner_name, "uid": "o",
              "controller": true, "blockOwnerDeletion": true }
        ]);
    }
    if let Some(h) = hash {
        v["metadata"]["labels"] = json!({ "pod-template-hash": h, "app": "x" });
    }
    pod(v)
}

#[test]
fn workload_names_of_real_owner_shapes() {
    let cases = [
        (
            owned_pod(
                "web-7d4b9c6f5-x2x9k",
                Some(("ReplicaSet", "web-7d4b9c6f5")),
                Some("7d4b9c6f5"),
            ),
            "web",
        ),
        (owned_pod("db-0", Some(("StatefulSet", "db")), None), "db"),
        (
            owned_pod(
                "node-exporter-8xk2p",
                Some(("DaemonSet", "node-exporter")),
                None,
            ),
            "node-exporter",
        ),
        (
            owned_pod(
                "backup-28001234-q7n4d",
                Some(("Job", "backup-28001234")),
                None,
            ),
            "backup-28001234",
        ),
        (owned_pod("debug", None, None), "debug"),
        // A ReplicaSet made by hand (no pod-template-hash): its own name.
        (
            owned_pod("legacy-abcde", Some(("ReplicaSet", "legacy")), None),
            "legacy",
        ),
    ];
    for (pod, want) in cases {
        let info = PodInfo::from_pod(&pod);
        assert_eq!(info.workload, want, "{:?}", pod.metadata.name);
        assert_eq!(info.image.as_deref(), Some("registry.example/app:1"));
        assert_eq!(info.pod.namespace, "shop");
    }
    // Only a controller owner counts: a pod with a non-controller owner is its own workload.
    let mut p = owned_pod("solo", None, None);
    p.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "other", "uid": "u"
        }))
        .expect("owner"),
    ]);
    assert_eq!(PodInfo::from_pod(&p).workload, "solo");
}

#[test]
fn two_replicas_of_one_deployment_share_their_workload_prefix() {
    use rand_core::SeedableRng;
    let cidr6: ipnet::Ipv6Net = "2001:db8:0:1::/64".parse().expect("cidr");
    let mut pools = flock_ipam::Pools::new(Some(cidr6), None).expect("pools");
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(7);
    let node = flock_ipam::NodeDefaults::for_cidrs(true, false);
    let mut allocate = |pod: &Pod, container_id: &str| {
        let info = PodInfo::from_pod(pod);
        let request = flock_ipam::PodRequest::from_annotations(&info.annotations, &node)
            .expect("annotations");
        let identity = flock_embed::Identity {
            namespace: &info.pod.namespace,
            workload: &info.workload,
            image: info.image.as_deref(),
            pod: &info.pod.name,
            container_id,
        };
        pools
            .allocate(&request, &identity, &mut rng)
            .expect("allocate")
            .ipv6
            .expect("ipv6")
    };
    let a = allocate(
        &pod(deployment_pod("shop", "web-7d4b9c6f5-x2x9k", NODE, "1")),
        "c1",
    );
    let b = allocate(
        &pod(deployment_pod("shop", "web-7d4b9c6f5-9qw7z", NODE, "2")),
        "c2",
    );
    let mut other = deployment_pod("shop", "api-5c8f7b-aaaaa", NODE, "3");
    other["metadata"]["labels"]["pod-template-hash"] = json!("5c8f7b");
    other["metadata"]["ownerReferences"][0]["name"] = json!("api-5c8f7b");
    let c = allocate(&pod(other), "c3");
    assert_ne!(a, b);
    // workload = ns:16,app:24,image:8,n:8: the replicas share /64 + 48 bits.
    let prefix =
        |addr: std::net::Ipv6Addr, len: u8| ipnet::Ipv6Net::new(addr, len).expect("prefix").trunc();
    assert_eq!(prefix(a, 112), prefix(b, 112), "{a} and {b}");
    // Another Deployment in the namespace shares the ns bits only.
    assert_eq!(prefix(a, 80), prefix(c, 80), "{a} and {c}");
    assert_ne!(prefix(a, 104), prefix(c, 104), "{a} and {c}");
}

/// A NodeConfig whose first neighbor takes its password from a Secret.
fn node_config_with_secret() -> NodeConfig {
    serde_yaml::from_str(
        "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: node-a
spec:
  cidr6: 2001:db8:0:1::/64
  bgp:
    asn: 64512
    routerId: 10.0.0.1
    neighbors:
      - address: \"2001:db8::fe\"
        asn: 65000
        passwordSecretRef: { name: flock-bgp-passwords, namespace: kube-system, key: tor-a }
      - { address: \"2001:db8::fd\", asn: 65000 }
",
    )
    .expect("fixture")
}

/// Answers the one GET of the named Secret, asserting it is exactly that request.
async fn serve_secret(api: &mut ApiHandle, status: u16, body: Value) {
    let (req, reply) = next_request(api).await;
    assert_eq!(req.method(), http::Method::GET);
    assert_eq!(
        req.uri().path(),
        "/api/v1/namespaces/kube-system/secrets/flock-bgp-passwords",
        "the agent reads the one Secret it is told, never lists Secrets"
    );
    reply.send_response(
        http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
}

#[tokio::test]
async fn a_password_secret_is_read_by_name_into_the_bird_model() {
    use flock_agent::k8s::secrets::{SecretReader, fill_passwords};
    let (client, mut api) = mock_client();
    let reader = SecretReader::new(client);
    let mut settings = node_config_with_secret().settings().expect("valid");
    let fill = tokio::spawn(async move {
        let problems = fill_passwords(&mut settings, &reader, None).await;
        (settings, problems)
    });
    // `s3cret\n` in base64: the trailing newline of `kubectl create secret --from-file` goes.
    serve_secret(
        &mut api,
        200,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "flock-bgp-passwords", "namespace": "kube-system" },
            "data": { "tor-a": "czNjcmV0Cg==", "tor-b": "b3RoZXI=" }
        }),
    )
    .await;
    let (settings, problems) = fill.await.unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let model = settings.bgp.expect("bgp");
    assert_eq!(model.neighbors[0].password.as_deref(), Some("s3cret"));
    assert_eq!(model.neighbors[1].password, None);
    let conf = flock_bird::render(&model.validate().unwrap());
    assert!(conf.contains("  password \"s3cret\";\n"), "{conf}");
}

#[tokio::test]
async fn a_password_secret_that_cannot_be_read_leaves_the_neighbor_out_and_says_why() {
    use flock_agent::k8s::secrets::{SecretReader, fill_passwords};
    for (status, body, why) in [
        (
            403,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                   "reason": "Forbidden",
                   "message": "secrets \"flock-bgp-passwords\" is forbidden: User \"system:serviceaccount:kube-system:flock\" cannot get resource \"secrets\""}),
            "the agent may not read it (RBAC",
        ),
        (
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                   "reason": "NotFound", "message": "secrets \"flock-bgp-passwords\" not found"}),
            "no such Secret",
        ),
        (
            200,
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": { "name": "flock-bgp-passwords", "namespace": "kube-system" },
                   "data": { "tor-b": "b3RoZXI=" }}),
            "the Secret has no such key",
        ),
        (
            200,
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": { "name": "flock-bgp-passwords", "namespace": "kube-system" },
                   "data": { "tor-a": "YSJi" }}),
            "cannot be written into the BIRD configuration",
        ),
    ] {
        let (client, mut api) = mock_client();
        let reader = SecretReader::new(client);
        let mut settings = node_config_with_secret().settings().expect("valid");
        let fill = tokio::spawn(async move {
            let problems = fill_passwords(&mut settings, &reader, None).await;
            (settings, problems)
        });
        serve_secret(&mut api, status, body).await;
        let (settings, problems) = fill.await.unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("spec.bgp.neighbors[0].passwordSecretRef: "),
            "{}",
            problems[0]
        );
        assert!(problems[0].contains(why), "{status}: {}", problems[0]);
        assert!(
            !problems[0].contains("a\"b"),
            "the value leaked: {}",
            problems[0]
        );
        // The neighbor is not configured without its password; the other one is.
        let model = settings.bgp.expect("bgp");
        let addresses: Vec<&str> = model.neighbors.iter().map(|n| n.address.as_str()).collect();
        assert_eq!(addresses, ["2001:db8::fd"]);
    }
}

#[tokio::test]
async fn a_password_read_before_stays_in_use_when_the_secret_cannot_be_read_again() {
    use flock_agent::k8s::secrets::{SecretReader, fill_passwords};
    let (client, mut api) = mock_client();
    let reader = SecretReader::new(client);
    let mut in_force = node_config_with_secret().settings().expect("valid");
    if let Some(model) = in_force.bgp.as_mut() {
        model.neighbors[0].password = Some("s3cret".into());
    }
    let mut settings = node_config_with_secret().settings().expect("valid");
    let fill = tokio::spawn(async move {
        let problems = fill_passwords(&mut settings, &reader, Some(&in_force)).await;
        (settings, problems)
    });
    // The API server is unavailable: the session must not be reset for that.
    serve_secret(
        &mut api,
        503,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
               "reason": "ServiceUnavailable", "message": "etcd is down"}),
    )
    .await;
    let (settings, problems) = fill.await.unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].ends_with("the password read before stays in use"),
        "{}",
        problems[0]
    );
    let model = settings.bgp.expect("bgp");
    assert_eq!(model.neighbors.len(), 2);
    assert_eq!(model.neighbors[0].password.as_deref(), Some("s3cret"));
}
