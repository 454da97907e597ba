//! The RPC's framing and messages: golden lines, every decode error, framing edge cases.

use std::io::{self, Read, Write};
use std::time::Duration;

use flock_cni_proto::error::ErrorCode;
use serde_json::json;

use super::*;

fn request() -> Request {
    Request {
        v: 1,
        op: Op::Add,
        container_id: "3f2a9c1d0b7e".into(),
        netns: "/var/run/netns/cni-1234".into(),
        if_name: "eth0".into(),
        args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0".into(),
        path: "/opt/cni/bin".into(),
        config: json!({"cniVersion": "1.1.0", "name": "flock", "type": "flock", "mtu": 1500}),
    }
}

#[test]
fn request_line_snapshot() {
    let line = String::from_utf8(encode_line(&request())).unwrap();
    assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
    insta::assert_snapshot!("request_line", line);
    assert_eq!(decode_request(line.as_bytes()).unwrap(), request());
}

#[test]
fn response_shapes() {
    let e = CniError::new(ErrorCode::TryAgainLater, "pod default/web-0 not seen yet");
    let lines: Vec<String> = [
        Response::ok(json!({"cniVersion": "1.1.0"})),
        Response::done(),
        Response::error(e),
    ]
    .iter()
    .map(|r| String::from_utf8(encode_line(r)).unwrap())
    .collect();
    insta::assert_snapshot!("response_lines", lines.concat());
    for l in &lines {
        decode_response(l.as_bytes()).unwrap();
    }
    let both = br#"{"v":1,"result":{},"error":{"code":7,"msg":"x"}}"#;
    assert!(matches!(decode_response(both), Err(DecodeError::Ambiguous)));
}

#[test]
fn each_bad_request_has_its_own_error() {
    type Matches = fn(&DecodeError) -> bool;
    let cases: Vec<(&[u8], Matches)> = vec![
        (b"{\"v\":1,\"op\":\"ADD\",\xff}", |e| {
            matches!(e, DecodeError::InvalidUtf8 { .. })
        }),
        (b"{\"v\":1,", |e| {
            matches!(e, DecodeError::InvalidJson { .. })
        }),
        (b"[1,2]", |e| matches!(e, DecodeError::InvalidJson { .. })),
        (
            br#"{"v":1,"op":"ADDX","config":{}}"#,
            |e| matches!(e, DecodeError::UnknownOp { op } if op == "\"ADDX\""),
        ),
        (br#"{"v":1,"config":{}}"#, |e| {
            matches!(e, DecodeError::MissingField { field: "op" })
        }),
        (br#"{"v":1,"op":"DEL"}"#, |e| {
            matches!(e, DecodeError::MissingField { field: "config" })
        }),
        (br#"{"op":"DEL","config":{}}"#, |e| {
            matches!(e, DecodeError::MissingField { field: "v" })
        }),
        (
            br#"{"v":2,"op":"DEL","config":{}}"#,
            |e| matches!(e, DecodeError::WrongVersion { got } if got == "2"),
        ),
        (br#"{"v":1,"op":"DEL","config":{},"netns":5}"#, |e| {
            matches!(e, DecodeError::InvalidField { .. })
        }),
    ];
    for (line, ok) in cases {
        let e = decode_request(line).unwrap_err();
        assert!(ok(&e), "{:?} gave {e:?}", String::from_utf8_lossy(line));
    }
    // Unknown fields are ignored (rolling upgrades).
    let r = decode_request(br#"{"v":1,"op":"GC","config":{},"future":true}"#).unwrap();
    assert_eq!(r.op, Op::Gc);
}

/// A one-connection server in a temp dir answering `reply` (or nothing
/// and holding the connection open for `hold`). The client's read timeout is
/// 300 ms when the server holds the connection (the timeout case), else a
/// generous 5 s so a loaded machine does not fail the other cases.
fn serve(
    reply: Vec<u8>,
    hold: Duration,
) -> (tempfile::TempDir, Client, std::thread::JoinHandle<Vec<u8>>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        // The client shuts its write side down after the request.
        conn.read_to_end(&mut got).unwrap();
        // The client may hang up first (oversize reply): not a failure here.
        let _ = conn.write_all(&reply);
        std::thread::sleep(hold);
        got
    });
    (
        dir,
        Client::new(path).read_timeout(if hold.is_zero() {
            Duration::from_secs(5)
        } else {
            Duration::from_millis(300)
        }),
        server,
    )
}

#[test]
fn connect_gives_up_on_an_agent_that_stopped_accepting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    // Listening, never accepting: once its backlog is full, a connect waits.
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let client = Client::new(&path).connect_timeout(Duration::from_millis(50));
    let mut held = Vec::new();
    let e = loop {
        match client.connect() {
            Ok(stream) => held.push(stream),
            Err(e) => break e,
        }
        assert!(held.len() < 100_000, "the backlog never filled");
    };
    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    assert!(
        e.to_string().contains("connect timed out after 50ms"),
        "{e}"
    );
    let e = client.call(&request()).unwrap_err();
    assert!(e.is_undelivered() && e.is_unreachable(), "{e:?}");
    // No socket at all: refused at once, as before.
    let e = Client::new(dir.path().join("none.sock"))
        .call(&request())
        .unwrap_err();
    assert!(e.is_undelivered() && e.is_unreachable(), "{e:?}");
    // A connected stream has no write timeout.
    drop(held);
    let (_dir, client, server) = serve(encode_line(&Response::done()), Duration::ZERO);
    let stream = client.connect().unwrap();
    assert_eq!(stream.write_timeout().unwrap(), None);
    drop(stream);
    server.join().unwrap();
}

#[test]
fn client_round_trip_and_failures() {
    let (_dir, client, server) = serve(encode_line(&Response::done()), Duration::ZERO);
    assert_eq!(client.call(&request()).unwrap(), Response::done());
    assert_eq!(decode_request(&server.join().unwrap()).unwrap(), request());

    let (_dir, client, server) = serve(Vec::new(), Duration::from_secs(3));
    let e = client.call(&request()).unwrap_err();
    assert!(
        matches!(&e, ClientError::Receive { source, .. } if matches!(source.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)),
        "{e:?}"
    );
    assert!(!e.is_undelivered());
    assert!(e.is_unanswered() && e.may_be_incomplete());
    server.join().unwrap();

    let (_dir, client, server) = serve(b"{\"v\":1".to_vec(), Duration::ZERO);
    let e = client.call(&request()).unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Frame {
                source: FrameError::NoNewline { len: 6 },
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.is_unanswered() && e.may_be_incomplete());
    server.join().unwrap();

    let (_dir, client, server) = serve(Vec::new(), Duration::ZERO);
    let e = client.call(&request()).unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Frame {
                source: FrameError::Empty,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!e.is_undelivered() && e.is_unanswered() && e.may_be_incomplete());
    server.join().unwrap();

    // The agent dies with the request half read: the connection is reset.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut start = [0u8; 8];
        conn.read_exact(&mut start).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    });
    let e = Client::new(path).call(&request()).unwrap_err();
    assert!(
        matches!(&e, ClientError::Receive { source, .. } if source.kind() == io::ErrorKind::ConnectionReset),
        "{e:?}"
    );
    assert!(!e.is_undelivered() && e.is_unanswered() && e.may_be_incomplete());
    server.join().unwrap();

    // An answer this side cannot read: the agent finished the request.
    let (_dir, client, server) = serve(vec![b'x'; MAX_LINE + 10], Duration::ZERO);
    let e = client.call(&request()).unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Frame {
                source: FrameError::TooLong { .. },
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!e.is_unanswered() && !e.may_be_incomplete());
    server.join().unwrap();

    let (_dir, client, server) = serve(b"{\"v\":7}\n".to_vec(), Duration::ZERO);
    let e = client.call(&request()).unwrap_err();
    assert!(matches!(e, ClientError::Decode { .. }), "{e:?}");
    assert!(!e.may_be_incomplete());
    server.join().unwrap();

    let e = Client::new("/nonexistent/flock/agent.sock")
        .call(&request())
        .unwrap_err();
    assert!(e.is_unreachable() && e.is_undelivered() && e.may_be_incomplete());
    let cni = e.to_cni(ErrorCode::TryAgainLater);
    assert_eq!(cni.code, ErrorCode::TryAgainLater);
    assert_eq!(
        cni.msg,
        "flock agent unreachable at /nonexistent/flock/agent.sock"
    );
    assert!(
        cni.details.starts_with("No such file or directory"),
        "the details are the causes, not the message again: {cni:?}"
    );
    assert!(
        e.chain()
            .contains("/nonexistent/flock/agent.sock: No such file"),
        "{}",
        e.chain()
    );
}

#[test]
fn framing() {
    let mut d = LineDecoder::with_limit(8);
    d.push(b"abc");
    assert_eq!(d.next_line(), Ok(None));
    d.push(b"de\nxy");
    assert_eq!(d.next_line(), Ok(Some(b"abcde".to_vec())));
    assert_eq!(d.next_line(), Ok(None));
    assert_eq!(d.finish(), Err(FrameError::NoNewline { len: 2 }));

    let mut d = LineDecoder::with_limit(8);
    d.push(b"12345678\n");
    assert_eq!(d.next_line(), Ok(Some(b"12345678".to_vec())));
    d.push(b"123456789");
    assert_eq!(d.next_line(), Err(FrameError::TooLong { limit: 8 }));

    let mut d = LineDecoder::new();
    d.push(b"\n");
    assert_eq!(d.next_line(), Err(FrameError::Empty));
    assert_eq!(LineDecoder::new().finish(), Ok(()));
    assert_eq!(MAX_LINE, 1024 * 1024);
}
