//! The `CNI_*` environment of a plugin call, validated as libcni does, and
//! the `CNI_ARGS` `K=V;K=V` list.

use std::fmt;
use std::str::FromStr;

use crate::error::{CniError, ErrorCode};

/// `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Command {
    /// ADD.
    Add,
    /// DEL.
    Del,
    /// CHECK (0.4.0).
    Check,
    /// STATUS (1.1.0).
    Status,
    /// GC (1.1.0).
    Gc,
    /// VERSION.
    Version,
}

impl Command {
    /// The command as the environment spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Command {
    type Err = CniError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            _ => {
                return Err(CniError::new(
                    ErrorCode::InvalidEnvironmentVariables,
                    format!(
                        "invalid CNI_COMMAND {s:?}: expected ADD, DEL, CHECK, STATUS, GC or VERSION"
                    ),
                ));
            }
        })
    }
}

/// The validated `CNI_*` variables of one call; absent optional variables
/// are empty strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`.
    pub netns: String,
    /// `CNI_IFNAME`.
    pub if_name: String,
    /// `CNI_ARGS`, raw (parse with [`CniArgs::parse`]).
    pub args: String,
    /// `CNI_PATH`.
    pub path: String,
}

impl CniEnv {
    /// Reads and validates the variables through `get` (a lookup in the
    /// process environment or a test's map). Every problem is error 4 naming
    /// the variable and the value: an unknown command, required variables
    /// missing for the command (libcni's table: `CNI_CONTAINERID`,
    /// `CNI_IFNAME` and `CNI_PATH` for ADD/DEL/CHECK, `CNI_NETNS` for
    /// ADD/CHECK, `CNI_PATH` for STATUS/GC), a malformed container ID or
    /// interface name.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<CniEnv, CniError> {
        let command: Command = get("CNI_COMMAND")
            .ok_or_else(|| {
                CniError::new(
                    ErrorCode::InvalidEnvironmentVariables,
                    "required environment variable CNI_COMMAND is missing",
                )
            })?
            .parse()?;
        use Command::*;
        let required: &[(&str, &[Command])] = &[
            ("CNI_CONTAINERID", &[Add, Del, Check]),
            ("CNI_NETNS", &[Add, Check]),
            ("CNI_IFNAME", &[Add, Del, Check]),
            ("CNI_PATH", &[Add, Del, Check, Status, Gc]),
        ];
        let missing: Vec<&str> = required
            .iter()
            .filter(|(var, cmds)| cmds.contains(&command) && get(var).is_none_or(|v| v.is_empty()))
            .map(|(var, _)| *var)
            .collect();
        if !missing.is_empty() {
            return Err(CniError::new(
                ErrorCode::InvalidEnvironmentVariables,
                format!(
                    "required environment variables missing for {command}: {}",
                    missing.join(", ")
                ),
            ));
        }
        let env = CniEnv {
            command,
            container_id: get("CNI_CONTAINERID").unwrap_or_default(),
            netns: get("CNI_NETNS").unwrap_or_default(),
            if_name: get("CNI_IFNAME").unwrap_or_default(),
            args: get("CNI_ARGS").unwrap_or_default(),
            path: get("CNI_PATH").unwrap_or_default(),
        };
        if !env.container_id.is_empty() {
            validate_container_id(&env.container_id)?;
        }
        if matches!(command, Add | Del | Check) {
            validate_if_name(&env.if_name)?;
        }
        Ok(env)
    }
}

/// libcni's container ID rule: `[a-zA-Z0-9][a-zA-Z0-9_.-]*`. Error 4.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    let mut bytes = id.bytes();
    let ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(CniError::new(
            ErrorCode::InvalidEnvironmentVariables,
            format!("invalid CNI_CONTAINERID {id:?}: must match [a-zA-Z0-9][a-zA-Z0-9_.-]*"),
        ))
    }
}

/// libcni's interface name rule: non-empty, at most 15 bytes, not `.` or
/// `..`, no `/`, `:` or whitespace. Error 4.
pub fn validate_if_name(name: &str) -> Result<(), CniError> {
    let why = if name.is_empty() {
        Some("is empty")
    } else if name.len() > 15 {
        Some("is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("is not a valid name")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("contains '/', ':' or whitespace")
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(CniError::new(
            ErrorCode::InvalidEnvironmentVariables,
            format!("invalid CNI_IFNAME {name:?}: {why}"),
        )),
    }
}

/// `CNI_ARGS`: `K=V;K=V`, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
}

impl CniArgs {
    /// Parses `K=V;K=V` (empty input is an empty list). A pair without `=`
    /// or with an empty key is error 4 naming it.
    pub fn parse(s: &str) -> Result<CniArgs, CniError> {
        let mut pairs = Vec::new();
        for pair in s.split(';').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some((k, v)) if !k.is_empty() => pairs.push((k.to_owned(), v.to_owned())),
                _ => {
                    return Err(CniError::new(
                        ErrorCode::InvalidEnvironmentVariables,
                        format!("invalid CNI_ARGS pair {pair:?} in {s:?}: expected KEY=VALUE"),
                    ));
                }
            }
        }
        Ok(CniArgs { pairs })
    }

    /// The value of the last occurrence of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every pair, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Whether `IgnoreUnknown` is set (`1` or `true`, any case).
    pub fn ignore_unknown(&self) -> bool {
        self.get("IgnoreUnknown")
            .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
    }

    /// Rejects keys outside `known` (error 4 naming the key and value),
    /// unless `IgnoreUnknown` is set.
    pub fn check_known(&self, known: &[&str]) -> Result<(), CniError> {
        if self.ignore_unknown() {
            return Ok(());
        }
        match self
            .iter()
            .find(|(k, _)| *k != "IgnoreUnknown" && !known.contains(k))
        {
            None => Ok(()),
            Some((k, v)) => Err(CniError::new(
                ErrorCode::InvalidEnvironmentVariables,
                format!(
                    "unknown CNI_ARGS key {k:?} (value {v:?}); set IgnoreUnknown=1 to allow it"
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<CniEnv, CniError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CniEnv::from_lookup(|k| m.get(k).cloned())
    }

    const ADD: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];

    #[test]
    fn reads_a_full_add() {
        let e = env(ADD).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.if_name, "eth0");
    }

    #[test]
    fn del_needs_no_netns_and_gc_no_container() {
        let mut del: Vec<_> = ADD
            .iter()
            .filter(|(k, _)| *k != "CNI_NETNS")
            .copied()
            .collect();
        del[0] = ("CNI_COMMAND", "DEL");
        assert!(env(&del).is_ok());
        assert!(env(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/x")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
    }

    #[test]
    fn errors_name_variable_and_value() {
        let e = env(&[("CNI_COMMAND", "ADDD")]).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidEnvironmentVariables);
        assert!(e.msg.contains("\"ADDD\""));
        let e = env(&[("CNI_COMMAND", "ADD"), ("CNI_PATH", "/x")]).unwrap_err();
        assert!(
            e.msg.contains("CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME"),
            "{}",
            e.msg
        );
        for (var, val) in [
            ("CNI_IFNAME", "a/b"),
            ("CNI_IFNAME", "a:b"),
            ("CNI_IFNAME", "a b"),
            ("CNI_IFNAME", "."),
            ("CNI_IFNAME", ".."),
            ("CNI_IFNAME", "sixteen-chars-xx"),
            ("CNI_CONTAINERID", "-abc"),
            ("CNI_CONTAINERID", "a/b"),
        ] {
            let vars: Vec<_> = ADD
                .iter()
                .map(|&(k, v)| if k == var { (k, val) } else { (k, v) })
                .collect();
            let e = env(&vars).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidEnvironmentVariables);
            assert!(
                e.msg.contains(var) && e.msg.contains(&format!("{val:?}")),
                "{}",
                e.msg
            );
        }
        assert!(validate_if_name("fifteen-chars-x").is_ok());
    }

    #[test]
    fn cni_args() {
        let a =
            CniArgs::parse("K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;IgnoreUnknown=1;X=a=b")
                .unwrap();
        assert_eq!(a.get("K8S_POD_NAME"), Some("web-0"));
        assert_eq!(a.get("X"), Some("a=b"));
        assert!(a.check_known(&["K8S_POD_NAME"]).is_ok());
        let a = CniArgs::parse("K8S_POD_NAME=web-0;FOO=bar").unwrap();
        let e = a.check_known(&["K8S_POD_NAME"]).unwrap_err();
        assert!(e.msg.contains("\"FOO\""), "{}", e.msg);
        assert!(CniArgs::parse("").unwrap().iter().next().is_none());
        let e = CniArgs::parse("A=1;broken").unwrap_err();
        assert!(e.msg.contains("\"broken\""));
        assert!(CniArgs::parse("=v").is_err());
    }
}
