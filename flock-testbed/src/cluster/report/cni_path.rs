//! The CNI path as the kubelet and containerd see it: the annotations a pod's addresses
//! come from, and sandboxes that failed.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::Value;

use super::super::deploy::DEMO_NS;
use super::super::{NODES, kubectl, kubectl_stdin, node};
use super::{Report, json};
use crate::sys;

/// Which path gave the agent the pod's annotations: for one probe pod, node1's shim is
/// wrapped by a script that records the network configuration the runtime (or Multus, in
/// front of flock) passes on stdin;
/// the agent takes the annotations from its `runtimeConfig` when they are there (DESIGN §7),
/// from the pod watcher otherwise.
pub(super) fn annotations_path(r: &mut Report) -> Result<()> {
    let n = &NODES[0];
    let host = node::dir(n).join("host");
    let bin = host.join("opt-cni-bin");
    let record_in_node = "/var/lib/cni/flockcluster-probe.json";
    let record = host.join("var-lib-cni/flockcluster-probe.json");
    let _ = std::fs::remove_file(&record);
    let wrapper = format!(
        "#!/bin/sh\n# cargo xtask cluster: records the network configuration of one ADD, then runs flock.\n\
         if [ \"$CNI_COMMAND\" = ADD ]; then tee {record_in_node} | /opt/cni/bin/flock.real; exit $?; fi\n\
         exec /opt/cni/bin/flock.real \"$@\"\n"
    );
    let wrapped = bin.join("flock.wrapper");
    std::fs::write(&wrapped, wrapper).context("write the shim wrapper")?;
    sys::output(Command::new("chmod").arg("755").arg(&wrapped))?;
    std::fs::rename(bin.join("flock"), bin.join("flock.real")).context("move the shim aside")?;
    std::fs::rename(&wrapped, bin.join("flock")).context("install the shim wrapper")?;
    let probe = format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: annotations-probe
  namespace: {DEMO_NS}
  annotations: {{ flock.fritzlab.net/ip-algo: \"ns:16,pod:32\", flockcluster/probe: \"1\" }}
spec:
  nodeName: {node}
  dnsPolicy: Default
  terminationGracePeriodSeconds: 0
  automountServiceAccountToken: false
  containers:
    - {{ name: net, image: {image}, imagePullPolicy: Never }}
",
        node = n.name,
        image = super::super::images::NET,
    );
    let created = kubectl_stdin(&["apply", "-f", "-"], &probe).and_then(|_| {
        kubectl(&[
            "-n",
            DEMO_NS,
            "wait",
            "--for=condition=Ready",
            "pod/annotations-probe",
            "--timeout=60s",
        ])
    });
    // Whatever happened: the real shim back in place, the probe pod gone.
    let restored = std::fs::rename(bin.join("flock.real"), bin.join("flock"));
    let _ = kubectl(&[
        "-n",
        DEMO_NS,
        "delete",
        "pod",
        "annotations-probe",
        "--wait=false",
    ]);
    restored.context("put the real shim back")?;
    created.context("the probe pod did not become ready")?;
    let text =
        std::fs::read_to_string(&record).with_context(|| format!("read {}", record.display()))?;
    let _ = std::fs::remove_file(&record);
    // A plugin reads its own configuration from the conflist on stdin, with the network's
    // name and cniVersion, and the runtimeConfig of the capabilities it declares.
    let plugin: Value = serde_json::from_str(&text).context("parse the recorded network config")?;
    let conf = &plugin;
    let from_runtime = &plugin["runtimeConfig"]["io.kubernetes.cri.pod-annotations"];
    let containerd = super::super::kube::ensure_built()
        .and_then(|kube| {
            sys::output(Command::new(kube.containerd_bin().join("containerd")).arg("--version"))
        })
        .unwrap_or_default()
        .split_whitespace()
        .nth(2)
        .unwrap_or("?")
        .to_owned();
    r.text
        .push_str("POD ANNOTATIONS PATH (what node1's containerd passed the shim for one pod)\n");
    let rows = vec![
        vec![
            "runtime".to_owned(),
            format!(
                "containerd {containerd}, conflist cniVersion {}",
                conf["cniVersion"].as_str().unwrap_or("?")
            ),
        ],
        vec![
            "capabilities in the conflist".to_owned(),
            plugin["capabilities"].to_string(),
        ],
        vec![
            "runtimeConfig keys passed".to_owned(),
            plugin["runtimeConfig"]
                .as_object()
                .map(|m| m.keys().cloned().collect::<Vec<_>>().join(", "))
                .unwrap_or_else(|| "none".into()),
        ],
        vec![
            "io.kubernetes.cri.pod-annotations".to_owned(),
            if let Some(all) = from_runtime.as_object() {
                // flock's own keys; the kubelet adds a few of its own to every pod.
                let flock: serde_json::Map<String, Value> = all
                    .iter()
                    .filter(|(k, _)| k.starts_with("flock.fritzlab.net/"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                format!(
                    "{} (and {} more: {})",
                    Value::Object(flock.clone()),
                    all.len() - flock.len(),
                    all.keys()
                        .filter(|k| !flock.contains_key(*k))
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                "absent".into()
            },
        ],
        vec![
            "the agent took the annotations from".to_owned(),
            if from_runtime["flock.fritzlab.net/ip-algo"].is_string() {
                "runtimeConfig (io.kubernetes.cri.pod-annotations); the pod watcher gave the pod itself".into()
            } else if super::super::multus::installed() {
                // Multus hands its delegates the runtime configuration it knows (port
                // mappings, bandwidth, …), not this key: the pod watcher is flock's path there
                "the pod watcher (Multus, in front of flock, passes its delegates no \
                 io.kubernetes.cri.pod-annotations)"
                    .into()
            } else {
                r.failures.push(
                    "containerd passed no io.kubernetes.cri.pod-annotations: the agent fell back to the pod watcher"
                        .into(),
                );
                "the pod watcher".into()
            },
        ],
    ];
    sys::table(&mut r.text, &["what", "seen"], &rows);
    Ok(())
}

/// The kubelets' `FailedCreatePodSandBox` events, by cause. Reported, not failed: the
/// kubelet retries, and every pod above is Running. (A cause seen before: containerd 1.6
/// runs the `loopback` plugin concurrently with flock, and that plugin refuses a `lo` that
/// holds a non-loopback address — why flock puts anycast addresses on the pod's interface.)
pub(super) fn sandbox_failures(r: &mut Report) -> Result<()> {
    let events = json(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=FailedCreatePodSandBox",
        "-o",
        "json",
    ])?;
    let mut causes: BTreeMap<String, (u64, BTreeSet<String>)> = BTreeMap::new();
    for e in events["items"].as_array().into_iter().flatten() {
        let msg = e["message"].as_str().unwrap_or("");
        // "… failed to setup network for sandbox \"ID\": CAUSE"
        let cause = msg.rsplit_once("\": ").map_or(msg, |(_, c)| c).to_owned();
        let pod = e["involvedObject"]["name"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        let entry = causes.entry(cause).or_default();
        entry.0 += e["count"].as_u64().unwrap_or(1);
        entry.1.insert(pod);
    }
    r.text.push_str(
        "SANDBOX RETRIES (kubelet events FailedCreatePodSandBox since the cluster started; the kubelet retried each)\n",
    );
    if causes.is_empty() {
        r.text.push_str("none\n\n");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = causes
        .into_iter()
        .map(|(cause, (n, pods))| {
            vec![
                n.to_string(),
                pods.into_iter().collect::<Vec<_>>().join(" "),
                cause,
            ]
        })
        .collect();
    sys::table(&mut r.text, &["times", "pods", "cause"], &rows);
    Ok(())
}
