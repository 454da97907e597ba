//! A plugin another author writes with flock's CNI library: `examples/pod-records`, a crate
//! outside the workspace that depends on `flock-cni-proto` by path, built here with its own
//! lock file and run by the CNI runtime stand-in chained after the reference `ptp` plugin
//! (CNI 1.1.0: ADD, CHECK, DEL, STATUS and GC), in stand-in namespaces.
#![cfg(feature = "root-tests")]

use std::path::{Path, PathBuf};

use flock_testkit::Netns;
use flock_testkit::cni::{Attachment, GcAttachment, Runtime};
use serde_json::{Value, json};

/// Builds `examples/pod-records` on its own (not a workspace member) and returns the
/// directory holding its binary.
fn build_pod_records() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    // Beside the workspace's own build (`CARGO_TARGET_DIR` when CI keeps it in its cache).
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("outside-workspace");
    flock_testkit::cargo([
        "build".as_ref(),
        "--locked".as_ref(),
        "--manifest-path".as_ref(),
        root.join("examples/pod-records/Cargo.toml").as_os_str(),
        "--target-dir".as_ref(),
        target.as_os_str(),
    ]);
    target.join("debug")
}

fn conflist(ipam_dir: &Path, records: &Path) -> Value {
    json!({
        "cniVersion": "1.1.0",
        "name": "recnet",
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "dataDir": ipam_dir,
                    "ranges": [[{ "subnet": "10.84.0.0/24" }], [{ "subnet": "2001:db8:84::/64" }]]
                }
            },
            { "type": "pod-records", "dataDir": records }
        ]
    })
}

/// The runtime stand-in for `conflist` with records under `records`, plugins from the reference
/// set and `bin`, host side in `node`.
fn runtime(dir: &Path, records: &Path, bin: &Path, node: &Netns) -> Runtime {
    Runtime::new(
        conflist(&dir.join("ipam"), records),
        [flock_testkit::reference_plugins_dir(), bin.to_owned()],
        dir.join("cache"),
    )
    .expect("valid conflist")
    .in_netns(node.path())
}

fn attachment(id: &str, pod: &Netns, name: &str) -> Attachment {
    Attachment::new(id, pod.path(), "eth0")
        .with_arg("IgnoreUnknown", "1")
        .with_arg("K8S_POD_NAMESPACE", "shop")
        .with_arg("K8S_POD_NAME", name)
}

fn addresses(result: &Value) -> Value {
    Value::Array(
        result["ips"]
            .as_array()
            .expect("ips")
            .iter()
            .map(|ip| ip["address"].clone())
            .collect(),
    )
}

fn read(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("a record")).expect("JSON")
}

#[test]
fn a_plugin_outside_the_workspace_works_through_every_verb() {
    flock_testkit::require_root();
    let bin = build_pod_records();
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Netns::new("node");
    let (pod1, pod2) = (Netns::new("pod"), Netns::new("pod"));
    let records = dir.path().join("records");
    let rt = runtime(dir.path(), &records, &bin, &node);
    let net = records.join("recnet");

    rt.status()
        .expect("STATUS: the record directory is writable");

    let web0 = attachment("rec-1", &pod1, "web-0");
    let result = rt.add(&web0).expect("ADD");
    assert_eq!(result["ips"].as_array().map(Vec::len), Some(2), "{result}");
    let record = net.join("rec-1:eth0");
    assert_eq!(
        read(&record),
        json!({ "pod": "shop/web-0", "addresses": addresses(&result) })
    );
    rt.check(&web0).expect("CHECK");

    // A record that names other addresses fails CHECK with the plugin's own code.
    std::fs::write(
        &record,
        r#"{"pod":"shop/web-0","addresses":["10.84.0.250/24"]}"#,
    )
    .expect("tamper");
    let err = rt.check(&web0).expect_err("CHECK must notice the record");
    let cni = err
        .cni_error()
        .unwrap_or_else(|| panic!("no CNI error: {err}"));
    assert_eq!(cni.code, 100, "{err}");
    assert!(cni.msg.contains("10.84.0.250/24"), "{err}");

    // GC keeps the valid attachments' records and removes what no attachment owns.
    let web1 = attachment("rec-2", &pod2, "web-1");
    rt.add(&web1).expect("second ADD");
    std::fs::write(net.join("gone:eth0"), "{}").expect("a stale record");
    std::fs::write(net.join(".rec-3:eth0.tmp"), "{").expect("a record being written");
    rt.gc(&[GcAttachment {
        container_id: "rec-2".into(),
        if_name: "eth0".into(),
    }])
    .expect("GC");
    assert!(!net.join("gone:eth0").exists(), "stale record left by GC");
    assert!(
        net.join(".rec-3:eth0.tmp").exists(),
        "GC removed a file of the plugin's own"
    );
    assert!(
        !record.exists(),
        "rec-1 is not valid any more: DEL'd and its record gone"
    );
    assert!(
        net.join("rec-2:eth0").exists(),
        "a valid record removed by GC"
    );

    rt.del(&web1).expect("DEL");
    assert!(!net.join("rec-2:eth0").exists(), "record left by DEL");
    rt.del(&web1).expect("a second DEL is no error");

    // STATUS fails, naming the directory, when records cannot be written.
    let blocked = dir.path().join("a-file");
    std::fs::write(&blocked, "").expect("file");
    let rt = runtime(dir.path(), &blocked.join("records"), &bin, &node);
    let err = rt.status().expect_err("STATUS with an unwritable dataDir");
    let cni = err
        .cni_error()
        .unwrap_or_else(|| panic!("no CNI error: {err}"));
    assert_eq!(cni.code, 50, "PluginNotAvailable: {err}");
    assert!(cni.msg.contains("a-file"), "{err}");

    // A relative dataDir is refused, naming the field and the value.
    let rt = runtime(dir.path(), Path::new("relative/records"), &bin, &node);
    let err = rt.status().expect_err("STATUS with a relative dataDir");
    let cni = err
        .cni_error()
        .unwrap_or_else(|| panic!("no CNI error: {err}"));
    assert_eq!(cni.code, 7, "InvalidNetworkConfig: {err}");
    assert!(cni.msg.contains("dataDir \"relative/records\""), "{err}");
}
