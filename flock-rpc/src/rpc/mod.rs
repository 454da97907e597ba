//! The shim↔agent RPC of DESIGN §2: one newline-terminated JSON request and
//! one response per Unix-socket connection.
//!
//! The framing is sans-IO ([`LineDecoder`]: feed bytes, get a complete line
//! or a [`FrameError`]) so the async agent and the blocking [`Client`] share
//! it; [`decode_request`] / [`decode_response`] turn a line into a message
//! with a distinct [`DecodeError`] for each way it can be wrong.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use flock_cni_proto::env::CniEnv;
use flock_cni_proto::error::CniError;

mod client;

pub use client::{Client, ClientError};

/// The restart notice an agent leaves beside its socket `socket` when it stops to be replaced
/// (SIGTERM: a rolling update, a drain), removed by its successor once that serves.
///
/// STATUS (CNI 1.1) is what containerd 2 turns into the node's `NetworkReady`, and a node that
/// is not ready has its pods marked not ready and taken out of Services. While the notice is
/// younger than `agentWaitSeconds`, the shim therefore answers STATUS with success although
/// nothing listens: an ADD sent now waits that long for the successor, so the network can
/// take pods, only later. A crash leaves no notice, and STATUS says at once that nothing
/// serves; so does a notice older than `agentWaitSeconds` (an agent that never came back).
pub fn restart_notice(socket: &Path) -> PathBuf {
    socket.with_extension("restarting")
}

/// The protocol version this crate speaks (`v`).
pub const PROTOCOL_VERSION: u32 = 1;
/// The longest line (without its newline) either side accepts.
pub const MAX_LINE: usize = 1 << 20;

/// The operation of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Op {
    /// ADD.
    Add,
    /// DEL.
    Del,
    /// CHECK.
    Check,
    /// STATUS.
    Status,
    /// GC.
    Gc,
}

impl Op {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Add => "ADD",
            Op::Del => "DEL",
            Op::Check => "CHECK",
            Op::Status => "STATUS",
            Op::Gc => "GC",
        }
    }

    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "ADD" => Op::Add,
            "DEL" => Op::Del,
            "CHECK" => Op::Check,
            "STATUS" => Op::Status,
            "GC" => Op::Gc,
            _ => return None,
        })
    }
}

/// A request from the shim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Protocol version, [`PROTOCOL_VERSION`].
    pub v: u32,
    /// The CNI command.
    pub op: Op,
    /// `CNI_CONTAINERID` (empty for STATUS/GC).
    #[serde(rename = "containerId", default)]
    pub container_id: String,
    /// `CNI_NETNS` (may be empty on DEL).
    #[serde(default)]
    pub netns: String,
    /// `CNI_IFNAME`.
    #[serde(rename = "ifName", default)]
    pub if_name: String,
    /// `CNI_ARGS`, raw.
    #[serde(default)]
    pub args: String,
    /// `CNI_PATH`.
    #[serde(default)]
    pub path: String,
    /// The network configuration exactly as the runtime passed it.
    pub config: Value,
}

impl Request {
    /// The request for a call with environment `env` and stdin `config`.
    pub fn new(op: Op, env: &CniEnv, config: Value) -> Request {
        Request {
            v: PROTOCOL_VERSION,
            op,
            container_id: env.container_id.clone(),
            netns: env.netns.clone(),
            if_name: env.if_name.clone(),
            args: env.args.clone(),
            path: env.path.clone(),
            config,
        }
    }
}

/// A response from the agent: `result` on success (absent for commands
/// without one), `error` on failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// Protocol version, [`PROTOCOL_VERSION`].
    pub v: u32,
    /// The CNI result (ADD) when the call succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The CNI error when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CniError>,
}

impl Response {
    /// Success carrying a result.
    pub fn ok(result: Value) -> Response {
        Response {
            v: PROTOCOL_VERSION,
            result: Some(result),
            error: None,
        }
    }

    /// Success without a result (DEL, CHECK, STATUS, GC).
    pub fn done() -> Response {
        Response {
            v: PROTOCOL_VERSION,
            result: None,
            error: None,
        }
    }

    /// Failure.
    pub fn error(error: CniError) -> Response {
        Response {
            v: PROTOCOL_VERSION,
            result: None,
            error: Some(error),
        }
    }

    /// The outcome: the result (if any) or the agent's error.
    pub fn into_result(self) -> Result<Option<Value>, CniError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.result),
        }
    }
}

/// `value` as one line: compact JSON and `'\n'`.
pub fn encode_line<T: Serialize>(value: &T) -> Vec<u8> {
    // Requests and responses hold only strings, numbers and JSON values:
    // serialisation cannot fail for them.
    let mut line = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
    line.push(b'\n');
    line
}

/// What is wrong with the bytes of a connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// More than the limit arrived without a newline.
    #[error("line longer than {limit} bytes")]
    TooLong {
        /// The limit in bytes.
        limit: usize,
    },
    /// The peer closed after `len` bytes without ending the line.
    #[error("connection closed after {len} bytes without a newline")]
    NoNewline {
        /// Bytes received.
        len: usize,
    },
    /// Nothing arrived, or an empty line.
    #[error("empty message")]
    Empty,
}

/// Sans-IO line framing: [`push`](Self::push) bytes as they arrive, take
/// lines with [`next_line`](Self::next_line), and call
/// [`finish`](Self::finish) at end of input.
#[derive(Debug, Clone)]
pub struct LineDecoder {
    buf: Vec<u8>,
    limit: usize,
}

impl Default for LineDecoder {
    fn default() -> Self {
        LineDecoder::new()
    }
}

impl LineDecoder {
    /// A decoder with the [`MAX_LINE`] limit.
    pub fn new() -> LineDecoder {
        LineDecoder::with_limit(MAX_LINE)
    }

    /// A decoder accepting lines up to `limit` bytes (newline excluded).
    pub fn with_limit(limit: usize) -> LineDecoder {
        LineDecoder {
            buf: Vec::new(),
            limit,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete line without its newline; `Ok(None)` when more
    /// bytes are needed. Errors once the pending bytes exceed the limit
    /// without a newline, or on an empty line.
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        let window = self.buf.len().min(self.limit + 1);
        match self.buf[..window].iter().position(|&b| b == b'\n') {
            Some(0) => Err(FrameError::Empty),
            Some(i) => {
                let mut line: Vec<u8> = self.buf.drain(..=i).collect();
                line.pop();
                Ok(Some(line))
            }
            None if self.buf.len() > self.limit => Err(FrameError::TooLong { limit: self.limit }),
            None => Ok(None),
        }
    }

    /// End of input: bytes still pending are an unterminated line.
    pub fn finish(&self) -> Result<(), FrameError> {
        match self.buf.len() {
            0 => Ok(()),
            len => Err(FrameError::NoNewline { len }),
        }
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// Why a line is not a valid message.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not UTF-8.
    #[error("message is not valid UTF-8 (at byte {valid_up_to})")]
    InvalidUtf8 {
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// The text is not JSON, or not a JSON object.
    #[error("message is not a JSON object")]
    InvalidJson {
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The `op` is none of ADD, DEL, CHECK, STATUS, GC.
    #[error("unknown op {op}")]
    UnknownOp {
        /// The value found, as JSON.
        op: String,
    },
    /// A required field is absent.
    #[error("missing field {field:?}")]
    MissingField {
        /// The field's name.
        field: &'static str,
    },
    /// `v` is not a protocol version this side speaks.
    #[error("unsupported protocol version v={got}, this side speaks v={PROTOCOL_VERSION}")]
    WrongVersion {
        /// The value found, as JSON.
        got: String,
    },
    /// A field has the wrong type or value.
    #[error("invalid message field")]
    InvalidField {
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A response carries both `result` and `error`.
    #[error("response carries both result and error")]
    Ambiguous,
}

fn parse_object(line: &[u8]) -> Result<Map<String, Value>, DecodeError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let text = std::str::from_utf8(line).map_err(|e| DecodeError::InvalidUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    serde_json::from_str(text).map_err(|source| DecodeError::InvalidJson { source })
}

fn check_v(obj: &Map<String, Value>) -> Result<(), DecodeError> {
    match obj.get("v") {
        None => Err(DecodeError::MissingField { field: "v" }),
        Some(v) if v.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => Ok(()),
        Some(v) => Err(DecodeError::WrongVersion { got: v.to_string() }),
    }
}

/// Decodes a request line (trailing newline optional).
pub fn decode_request(line: &[u8]) -> Result<Request, DecodeError> {
    let obj = parse_object(line)?;
    check_v(&obj)?;
    match obj.get("op") {
        None => return Err(DecodeError::MissingField { field: "op" }),
        Some(Value::String(s)) if Op::parse(s).is_some() => {}
        Some(other) => {
            return Err(DecodeError::UnknownOp {
                op: other.to_string(),
            });
        }
    }
    if !obj.contains_key("config") {
        return Err(DecodeError::MissingField { field: "config" });
    }
    serde_json::from_value(Value::Object(obj))
        .map_err(|source| DecodeError::InvalidField { source })
}

/// Decodes a response line (trailing newline optional).
pub fn decode_response(line: &[u8]) -> Result<Response, DecodeError> {
    let obj = parse_object(line)?;
    check_v(&obj)?;
    let resp: Response = serde_json::from_value(Value::Object(obj))
        .map_err(|source| DecodeError::InvalidField { source })?;
    if resp.result.is_some() && resp.error.is_some() {
        return Err(DecodeError::Ambiguous);
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
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
}
