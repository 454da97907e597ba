//! The runtime's side of the protocol, checked with recording plugins (shell
//! scripts that log their environment and stdin): what libcni would send, in
//! which order, and how failures come back. The reference plugins themselves
//! are driven in `tests/reference_plugins.rs`.

use std::os::unix::fs::PermissionsExt;

use super::*;

/// Logs `COMMAND|CONTAINERID|NETNS|IFNAME|ARGS|PATH|plugin` then the stdin
/// line; ADD prints a result naming the plugin and the prevResult's count.
const RECORDER: &str = r#"#!/bin/sh
conf=$(cat)
me=$(basename "$0")
dir=$(dirname "$0")
printf '%s|%s|%s|%s|%s|%s|%s\n%s\n' "$CNI_COMMAND" "$CNI_CONTAINERID" "$CNI_NETNS" "$CNI_IFNAME" "$CNI_ARGS" "$CNI_PATH" "$me" "$conf" >> "$dir/../log"
case "$CNI_COMMAND" in
  ADD) printf '{"cniVersion":"1.1.0","interfaces":[{"name":"%s"}],"ips":[]}' "$me" ;;
  VERSION) printf '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}' ;;
esac
"#;

const FAILING: &str = r#"#!/bin/sh
cat >/dev/null
echo 'something broke' >&2
printf '{"cniVersion":"1.1.0","code":7,"msg":"invalid network config","details":"field mtu: 99999 is too large"}'
exit 1
"#;

const SILENT_FAILING: &str = "#!/bin/sh\necho 'no json here' >&2\nexit 3\n";

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("bin")).expect("mkdir bin");
        for (name, text) in [
            ("one", RECORDER),
            ("two", RECORDER),
            ("failing", FAILING),
            ("silent", SILENT_FAILING),
        ] {
            let path = dir.path().join("bin").join(name);
            std::fs::write(&path, text).expect("write plugin");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .expect("chmod plugin");
        }
        Fixture { dir }
    }

    fn runtime(&self, version: &str, plugins: Value) -> Runtime {
        let list = json!({"cniVersion": version, "name": "net1", "plugins": plugins});
        Runtime::new(
            list,
            [self.dir.path().join("nowhere"), self.dir.path().join("bin")],
            self.dir.path().join("cache"),
        )
        .expect("valid conflist")
    }

    /// The log with the temporary directory replaced by `[dir]`.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log"))
            .unwrap_or_default()
            .replace(&self.dir.path().display().to_string(), "[dir]")
    }

    /// The logged calls as (env line, stdin config).
    fn calls(&self) -> Vec<(String, Value)> {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines
            .chunks(2)
            .map(|c| {
                (
                    c[0].to_owned(),
                    serde_json::from_str(c[1]).expect("stdin is JSON"),
                )
            })
            .collect()
    }
}

fn chain() -> Value {
    json!([
        {"type": "one", "ipam": {"type": "x"}},
        {"type": "two", "capabilities": {"portMappings": true, "bandwidth": false}}
    ])
}

fn attachment(fx: &Fixture) -> Attachment {
    Attachment::new("ctr1", fx.dir.path().join("netns"), "eth0")
        .with_arg("IgnoreUnknown", "1")
        .with_arg("K8S_POD_NAME", "web-0")
        .with_capability(
            "portMappings",
            json!([{"hostPort": 8080, "containerPort": 80}]),
        )
        .with_capability("bandwidth", json!({"ingressRate": 1000}))
        .with_capability("ips", json!(["2001:db8::5"]))
}

#[test]
fn add_check_del_follow_libcni() {
    let fx = Fixture::new();
    let rt = fx.runtime("1.1.0", chain());
    let att = attachment(&fx);

    let result = rt.add(&att).expect("add");
    assert_eq!(
        result["interfaces"][0]["name"], "two",
        "final result is the last plugin's"
    );
    assert_eq!(rt.cached_result(&att).expect("cache"), Some(result.clone()));
    rt.check(&att).expect("check");
    rt.del(&att).expect("del");
    assert_eq!(
        rt.cached_result(&att).expect("cache"),
        None,
        "DEL removes the cache entry"
    );

    let calls = fx.calls();
    let order: Vec<&str> = calls
        .iter()
        .map(|(env, _)| {
            let f: Vec<&str> = env.split('|').collect();
            match (f[0], f[6]) {
                ("ADD", "one") => "ADD one",
                ("ADD", "two") => "ADD two",
                ("CHECK", "one") => "CHECK one",
                ("CHECK", "two") => "CHECK two",
                ("DEL", "one") => "DEL one",
                ("DEL", "two") => "DEL two",
                _ => "other",
            }
        })
        .collect();
    assert_eq!(
        order,
        [
            "ADD one",
            "ADD two",
            "CHECK one",
            "CHECK two",
            "DEL two",
            "DEL one"
        ],
        "ADD and CHECK in order, DEL in reverse"
    );
    // ADD: the first plugin has no prevResult, the second gets the first's.
    assert!(calls[0].1.get("prevResult").is_none());
    assert_eq!(calls[1].1["prevResult"]["interfaces"][0]["name"], "one");
    // CHECK and DEL: every plugin gets the cached (final) result.
    for (_, conf) in &calls[2..] {
        assert_eq!(conf["prevResult"], result);
    }
    // runtimeConfig: only declared and enabled capabilities.
    assert!(calls[0].1.get("runtimeConfig").is_none());
    assert_eq!(
        calls[1].1["runtimeConfig"],
        json!({"portMappings": [{"hostPort": 8080, "containerPort": 80}]})
    );
    insta::assert_snapshot!(fx.log());
}

#[test]
fn cache_record_is_libcnis() {
    let fx = Fixture::new();
    let rt = fx.runtime("1.0.0", json!([{"type": "one"}]));
    let att = attachment(&fx);
    rt.add(&att).expect("add");
    let path = rt.cache_path(&att);
    assert_eq!(path, fx.dir.path().join("cache/results/net1-ctr1-eth0"));
    let record: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("cache file")).expect("json");
    let text = serde_json::to_string_pretty(&record)
        .expect("json")
        .replace(&fx.dir.path().display().to_string(), "[dir]");
    insta::assert_snapshot!(text);
    assert_eq!(
        record["config"].as_str().map(str::len),
        Some(rt.list_bytes.len().div_ceil(3) * 4)
    );
}

#[test]
fn del_without_netns_or_cache_runs_the_chain_with_empty_netns() {
    let fx = Fixture::new();
    let rt = fx.runtime("1.0.0", chain());
    let att = attachment(&fx).without_netns();
    rt.del(&att).expect("del of an unknown attachment");
    rt.del(&att).expect("second del");
    let calls = fx.calls();
    assert_eq!(calls.len(), 4);
    for (env, conf) in &calls {
        let f: Vec<&str> = env.split('|').collect();
        assert_eq!((f[0], f[2]), ("DEL", ""), "{env}");
        assert!(conf.get("prevResult").is_none());
    }
}

#[test]
fn plugin_failure_carries_the_cni_error_and_stderr() {
    let fx = Fixture::new();
    let rt = fx.runtime(
        "1.0.0",
        json!([{"type": "one"}, {"type": "failing"}, {"type": "two"}]),
    );
    let att = attachment(&fx);
    let err = rt.add(&att).expect_err("second plugin fails");
    assert_eq!(
        err.cni_error(),
        Some(&CniError {
            code: 7,
            msg: "invalid network config".into(),
            details: "field mtu: 99999 is too large".into()
        })
    );
    match &err {
        Error::Plugin {
            plugin,
            command,
            stderr,
            ..
        } => {
            assert_eq!((plugin.as_str(), *command), ("failing", "ADD"));
            assert_eq!(stderr, "something broke\n");
        }
        other => panic!("expected a plugin error, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "plugin failing failed (ADD): code 7: invalid network config; field mtu: 99999 is too large"
    );
    assert_eq!(
        rt.cached_result(&att).expect("cache"),
        None,
        "no cache after a failed ADD"
    );
    assert_eq!(fx.calls().len(), 1, "the chain stops at the failure");

    let rt = fx.runtime("1.0.0", json!([{"type": "silent"}]));
    let err = rt.add(&att).expect_err("fails");
    assert_eq!(err.cni_error(), None);
    assert!(err.to_string().contains("no json here"), "{err}");
    assert!(err.to_string().contains("exit status: 3"), "{err}");
}

#[test]
fn missing_plugin_and_bad_input_are_named() {
    let fx = Fixture::new();
    let rt = fx.runtime("1.0.0", json!([{"type": "absent"}]));
    let err = rt.add(&attachment(&fx)).expect_err("no such plugin");
    assert!(
        matches!(&err, Error::PluginNotFound { plugin, .. } if plugin == "absent"),
        "{err}"
    );

    let rt = fx.runtime("1.0.0", chain());
    for att in [
        Attachment::new("-bad", "/x", "eth0"),
        Attachment::new("ok", "/x", "a-name-longer-than-15"),
        Attachment::new("ok", "/x", "eth/0"),
        Attachment::new("ok", "/x", ""),
    ] {
        let err = rt.add(&att).expect_err("invalid attachment");
        assert!(matches!(err, Error::Invalid { .. }), "{err}");
    }
    assert!(fx.calls().is_empty(), "nothing exec'd for invalid input");

    for bad in [
        json!([]),
        json!({"name": "n", "plugins": [{"type": "one"}]}),
        json!({"cniVersion": "1.0.0", "name": "n", "plugins": []}),
        json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"mtu": 1}]}),
        json!({"cniVersion": "x", "name": "n", "plugins": [{"type": "one"}]}),
        json!({"cniVersion": "1.0.0", "name": "bad name", "plugins": [{"type": "one"}]}),
    ] {
        assert!(Runtime::new(bad.clone(), ["/"], "/tmp").is_err(), "{bad}");
    }
}

#[test]
fn check_needs_040_and_status_gc_need_110() {
    let fx = Fixture::new();
    let att = attachment(&fx);
    let old = fx.runtime("0.3.1", chain());
    assert!(matches!(
        old.check(&att),
        Err(Error::Unsupported {
            command: "CHECK",
            ..
        })
    ));
    let rt = fx.runtime("1.0.0", chain());
    rt.status().expect("status is a no-op before 1.1.0");
    rt.gc(&[])
        .expect("gc without cache is a no-op before 1.1.0");
    assert!(
        fx.calls().is_empty(),
        "nothing sent for STATUS/GC before 1.1.0"
    );

    let rt = fx.runtime("1.1.0", chain());
    rt.status().expect("status");
    let calls = fx.calls();
    assert_eq!(calls.len(), 2);
    for (env, conf) in &calls {
        assert!(env.starts_with("STATUS||||"), "{env}");
        assert_eq!(conf["name"], "net1");
        assert!(conf.get("prevResult").is_none());
    }
}

#[test]
fn gc_deletes_stale_cached_attachments_then_sends_the_valid_list() {
    let fx = Fixture::new();
    let rt = fx.runtime("1.1.0", chain());
    let keep = attachment(&fx);
    let stale = Attachment::new("ctr2", fx.dir.path().join("netns2"), "eth0");
    let other_if = Attachment::new("ctr1", fx.dir.path().join("netns"), "net1");
    for a in [&keep, &stale, &other_if] {
        rt.add(a).expect("add");
    }
    // An attachment of another network sharing the cache is never touched.
    let other_net = Runtime::new(
        json!({"cniVersion": "1.1.0", "name": "net2", "plugins": [{"type": "one"}]}),
        [fx.dir.path().join("bin")],
        fx.dir.path().join("cache"),
    )
    .expect("conflist");
    other_net.add(&stale).expect("add on net2");
    std::fs::remove_file(fx.dir.path().join("log")).expect("reset log");

    let valid = [GcAttachment {
        container_id: "ctr1".into(),
        if_name: "eth0".into(),
    }];
    rt.gc(&valid).expect("gc");

    let calls = fx.calls();
    let summary: Vec<String> = calls
        .iter()
        .map(|(env, _)| {
            let f: Vec<&str> = env.split('|').collect();
            format!("{} {} {} {}", f[0], f[1], f[3], f[6])
        })
        .collect();
    assert_eq!(
        summary,
        [
            "DEL ctr1 net1 two",
            "DEL ctr1 net1 one",
            "DEL ctr2 eth0 two",
            "DEL ctr2 eth0 one",
            "GC   one",
            "GC   two",
        ]
    );
    // The replayed DEL carries what the ADD had: netns and cached result.
    assert!(calls[2].0.contains("netns2"), "{}", calls[2].0);
    assert_eq!(calls[2].1["prevResult"]["interfaces"][0]["name"], "two");
    let expected = json!([{"containerID": "ctr1", "ifname": "eth0"}]);
    for (_, conf) in &calls[4..] {
        assert_eq!(conf["cni.dev/valid-attachments"], expected);
        assert_eq!(conf["cni.dev/attachments"], expected);
    }
    let left: Vec<(String, String, String)> = rt
        .cached_attachments()
        .expect("cache")
        .into_iter()
        .map(|c| (c.network, c.container_id, c.if_name))
        .collect();
    assert_eq!(
        left,
        [
            ("net1".into(), "ctr1".into(), "eth0".into()),
            ("net2".into(), "ctr2".into(), "eth0".into())
        ]
    );
}

#[test]
fn gc_keeps_going_and_reports_every_failure() {
    let fx = Fixture::new();
    let rt = fx.runtime("1.1.0", json!([{"type": "failing"}, {"type": "silent"}]));
    let err = rt.gc(&[]).expect_err("both plugins fail");
    match err {
        Error::Gc { network, errors } => {
            assert_eq!(network, "net1");
            assert_eq!(errors.len(), 2, "{errors:?}");
        }
        other => panic!("expected a gc error, got {other:?}"),
    }
}

#[test]
fn version_asks_like_libcni() {
    let fx = Fixture::new();
    let rt = fx.runtime("1.1.0", chain());
    let v = rt.version("one").expect("version");
    assert_eq!(v["supportedVersions"], json!(["1.0.0", "1.1.0"]));
    let calls = fx.calls();
    assert_eq!(calls[0].0, "VERSION||dummy|dummy||dummy|one");
    assert_eq!(calls[0].1, json!({"cniVersion": "1.1.0"}));
}

#[test]
fn base64_matches_go_encoding() {
    for (raw, enc) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("{\"a\":1}", "eyJhIjoxfQ=="),
    ] {
        assert_eq!(base64(raw.as_bytes()), enc);
    }
}

#[test]
fn concurrent_adds_keep_separate_cache_entries() {
    let fx = Fixture::new();
    let rt = fx.runtime("1.0.0", json!([{"type": "one"}]));
    // IDs that differ only after a dot: their temporary files must differ too.
    let atts: Vec<Attachment> = (0..8)
        .map(|i| Attachment::new(format!("pod.{i}"), fx.dir.path().join("netns"), "eth0"))
        .collect();
    std::thread::scope(|s| {
        for att in &atts {
            let rt = &rt;
            s.spawn(move || rt.add(att).expect("add"));
        }
    });
    let cached = rt.cached_attachments().expect("cache");
    let ids: Vec<&str> = cached.iter().map(|c| c.container_id.as_str()).collect();
    assert_eq!(ids, (0..8).map(|i| format!("pod.{i}")).collect::<Vec<_>>());
    let names: Vec<String> = std::fs::read_dir(fx.dir.path().join("cache/results"))
        .expect("results dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 8, "no temporary file left: {names:?}");
}
