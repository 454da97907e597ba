//! A `skel`-style dispatcher: a plugin implements [`Plugin`] and its `main`
//! calls [`run`], which reads the environment and stdin, negotiates the
//! version, calls the right method and prints exactly one JSON document (or
//! nothing, for a successful DEL/CHECK/STATUS/GC) before exiting.
//!
//! [`dispatch`] is the same thing without the process: environment lookup,
//! stdin and stdout are arguments and it returns the exit code, so it can be
//! tested in memory.

use std::io::{Read, Write};

use serde_json::Value;

use crate::env::{CniEnv, Command};
use crate::error::{CniError, ErrorCode};
use crate::netconf::NetConf;
use crate::result::CniResult;
use crate::version::{CniVersion, VersionInfo};

/// Everything a plugin method gets about one call.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The validated `CNI_*` variables.
    pub env: &'a CniEnv,
    /// The parsed network configuration.
    pub conf: &'a NetConf,
    /// The network configuration exactly as it arrived on stdin.
    pub raw_conf: &'a Value,
    /// The negotiated version (the config's `cniVersion`).
    pub version: CniVersion,
}

/// A CNI plugin. Errors are returned as [`CniError`] and printed by the
/// dispatcher in the call's version.
pub trait Plugin {
    /// The versions the plugin speaks; VERSION reports them and a config in
    /// any other version is refused with error 1.
    fn supported_versions(&self) -> &[CniVersion] {
        &CniVersion::SUPPORTED
    }
    /// ADD: create the attachment and return its result.
    fn add(&self, call: &Call<'_>) -> Result<CniResult, CniError>;
    /// DEL: remove the attachment; must succeed when it is already gone.
    fn del(&self, call: &Call<'_>) -> Result<(), CniError>;
    /// CHECK: report any difference from what ADD created.
    fn check(&self, call: &Call<'_>) -> Result<(), CniError>;
    /// STATUS: whether the plugin is ready to serve ADDs. By default it always is: a plugin
    /// with nothing to wait for need not implement it.
    fn status(&self, call: &Call<'_>) -> Result<(), CniError> {
        let _ = call;
        Ok(())
    }
    /// GC: release every attachment of this network not in
    /// [`NetConf::gc_attachments`]. By default nothing: a plugin that keeps no state per
    /// attachment has nothing to collect.
    fn gc(&self, call: &Call<'_>) -> Result<(), CniError> {
        let _ = call;
        Ok(())
    }
}

/// The exit code of a failed call.
pub const EXIT_FAILURE: i32 = 1;

/// Handles one call: returns the process exit code after writing the
/// result or error to `stdout`.
pub fn dispatch<P: Plugin + ?Sized>(
    plugin: &P,
    get_env: impl Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
) -> i32 {
    let supported = plugin.supported_versions();
    let newest = supported
        .iter()
        .copied()
        .max()
        .unwrap_or(CniVersion::LATEST);
    let (version, outcome) = handle(plugin, supported, get_env, stdin);
    let (doc, code) = match outcome {
        Ok(Some(doc)) => (Some(doc), 0),
        Ok(None) => (None, 0),
        Err(e) => (Some(e.to_value(version.unwrap_or(newest))), EXIT_FAILURE),
    };
    if let Some(doc) = doc {
        let written = serde_json::to_writer(&mut *stdout, &doc)
            .map_err(std::io::Error::from)
            .and_then(|()| stdout.write_all(b"\n"))
            .and_then(|()| stdout.flush());
        if written.is_err() {
            return EXIT_FAILURE;
        }
    }
    code
}

type Outcome = Result<Option<Value>, CniError>;

fn handle<P: Plugin + ?Sized>(
    plugin: &P,
    supported: &[CniVersion],
    get_env: impl Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
) -> (Option<CniVersion>, Outcome) {
    let env = match CniEnv::from_lookup(get_env) {
        Ok(env) => env,
        Err(e) => return (None, Err(e)),
    };
    let version_reply = || {
        serde_json::to_value(VersionInfo::new(supported))
            .map(Some)
            .map_err(internal)
    };
    if env.command == Command::Version {
        // Answered before stdin is read: a runtime may pass no config at all.
        return (None, version_reply());
    }
    // Room for a usual configuration from the start: one read and the one that sees the end,
    // where an empty vector reads 32 bytes, then 64, and so on.
    let mut bytes = Vec::with_capacity(8 * 1024);
    if let Err(e) = stdin.read_to_end(&mut bytes) {
        return (
            None,
            Err(CniError::new(
                ErrorCode::IoFailure,
                format!("reading the network configuration from stdin: {e}"),
            )),
        );
    }
    let (conf, raw) = match NetConf::from_slice(&bytes) {
        Ok(c) => c,
        Err(e) => return (None, Err(e)),
    };
    let version = conf.cni_version;
    if !supported.contains(&version) {
        let list: Vec<String> = supported.iter().map(ToString::to_string).collect();
        return (
            None,
            Err(CniError::new(
                ErrorCode::IncompatibleCniVersion,
                format!(
                    "unsupported cniVersion \"{version}\": this plugin supports {}",
                    list.join(", ")
                ),
            )),
        );
    }
    let too_old = |min: CniVersion| {
        Err(CniError::new(
            ErrorCode::IncompatibleCniVersion,
            format!(
                "{} needs cniVersion {min} or later, the config has \"{version}\"",
                env.command
            ),
        ))
    };
    let call = Call {
        env: &env,
        conf: &conf,
        raw_conf: &raw,
        version,
    };
    let outcome = match env.command {
        Command::Add => plugin.add(&call).map(|r| Some(r.to_value(version))),
        Command::Del => plugin.del(&call).map(|()| None),
        Command::Check if !version.has_check() => too_old(CniVersion::V0_4_0),
        Command::Check => plugin.check(&call).map(|()| None),
        Command::Status | Command::Gc if !version.has_status_and_gc() => {
            too_old(CniVersion::V1_1_0)
        }
        Command::Status => plugin.status(&call).map(|()| None),
        Command::Gc => plugin.gc(&call).map(|()| None),
        Command::Version => version_reply(),
    };
    (Some(version), outcome)
}

fn internal(e: serde_json::Error) -> CniError {
    CniError::new(ErrorCode::Internal, format!("encoding the reply: {e}"))
}

/// Runs `plugin` as the process: reads the real environment and stdin,
/// writes to stdout, and exits with the dispatcher's code.
pub fn run<P: Plugin + ?Sized>(plugin: &P) -> ! {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let code = dispatch(
        plugin,
        |k| std::env::var(k).ok(),
        &mut stdin.lock(),
        &mut stdout.lock(),
    );
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Recorder {
        calls: RefCell<Vec<(Command, CniVersion)>>,
    }

    impl Plugin for Recorder {
        fn add(&self, call: &Call<'_>) -> Result<CniResult, CniError> {
            self.calls
                .borrow_mut()
                .push((call.env.command, call.version));
            Ok(crate::result::tests::dual_stack())
        }
        fn del(&self, call: &Call<'_>) -> Result<(), CniError> {
            self.calls
                .borrow_mut()
                .push((call.env.command, call.version));
            Err(
                CniError::new(ErrorCode::Plugin(120), "teardown of eth0 failed")
                    .with_details("busy"),
            )
        }
        fn check(&self, call: &Call<'_>) -> Result<(), CniError> {
            self.calls
                .borrow_mut()
                .push((call.env.command, call.version));
            Ok(())
        }
        fn status(&self, call: &Call<'_>) -> Result<(), CniError> {
            self.calls
                .borrow_mut()
                .push((call.env.command, call.version));
            Ok(())
        }
        fn gc(&self, call: &Call<'_>) -> Result<(), CniError> {
            self.calls
                .borrow_mut()
                .push((call.env.command, call.version));
            Ok(())
        }
    }

    fn call(p: &Recorder, cmd: &str, stdin: &str) -> (i32, String) {
        let env: HashMap<&str, &str> = [
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]
        .into();
        let mut out = Vec::new();
        let code = dispatch(
            p,
            |k| env.get(k).map(|v| v.to_string()),
            &mut stdin.as_bytes(),
            &mut out,
        );
        (code, String::from_utf8(out).unwrap())
    }

    fn conf(v: &str) -> String {
        format!(r#"{{"cniVersion":"{v}","name":"n","type":"t"}}"#)
    }

    #[test]
    fn add_prints_one_document_in_the_config_version() {
        let p = Recorder::default();
        let (code, out) = call(&p, "ADD", &conf("0.4.0"));
        assert_eq!(code, 0);
        assert_eq!(out.lines().count(), 1);
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["ips"][0]["version"], "6");
    }

    #[test]
    fn errors_and_negotiation() {
        let p = Recorder::default();
        let (code, out) = call(&p, "DEL", &conf("1.0.0"));
        assert_eq!(code, 1);
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cniVersion":"1.0.0","code":120,"msg":"teardown of eth0 failed","details":"busy"})
        );

        let (code, out) = call(&p, "ADD", &conf("0.3.1"));
        assert_eq!(code, 1);
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            (v["code"].as_u64(), v["cniVersion"].as_str()),
            (Some(1), Some("1.1.0"))
        );
        assert!(v["msg"].as_str().unwrap().contains("\"0.3.1\""));

        for cmd in ["STATUS", "GC"] {
            let (code, out) = call(&p, cmd, &conf("1.0.0"));
            assert_eq!(code, 1, "{cmd}");
            assert!(out.contains("\"code\":1"), "{out}");
            assert_eq!(call(&p, cmd, &conf("1.1.0")), (0, String::new()));
        }
        let (code, out) = call(&p, "ADD", "{not json");
        assert_eq!(code, 1);
        assert!(out.contains("\"code\":6"), "{out}");
        assert_eq!(
            *p.calls.borrow(),
            vec![
                (Command::Del, CniVersion::V1_0_0),
                (Command::Status, CniVersion::V1_1_0),
                (Command::Gc, CniVersion::V1_1_0)
            ]
        );
    }

    #[test]
    fn version_needs_no_config() {
        let p = Recorder::default();
        let (code, out) = call(&p, "VERSION", "");
        assert_eq!(code, 0);
        assert_eq!(
            out.trim(),
            r#"{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}"#
        );
    }

    #[test]
    fn check_before_0_4_0_is_refused_even_if_supported() {
        struct Old(Recorder);
        impl Plugin for Old {
            fn supported_versions(&self) -> &[CniVersion] {
                const V: [CniVersion; 2] = [CniVersion::new(0, 3, 1), CniVersion::V0_4_0];
                &V
            }
            fn add(&self, c: &Call<'_>) -> Result<CniResult, CniError> {
                self.0.add(c)
            }
            fn del(&self, c: &Call<'_>) -> Result<(), CniError> {
                self.0.del(c)
            }
            fn check(&self, c: &Call<'_>) -> Result<(), CniError> {
                self.0.check(c)
            }
            fn status(&self, c: &Call<'_>) -> Result<(), CniError> {
                self.0.status(c)
            }
            fn gc(&self, c: &Call<'_>) -> Result<(), CniError> {
                self.0.gc(c)
            }
        }
        let p = Old(Recorder::default());
        let env: HashMap<&str, &str> = [
            ("CNI_COMMAND", "CHECK"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_NETNS", "/n"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/p"),
        ]
        .into();
        let mut out = Vec::new();
        let code = dispatch(
            &p,
            |k| env.get(k).map(|v| v.to_string()),
            &mut conf("0.3.1").as_bytes(),
            &mut out,
        );
        assert_eq!(code, 1);
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("CHECK needs cniVersion 0.4.0"), "{s}");
        assert!(p.0.calls.borrow().is_empty());
    }
}
