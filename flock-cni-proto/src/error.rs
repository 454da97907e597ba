//! The CNI error object and its well-known codes, and [`cause_chain`], the one
//! way flock prints an error with its causes.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::version::{CniVersion, VersionParseError};

/// A CNI error code: the spec's well-known codes, 999 for internal errors and
/// plugin-specific codes (100 and above).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "u32", into = "u32")]
#[non_exhaustive]
pub enum ErrorCode {
    /// 1: incompatible CNI version.
    IncompatibleCniVersion,
    /// 2: unsupported field in network configuration.
    UnsupportedField,
    /// 3: container unknown or does not exist.
    UnknownContainer,
    /// 4: invalid necessary environment variables.
    InvalidEnvironmentVariables,
    /// 5: I/O failure.
    IoFailure,
    /// 6: failed to decode content.
    DecodingFailure,
    /// 7: invalid network config.
    InvalidNetworkConfig,
    /// 11: try again later.
    TryAgainLater,
    /// 50: the plugin is not available (STATUS).
    PluginNotAvailable,
    /// 51: the plugin is not available and existing containers may be degraded (STATUS).
    PluginNotAvailableLimitedConnectivity,
    /// 999: internal error of the plugin.
    Internal,
    /// 100 and above: plugin-specific.
    Plugin(u32),
    /// Any other code below 100 the spec reserves but has not assigned;
    /// kept so that every code round-trips.
    Reserved(u32),
}

impl ErrorCode {
    /// The numeric code.
    pub fn as_u32(self) -> u32 {
        match self {
            ErrorCode::IncompatibleCniVersion => 1,
            ErrorCode::UnsupportedField => 2,
            ErrorCode::UnknownContainer => 3,
            ErrorCode::InvalidEnvironmentVariables => 4,
            ErrorCode::IoFailure => 5,
            ErrorCode::DecodingFailure => 6,
            ErrorCode::InvalidNetworkConfig => 7,
            ErrorCode::TryAgainLater => 11,
            ErrorCode::PluginNotAvailable => 50,
            ErrorCode::PluginNotAvailableLimitedConnectivity => 51,
            ErrorCode::Internal => 999,
            ErrorCode::Plugin(n) | ErrorCode::Reserved(n) => n,
        }
    }
}

impl From<u32> for ErrorCode {
    fn from(n: u32) -> ErrorCode {
        match n {
            1 => ErrorCode::IncompatibleCniVersion,
            2 => ErrorCode::UnsupportedField,
            3 => ErrorCode::UnknownContainer,
            4 => ErrorCode::InvalidEnvironmentVariables,
            5 => ErrorCode::IoFailure,
            6 => ErrorCode::DecodingFailure,
            7 => ErrorCode::InvalidNetworkConfig,
            11 => ErrorCode::TryAgainLater,
            50 => ErrorCode::PluginNotAvailable,
            51 => ErrorCode::PluginNotAvailableLimitedConnectivity,
            999 => ErrorCode::Internal,
            n if n >= 100 => ErrorCode::Plugin(n),
            n => ErrorCode::Reserved(n),
        }
    }
}

impl From<ErrorCode> for u32 {
    fn from(c: ErrorCode) -> u32 {
        c.as_u32()
    }
}

/// The CNI error: what a plugin prints (with `cniVersion`, see
/// [`CniError::to_value`]) and what the agent sends back over the RPC
/// (`{code, msg, details}`, the serde form of this type).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
pub struct CniError {
    /// The error code.
    pub code: ErrorCode,
    /// A short message naming what failed and the offending value.
    pub msg: String,
    /// Longer details (may be empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    /// An error without details.
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// Adds details.
    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    /// The error as the CNI spec prints it for `version`:
    /// `{"cniVersion", "code", "msg", "details"}` (`details` omitted when empty).
    pub fn to_value(&self, version: CniVersion) -> Value {
        let mut v = json!({
            "cniVersion": version.to_string(),
            "code": self.code.as_u32(),
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            v["details"] = Value::String(self.details.clone());
        }
        v
    }
}

impl From<VersionParseError> for CniError {
    /// A malformed `cniVersion` is error 1 (incompatible version) naming the value.
    fn from(e: VersionParseError) -> CniError {
        CniError::new(ErrorCode::IncompatibleCniVersion, e.to_string())
    }
}

/// `e` and every error under it (its `source` chain) on one line, joined with
/// `": "`, for a CNI error's `details` or a log line.
///
/// Many errors already print their source (`#[error("read {path}: {source}")]`);
/// a source whose text already ends the line so far is skipped, so no cause is
/// printed twice. Empty messages are skipped too.
pub fn cause_chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !text.is_empty() && !ends_with_cause(&line, &text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

/// Whether `line` ends with `cause` as a whole (the match starts the line or
/// follows a character that is not a letter or digit: `"os error 12"` does not
/// end with the cause `"2"`).
fn ends_with_cause(line: &str, cause: &str) -> bool {
    line.strip_suffix(cause)
        .is_some_and(|before| !before.ends_with(char::is_alphanumeric))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for n in (0..1200).chain([u32::MAX]) {
            assert_eq!(ErrorCode::from(n).as_u32(), n);
        }
        assert_eq!(ErrorCode::from(100), ErrorCode::Plugin(100));
        assert_eq!(ErrorCode::from(12), ErrorCode::Reserved(12));
    }

    #[test]
    fn snapshot_each_error() {
        let errors = [
            CniError::new(
                ErrorCode::IncompatibleCniVersion,
                "unsupported cniVersion \"0.3.1\": this plugin supports 0.4.0, 1.0.0, 1.1.0",
            ),
            CniError::new(ErrorCode::UnsupportedField, "unsupported field \"ipam\""),
            CniError::new(
                ErrorCode::UnknownContainer,
                "container \"3f2a9c1d0b7e\" has no allocation",
            ),
            CniError::new(
                ErrorCode::InvalidEnvironmentVariables,
                "invalid CNI_IFNAME \"eth0/x\": contains '/', ':' or whitespace",
            ),
            CniError::new(
                ErrorCode::IoFailure,
                "reading the network configuration from stdin: broken pipe",
            ),
            CniError::new(
                ErrorCode::DecodingFailure,
                "invalid network configuration on stdin: EOF while parsing an object at line 1 column 1",
            ),
            CniError::new(
                ErrorCode::InvalidNetworkConfig,
                "invalid mtu 40: expected an integer in 68..=65535",
            ),
            CniError::new(
                ErrorCode::TryAgainLater,
                "flock agent unreachable at /run/flock/agent.sock",
            )
            .with_details("No such file or directory (os error 2)"),
            CniError::new(
                ErrorCode::PluginNotAvailable,
                "flock agent unreachable at /run/flock/agent.sock",
            ),
            CniError::new(
                ErrorCode::PluginNotAvailableLimitedConnectivity,
                "node config missing and 3 pods degraded",
            ),
            CniError::new(
                ErrorCode::Internal,
                "encoding the reply: key must be a string",
            ),
            CniError::new(ErrorCode::Plugin(100), "pool 2001:db8:42::/64 exhausted")
                .with_details("0 of 65536 addresses free"),
        ];
        let printed: Vec<Value> = errors
            .iter()
            .map(|e| e.to_value(CniVersion::V1_1_0))
            .collect();
        insta::assert_json_snapshot!("errors", printed);
        for (e, v) in errors.iter().zip(&printed) {
            let back: CniError = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(&back, e);
        }
    }

    #[test]
    fn a_malformed_version_is_error_1_naming_it() {
        let e = CniError::from("1.0".parse::<CniVersion>().unwrap_err());
        assert_eq!(e.code, ErrorCode::IncompatibleCniVersion);
        assert_eq!(
            e.msg,
            "invalid cniVersion \"1.0\": expected major.minor.patch"
        );
    }

    /// An error with an optional source, printing it in its own message or not.
    #[derive(Debug)]
    struct Layer {
        msg: String,
        source: Option<Box<Layer>>,
    }

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.msg)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.source.as_deref().map(|s| s as _)
        }
    }

    fn layers(msgs: &[&str]) -> Layer {
        msgs.iter()
            .rev()
            .fold(None, |source, msg| {
                Some(Layer {
                    msg: (*msg).to_owned(),
                    source: source.map(Box::new),
                })
            })
            .expect("at least one layer")
    }

    #[test]
    fn cause_chain_joins_each_cause_once() {
        let os = "No such file or directory (os error 2)";
        for (msgs, line) in [
            (vec!["alone"], "alone".to_owned()),
            (
                vec!["flock agent unreachable at /a.sock", os],
                format!("flock agent unreachable at /a.sock: {os}"),
            ),
            // The outer message already prints its source: not twice.
            (
                vec![&format!("read /x: {os}"), os],
                format!("read /x: {os}"),
            ),
            // Nor a cause two levels down that a wrapper already printed.
            (
                vec!["install: write /y: denied", "write /y: denied", "denied"],
                "install: write /y: denied".to_owned(),
            ),
            (
                vec!["outer", "middle: inner", "inner", "root"],
                "outer: middle: inner: root".to_owned(),
            ),
            // A cause that only ends the line in the middle of a word is printed.
            (vec!["os error 12", "2"], "os error 12: 2".to_owned()),
            (vec!["outer", "", "inner"], "outer: inner".to_owned()),
        ] {
            assert_eq!(cause_chain(&layers(&msgs)), line, "{msgs:?}");
        }
    }

    #[test]
    fn display_names_details() {
        let e = CniError::new(ErrorCode::IoFailure, "open x").with_details("denied");
        assert_eq!(e.to_string(), "open x: denied");
    }
}
