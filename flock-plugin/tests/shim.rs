//! Execs the built shim exactly as a container runtime does (a clean
//! environment with `CNI_*` and the network configuration on stdin) against
//! an agent stand-in: a thread answering canned responses on a Unix socket
//! in a temporary directory.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;

use flock_cni_proto::{CniError, ErrorCode};
use flock_rpc::DelQueue;
use flock_rpc::rpc::{LineDecoder, Op, Request, Response, decode_request, encode_line};
use serde_json::{Value, json};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        assert_eq!(
            self.stdout.lines().count(),
            1,
            "exactly one document expected: {:?}",
            self.stdout
        );
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", self.stdout))
    }
}

/// The shim under test: `FLOCK_SHIM_BIN` (set by `cargo xtask test` to the shim as a node's
/// binaries have it, linked against musl), else the one cargo built for this test.
fn shim_bin() -> std::path::PathBuf {
    std::env::var_os("FLOCK_SHIM_BIN").map_or_else(
        || env!("CARGO_BIN_EXE_flock").into(),
        std::path::PathBuf::from,
    )
}

fn shim(command: &str, ifname: &str, stdin: &str) -> Run {
    let mut child = Command::new(shim_bin())
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "3f2a9c1d0b7e")
        .env("CNI_NETNS", "/var/run/netns/cni-1234")
        .env("CNI_IFNAME", ifname)
        .env(
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
        )
        .env("CNI_PATH", "/opt/cni/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("exec the shim");
    // Like Go's os/exec (libcni), ignore a plugin that exits without reading
    // all of stdin (VERSION does not read it).
    match child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("write stdin: {e}"),
        _ => {}
    }
    let out = child.wait_with_output().expect("wait for the shim");
    Run {
        code: out.status.code().expect("exit code"),
        stdout: String::from_utf8(out.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn conf(version: &str, dir: &Path) -> String {
    json!({
        "cniVersion": version,
        "name": "flock",
        "type": "flock",
        "mtu": 1500,
        "agentSocket": dir.join("agent.sock"),
        "delQueueDir": dir.join("del-queue"),
        "cni.dev/valid-attachments": [{"containerID": "3f2a9c1d0b7e", "ifname": "eth0"}]
    })
    .to_string()
}

/// Serves one canned reply per connection, in order, and returns the
/// requests it received.
fn agent(dir: &Path, replies: Vec<Vec<u8>>) -> JoinHandle<Vec<Request>> {
    let listener = UnixListener::bind(dir.join("agent.sock")).expect("bind the agent stand-in");
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for reply in replies {
            let (mut conn, _) = listener.accept().expect("accept");
            let mut decoder = LineDecoder::new();
            let mut buf = [0u8; 4096];
            let line = loop {
                if let Some(line) = decoder.next_line().expect("framed request") {
                    break line;
                }
                let n = conn.read(&mut buf).expect("read request");
                assert!(n > 0, "shim closed before sending a line");
                decoder.push(&buf[..n]);
            };
            seen.push(decode_request(&line).expect("valid request"));
            conn.write_all(&reply).expect("write reply");
        }
        seen
    })
}

fn result_1_1() -> Value {
    json!({
        "cniVersion": "1.1.0",
        "interfaces": [
            {"name": "flk3f2a9c1d0b7e", "mac": "ee:ee:ee:ee:ee:ee", "mtu": 1500},
            {"name": "eth0", "mac": "0a:58:64:40:00:05", "mtu": 1500, "sandbox": "/var/run/netns/cni-1234"}
        ],
        "ips": [
            {"address": "2001:db8:42::5/128", "gateway": "fe80::1", "interface": 1},
            {"address": "100.64.0.5/32", "gateway": "169.254.1.1", "interface": 1}
        ],
        "routes": [{"dst": "::/0", "gw": "fe80::1"}, {"dst": "0.0.0.0/0", "gw": "169.254.1.1"}]
    })
}

#[test]
fn add_prints_the_agents_result_in_the_configs_version() {
    let dir = tempfile::tempdir().unwrap();
    let stand_in = agent(
        dir.path(),
        vec![
            encode_line(&Response::ok(result_1_1())),
            encode_line(&Response::ok(result_1_1())),
        ],
    );
    let run = shim("ADD", "eth0", &conf("1.1.0", dir.path()));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json(), result_1_1());

    let stdin = conf("0.4.0", dir.path());
    let run = shim("ADD", "eth0", &stdin);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let out = run.json();
    assert_eq!(out["cniVersion"], "0.4.0");
    assert_eq!(out["ips"][0]["version"], "6");
    assert_eq!(out["ips"][1]["version"], "4");
    assert!(out["interfaces"][0].get("mtu").is_none());

    let seen = stand_in.join().unwrap();
    let req = &seen[1];
    assert_eq!((req.v, req.op), (1, Op::Add));
    assert_eq!(req.container_id, "3f2a9c1d0b7e");
    assert_eq!(req.netns, "/var/run/netns/cni-1234");
    assert_eq!(req.if_name, "eth0");
    assert_eq!(
        req.args,
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"
    );
    assert_eq!(req.path, "/opt/cni/bin");
    assert_eq!(
        req.config,
        serde_json::from_str::<Value>(&stdin).unwrap(),
        "config must be forwarded as passed"
    );
}

#[test]
fn agent_errors_become_cni_errors() {
    let dir = tempfile::tempdir().unwrap();
    let errors = [
        CniError::new(
            ErrorCode::InvalidNetworkConfig,
            "invalid annotation flock.fritzlab.net/ip \"x\"",
        )
        .with_details("not an IPv6 address"),
        CniError::new(ErrorCode::Plugin(120), "pool 2001:db8:42::/64 exhausted"),
        CniError::new(
            ErrorCode::UnknownContainer,
            "no allocation for container \"3f2a9c1d0b7e\"",
        ),
    ];
    let stand_in = agent(
        dir.path(),
        errors
            .iter()
            .map(|e| encode_line(&Response::error(e.clone())))
            .collect(),
    );
    for (cmd, e) in ["ADD", "DEL", "CHECK"].iter().zip(&errors) {
        let run = shim(cmd, "eth0", &conf("1.0.0", dir.path()));
        assert_eq!(run.code, 1, "{cmd}");
        assert_eq!(
            run.json(),
            e.to_value(flock_cni_proto::CniVersion::V1_0_0),
            "{cmd}"
        );
    }
    let ops: Vec<Op> = stand_in.join().unwrap().iter().map(|r| r.op).collect();
    assert_eq!(ops, [Op::Add, Op::Del, Op::Check]);
    assert!(
        DelQueue::new(dir.path().join("del-queue"))
            .pending()
            .unwrap()
            .is_empty(),
        "a DEL the agent failed must not be queued"
    );
}

#[test]
fn agent_down_is_11_for_add_check_gc_and_50_for_status() {
    let dir = tempfile::tempdir().unwrap();
    let conf = |dir: &Path| {
        let mut c: Value = serde_json::from_str(&conf("1.1.0", dir)).unwrap();
        c["agentWaitSeconds"] = json!(0);
        c.to_string()
    };
    // No socket at all.
    for (cmd, code) in [("ADD", 11), ("CHECK", 11), ("GC", 11), ("STATUS", 50)] {
        let run = shim(cmd, "eth0", &conf(dir.path()));
        assert_eq!(run.code, 1, "{cmd}");
        let out = run.json();
        assert_eq!(out["code"], code, "{cmd}: {out}");
        let msg = out["msg"].as_str().unwrap();
        assert!(msg.contains("agent.sock"), "{out}");
        // The details say why (the OS error), not the message again.
        let details = out["details"].as_str().unwrap();
        assert!(
            details.contains("os error") && !details.contains(msg),
            "{out}"
        );
    }
    // A socket file nobody listens on (the agent died): ECONNREFUSED.
    drop(UnixListener::bind(dir.path().join("agent.sock")).unwrap());
    let run = shim("ADD", "eth0", &conf(dir.path()));
    assert_eq!(run.json()["code"], 11);
}

#[test]
fn status_succeeds_while_a_restarting_agent_notice_is_younger_than_agent_wait_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let with_wait = |seconds: u64| {
        let mut c: Value = serde_json::from_str(&conf("1.1.0", dir.path())).unwrap();
        c["agentWaitSeconds"] = json!(seconds);
        c.to_string()
    };
    let notice = flock_rpc::rpc::restart_notice(&dir.path().join("agent.sock"));
    assert_eq!(notice, dir.path().join("agent.restarting"));
    // No agent, no notice: a crash. STATUS fails at once.
    assert_eq!(shim("STATUS", "", &with_wait(30)).json()["code"], 50);
    // The agent stopped to be replaced: the network takes pods (ADDs wait), STATUS succeeds,
    // also while the successor has bound no socket yet.
    std::fs::write(&notice, "pid 1\n").unwrap();
    let run = shim("STATUS", "", &with_wait(30));
    assert_eq!((run.code, run.stdout.as_str()), (0, ""), "{}", run.stderr);
    drop(UnixListener::bind(dir.path().join("agent.sock")).unwrap());
    assert_eq!(shim("STATUS", "", &with_wait(30)).code, 0);
    // A notice older than agentWaitSeconds: the agent never came back.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let run = shim("STATUS", "", &with_wait(1));
    assert_eq!(run.json()["code"], 50, "{}", run.stdout);
    // ADD still waits and fails after agentWaitSeconds, notice or not: nothing serves it.
    assert_eq!(shim("ADD", "eth0", &with_wait(0)).json()["code"], 11);
}

#[test]
fn add_and_check_wait_for_an_agent_that_comes_back() {
    for cmd in ["ADD", "CHECK"] {
        let dir = tempfile::tempdir().unwrap();
        // The agent is restarting: first no socket, then a socket file nobody listens on,
        // then the new agent.
        let path = dir.path().to_owned();
        let reply = if cmd == "ADD" {
            Response::ok(result_1_1())
        } else {
            Response::done()
        };
        let restarting = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(UnixListener::bind(path.join("agent.sock")).unwrap());
            std::thread::sleep(std::time::Duration::from_millis(200));
            std::fs::remove_file(path.join("agent.sock")).unwrap();
            agent(&path, vec![encode_line(&reply)]).join().unwrap()
        });
        let run = shim(cmd, "eth0", &conf("1.1.0", dir.path()));
        assert_eq!(run.code, 0, "{cmd}: {}{}", run.stdout, run.stderr);
        let seen = restarting.join().unwrap();
        assert_eq!(seen.len(), 1, "{cmd}: the request reached the agent once");
    }
}

#[test]
fn add_gives_up_waiting_after_agent_wait_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let mut c: Value = serde_json::from_str(&conf("1.1.0", dir.path())).unwrap();
    c["agentWaitSeconds"] = json!(1);
    let started = std::time::Instant::now();
    let run = shim("ADD", "eth0", &c.to_string());
    let waited = started.elapsed();
    assert_eq!(run.json()["code"], 11);
    assert!(
        waited >= std::time::Duration::from_millis(700),
        "gave up after {waited:?}, before agentWaitSeconds"
    );
}

#[test]
fn status_and_gc_forward_to_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let stand_in = agent(
        dir.path(),
        vec![
            encode_line(&Response::done()),
            encode_line(&Response::done()),
        ],
    );
    for cmd in ["STATUS", "GC"] {
        let run = shim(cmd, "", &conf("1.1.0", dir.path()));
        assert_eq!(
            (run.code, run.stdout.as_str()),
            (0, ""),
            "{cmd}: {}",
            run.stderr
        );
    }
    let seen = stand_in.join().unwrap();
    assert_eq!(seen[1].op, Op::Gc);
    assert_eq!(
        seen[1].config["cni.dev/valid-attachments"][0]["ifname"],
        "eth0"
    );
}

#[test]
fn del_with_agent_down_is_queued_and_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let stdin = conf("1.1.0", dir.path());
    let run = shim("DEL", "eth0", &stdin);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout, "", "a successful DEL prints nothing");
    let pending = DelQueue::new(dir.path().join("del-queue"))
        .pending()
        .unwrap();
    assert_eq!(pending.len(), 1);
    let (file, req) = &pending[0];
    assert_eq!(file, &dir.path().join("del-queue/3f2a9c1d0b7e.eth0.json"));
    let req = req.as_ref().unwrap();
    assert_eq!((req.op, req.if_name.as_str()), (Op::Del, "eth0"));
    assert_eq!(req.config, serde_json::from_str::<Value>(&stdin).unwrap());
}

/// How an agent stand-in fails a connection after accepting it.
#[derive(Clone, Copy, Debug)]
enum Dies {
    /// Reads the whole request line, then closes without a word (the agent
    /// died while running it): the shim reads EOF.
    AfterReading,
    /// Reads a few bytes, then closes with the rest unread: the shim's read
    /// fails with ECONNRESET.
    MidRequest,
    /// Reads the request and starts a response it never finishes.
    MidResponse,
}

/// Accepts one connection and fails it the way `dies` says; returns what it read.
fn dying_agent(dir: &Path, dies: Dies) -> JoinHandle<Vec<u8>> {
    let listener = UnixListener::bind(dir.join("agent.sock")).expect("bind the agent stand-in");
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        let mut got = Vec::new();
        if let Dies::MidRequest = dies {
            let mut first = [0u8; 8];
            conn.read_exact(&mut first).expect("read the start");
            got.extend_from_slice(&first);
            // Let the shim finish writing so the close finds unread bytes.
            std::thread::sleep(std::time::Duration::from_millis(200));
            return got;
        }
        let mut decoder = LineDecoder::new();
        let mut buf = [0u8; 4096];
        loop {
            if let Some(line) = decoder.next_line().expect("framed request") {
                got = line;
                break;
            }
            let n = conn.read(&mut buf).expect("read request");
            assert!(n > 0, "shim closed before sending a line");
            decoder.push(&buf[..n]);
        }
        if let Dies::MidResponse = dies {
            conn.write_all(b"{\"v\":1,\"res")
                .expect("write half a reply");
        }
        got
    })
}

#[test]
fn del_the_agent_dies_on_is_queued_and_succeeds() {
    for dies in [Dies::AfterReading, Dies::MidRequest, Dies::MidResponse] {
        let dir = tempfile::tempdir().unwrap();
        let stand_in = dying_agent(dir.path(), dies);
        let stdin = conf("1.1.0", dir.path());
        let run = shim("DEL", "eth0", &stdin);
        let received = stand_in.join().unwrap();
        assert!(!received.is_empty(), "{dies:?}: the agent got the request");
        assert_eq!(
            (run.code, run.stdout.as_str()),
            (0, ""),
            "{dies:?}: DEL is idempotent, so the shim queues it: {}",
            run.stdout
        );
        let pending = DelQueue::new(dir.path().join("del-queue"))
            .pending()
            .unwrap();
        assert_eq!(pending.len(), 1, "{dies:?}");
        let (file, req) = &pending[0];
        assert_eq!(file, &dir.path().join("del-queue/3f2a9c1d0b7e.eth0.json"));
        let req = req.as_ref().unwrap();
        assert_eq!((req.op, req.if_name.as_str()), (Op::Del, "eth0"));
        assert_eq!(req.config, serde_json::from_str::<Value>(&stdin).unwrap());
    }
}

#[test]
fn del_the_agent_dies_on_is_an_error_when_it_cannot_be_queued() {
    let dir = tempfile::tempdir().unwrap();
    let stand_in = dying_agent(dir.path(), Dies::AfterReading);
    // The queue directory cannot be created: a file is in the way.
    std::fs::write(dir.path().join("del-queue"), b"").unwrap();
    let run = shim("DEL", "eth0", &conf("1.1.0", dir.path()));
    stand_in.join().unwrap();
    assert_eq!(run.code, 1);
    let out = run.json();
    assert_eq!(out["code"], 5, "{out}");
    let msg = out["msg"].as_str().unwrap();
    assert!(
        msg.contains("agent.sock") && msg.contains("could not be queued"),
        "{out}"
    );
}

#[test]
fn del_answered_with_garbage_is_an_error_not_queued() {
    let dir = tempfile::tempdir().unwrap();
    let stand_in = agent(dir.path(), vec![b"{\"v\":7}\n".to_vec()]);
    let run = shim("DEL", "eth0", &conf("1.1.0", dir.path()));
    stand_in.join().unwrap();
    assert_eq!(run.code, 1);
    let out = run.json();
    assert_eq!(out["code"], 999, "{out}");
    assert!(out["details"].as_str().unwrap().contains("v=7"), "{out}");
    assert!(
        DelQueue::new(dir.path().join("del-queue"))
            .pending()
            .unwrap()
            .is_empty(),
        "the agent answered: it ran the DEL"
    );
}

#[test]
fn version_needs_no_agent() {
    let run = shim("VERSION", "", r#"{"cniVersion":"1.1.0"}"#);
    assert_eq!(run.code, 0);
    assert_eq!(
        run.json(),
        json!({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
    );
}

#[test]
fn local_validation_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "ADD",
            "eth0",
            "{\"cniVersion\": ".to_string(),
            6,
            "invalid network configuration",
        ),
        (
            "ADD",
            "eth0/1",
            conf("1.1.0", dir.path()),
            4,
            "CNI_IFNAME \"eth0/1\"",
        ),
        ("ADD", "eth0", conf("0.3.1", dir.path()), 1, "\"0.3.1\""),
        ("ADD", "eth0", conf("2.0.0", dir.path()), 1, "\"2.0.0\""),
        (
            "STATUS",
            "",
            conf("1.0.0", dir.path()),
            1,
            "STATUS needs cniVersion 1.1.0",
        ),
        (
            "ADD",
            "eth0",
            conf("1.1.0", dir.path()).replace("\"mtu\":1500", "\"mtu\":40"),
            7,
            "mtu 40",
        ),
        (
            "ADD",
            "eth0",
            conf("1.1.0", dir.path())
                .replace("\"mtu\":1500", "\"mtu\":1500,\"agentWaitSeconds\":-1"),
            7,
            "agentWaitSeconds -1",
        ),
        (
            "ADD",
            "eth0",
            conf("1.1.0", dir.path()).replace("\"type\":\"flock\"", "\"type\":\"ptp\""),
            7,
            "\"ptp\"",
        ),
    ];
    for (cmd, ifname, stdin, code, needle) in cases {
        let run = shim(cmd, ifname, &stdin);
        assert_eq!(run.code, 1, "{stdin}");
        let out = run.json();
        assert_eq!(out["code"], code, "{stdin}: {out}");
        assert!(
            out["msg"].as_str().unwrap().contains(needle),
            "{out} lacks {needle}"
        );
        assert!(out["cniVersion"].is_string(), "{out}");
    }
}

#[test]
fn a_garbled_agent_reply_is_an_internal_error_not_a_result() {
    let dir = tempfile::tempdir().unwrap();
    let stand_in = agent(
        dir.path(),
        vec![
            b"{\"v\":7}\n".to_vec(),
            b"{\"v\":1,\"result\":{\"ips\":[{\"address\":\"nope\"}]}}\n".to_vec(),
        ],
    );
    let run = shim("ADD", "eth0", &conf("1.1.0", dir.path()));
    let out = run.json();
    assert_eq!(out["code"], 999, "{out}");
    assert!(out["details"].as_str().unwrap().contains("v=7"), "{out}");
    let run = shim("ADD", "eth0", &conf("1.1.0", dir.path()));
    assert_eq!(run.json()["code"], 999);
    stand_in.join().unwrap();
}
