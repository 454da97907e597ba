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
mod tests;
