//! flock's CNI shim: the binary a container runtime execs as `/opt/cni/bin/flock`.
//!
//! It answers `VERSION` itself and forwards every other call to the node
//! agent over its Unix socket (DESIGN §2): the agent's error is printed as
//! the CNI error; ADD and CHECK wait up to `agentWaitSeconds` (30) for an agent
//! that does not listen, retrying only what certainly did not reach it; an
//! unreachable agent is then error 11 for ADD, CHECK and GC and error 50 for
//! STATUS, unless the agent left its restart notice less than `agentWaitSeconds` ago
//! (`rpc::restart_notice`: STATUS succeeds, as ADDs wait for its successor); a DEL the agent may not have completed (not
//! delivered, or the connection broke or timed out before the answer) is
//! written durably to the DEL queue and reported as success: DEL is
//! idempotent, and the agent runs the queue. Nothing but the CNI result or
//! error is ever written to stdout; with `FLOCK_SHIM_DEBUG=1` a line per
//! failed or queued call goes to stderr.

use std::os::unix::net::UnixStream;

use flock_cni_proto::error::cause_chain;
use flock_cni_proto::serde_json;
use flock_cni_proto::{Call, CniError, CniResult, ErrorCode, Plugin, skel};
use flock_rpc::rpc::{Client, ClientError, Op, Request};
use flock_rpc::{DelQueue, FlockNetConf, QueueError};

/// The shim: stateless; every call opens one connection to the agent.
struct Shim {
    debug: bool,
}

impl Shim {
    fn log(&self, call: &Call<'_>, what: std::fmt::Arguments<'_>) {
        if self.debug {
            eprintln!(
                "flock: {} container={} ifname={}: {what}",
                call.env.command, call.env.container_id, call.env.if_name
            );
        }
    }

    /// Sends the call to the agent; `Ok(Err)` is the agent's own CNI error.
    fn forward(
        &self,
        op: Op,
        call: &Call<'_>,
        conf: &FlockNetConf,
    ) -> Result<Result<Option<serde_json::Value>, CniError>, ClientError> {
        let req = Request::new(op, call.env, call.raw_conf.clone());
        let stream = connect(&conf.agent_socket, Client::CONNECT_TIMEOUT).map_err(|source| {
            ClientError::Unreachable {
                path: conf.agent_socket.clone(),
                source,
            }
        })?;
        let resp = Client::new(&conf.agent_socket).call_on(stream, &req)?;
        Ok(resp.into_result())
    }

    /// [`forward`](Self::forward), waiting up to `agentWaitSeconds` for an agent that does
    /// not listen (restarting: an upgrade, a crash) — retried only while the request
    /// certainly did not reach it, so nothing runs twice.
    fn forward_waiting(
        &self,
        op: Op,
        call: &Call<'_>,
        conf: &FlockNetConf,
    ) -> Result<Result<Option<serde_json::Value>, CniError>, ClientError> {
        let deadline = std::time::Instant::now() + conf.agent_wait;
        let mut pause = std::time::Duration::from_millis(20);
        loop {
            match self.forward(op, call, conf) {
                Err(e) if e.is_undelivered() && std::time::Instant::now() + pause < deadline => {
                    self.log(call, format_args!("{}; waiting for the agent", e.chain()));
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(250));
                }
                outcome => return outcome,
            }
        }
    }

    /// Forward a call with no result; unreachable agent → `unreachable`.
    fn forward_unit(
        &self,
        op: Op,
        call: &Call<'_>,
        unreachable: ErrorCode,
        any_failure: bool,
    ) -> Result<(), CniError> {
        let conf = FlockNetConf::from_netconf(call.conf)?;
        // CHECK waits for a restarting agent as ADD does; STATUS answers at once (it is the
        // question whether the agent serves), and GC can wait for the next one.
        let outcome = if matches!(op, Op::Check) {
            self.forward_waiting(op, call, &conf)
        } else {
            self.forward(op, call, &conf)
        };
        match outcome {
            Ok(outcome) => outcome.map(|_| ()),
            Err(e) => {
                self.log(call, format_args!("{}", e.chain()));
                let code = if e.is_unreachable() || any_failure {
                    unreachable
                } else {
                    ErrorCode::Internal
                };
                Err(e.to_cni(code))
            }
        }
    }
}

impl Plugin for Shim {
    fn add(&self, call: &Call<'_>) -> Result<CniResult, CniError> {
        let conf = FlockNetConf::from_netconf(call.conf)?;
        match self.forward_waiting(Op::Add, call, &conf) {
            Ok(Ok(Some(result))) => CniResult::from_value(&result).map_err(|e| {
                CniError::new(
                    ErrorCode::Internal,
                    "the flock agent returned an invalid ADD result",
                )
                .with_details(e.to_string())
            }),
            Ok(Ok(None)) => Err(CniError::new(
                ErrorCode::Internal,
                "the flock agent returned no ADD result",
            )),
            Ok(Err(agent)) => Err(agent),
            Err(e) => {
                self.log(call, format_args!("{}", e.chain()));
                let code = if e.is_unreachable() {
                    ErrorCode::TryAgainLater
                } else {
                    ErrorCode::Internal
                };
                Err(e.to_cni(code))
            }
        }
    }

    fn del(&self, call: &Call<'_>) -> Result<(), CniError> {
        let conf = FlockNetConf::from_netconf(call.conf)?;
        match self.forward(Op::Del, call, &conf) {
            Ok(outcome) => outcome.map(|_| ()),
            // Not delivered, or delivered but not answered (the agent died or
            // hung while running it): the agent may not have torn it down.
            // DEL is idempotent, so the agent runs it (again) from the queue.
            Err(e) if e.may_be_incomplete() => {
                let queue = DelQueue::new(&conf.del_queue_dir);
                let req = Request::new(Op::Del, call.env, call.raw_conf.clone());
                match queue.enqueue(&req) {
                    Ok(file) => {
                        self.log(
                            call,
                            format_args!("{}; queued as {}", e.chain(), file.display()),
                        );
                        Ok(())
                    }
                    Err(q) => Err(CniError::new(
                        ErrorCode::IoFailure,
                        format!("{e}, and the DEL could not be queued: {q}"),
                    )
                    .with_details(format!(
                        "{}; {}",
                        e.causes(),
                        queue_causes(&q)
                    ))),
                }
            }
            // The agent answered with something unreadable: it finished the
            // DEL, and whether it failed is unknown.
            Err(e) => {
                self.log(call, format_args!("{}", e.chain()));
                Err(e.to_cni(ErrorCode::Internal))
            }
        }
    }

    fn check(&self, call: &Call<'_>) -> Result<(), CniError> {
        self.forward_unit(Op::Check, call, ErrorCode::TryAgainLater, false)
    }

    fn status(&self, call: &Call<'_>) -> Result<(), CniError> {
        let conf = FlockNetConf::from_netconf(call.conf)?;
        match self.forward(Op::Status, call, &conf) {
            Ok(outcome) => outcome.map(|_| ()),
            // Nothing listens, but the agent said it is being replaced: ADDs wait for its
            // successor (rpc::restart_notice says why this is ready, not degraded).
            Err(e) if e.is_undelivered() && restarting(&conf) => {
                self.log(call, format_args!("{}; the agent is restarting", e.chain()));
                Ok(())
            }
            // Any other failure to get an answer means the plugin cannot serve ADDs.
            Err(e) => {
                self.log(call, format_args!("{}", e.chain()));
                Err(e.to_cni(ErrorCode::PluginNotAvailable))
            }
        }
    }

    fn gc(&self, call: &Call<'_>) -> Result<(), CniError> {
        self.forward_unit(Op::Gc, call, ErrorCode::TryAgainLater, false)
    }
}

/// Whether the agent left its restart notice less than `agentWaitSeconds` ago.
fn restarting(conf: &FlockNetConf) -> bool {
    std::fs::metadata(flock_rpc::rpc::restart_notice(&conf.agent_socket))
        .and_then(|m| m.modified())
        .is_ok_and(|at| at.elapsed().is_ok_and(|age| age <= conf.agent_wait))
}

/// Connects to the agent's socket, waiting at most `timeout`. A Unix socket's connect waits
/// only while the listener's backlog is full (an agent that stopped accepting), and at most
/// the socket's send timeout (`SO_SNDTIMEO`), after which it fails with `EAGAIN`: so the
/// timeout is set before the connect, and cleared after it. No helper thread: creating one
/// cost every call more than a tenth of a millisecond.
fn connect(path: &std::path::Path, timeout: std::time::Duration) -> std::io::Result<UnixStream> {
    use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr, sockopt};
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // A zero timeout would mean "wait forever" to the kernel.
    let timeout = timeout.max(std::time::Duration::from_millis(1));
    let timeval = <nix::sys::time::TimeVal as nix::sys::time::TimeValLike>::microseconds(
        timeout.as_micros().try_into().unwrap_or(i64::MAX),
    );
    socket::setsockopt(&fd, sockopt::SendTimeout, &timeval)?;
    let addr = UnixAddr::new(path)?;
    loop {
        match socket::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
            Ok(()) => break,
            // With a send timeout set, the kernel never restarts the wait itself; a Unix
            // socket that was interrupted is not connected, so connect again.
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EAGAIN) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connect timed out after {timeout:?}"),
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let stream = UnixStream::from(fd);
    stream.set_write_timeout(None)?;
    Ok(stream)
}

/// The causes under a queue error (its I/O error), or the error itself when
/// it has none.
fn queue_causes(q: &QueueError) -> String {
    std::error::Error::source(q).map_or_else(|| q.to_string(), cause_chain)
}

/// The one symbol Rust's `x86_64-unknown-linux-gnu` standard library needs from glibc that musl
/// lacks, when the shim is linked against musl (`--cfg flock_musl`, `flock-plugin/musl.specs`):
/// GCC 12's unwinder (`libgcc_eh`) looks up a program counter's unwind tables with it. "Not
/// found" means a panic cannot unwind and a backtrace is empty; the release profile aborts on
/// panic anyway, and its binary carries no symbols to print.
#[cfg(flock_musl)]
#[expect(
    unsafe_code,
    reason = "the linker must find this symbol under its C name; the body touches nothing"
)]
#[unsafe(no_mangle)]
extern "C" fn _dl_find_object(
    _pc: *mut std::ffi::c_void,
    _result: *mut std::ffi::c_void,
) -> std::ffi::c_int {
    -1
}

/// The shim's allocator, in every build (the shipped one is linked against musl). musl's maps
/// and unmaps memory a page at a time as the small documents of a call come and go, each a
/// system call and a page fault (here a trap to the hypervisor); dlmalloc keeps what it got
/// until the process exits, which is soon. An ADD exec'd against a stand-in agent took about
/// 70 µs less (BENCHMARKS.md, issue 13).
#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() {
    let debug = std::env::var_os("FLOCK_SHIM_DEBUG").is_some_and(|v| v == "1");
    skel::run(&Shim { debug })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::connect;

    #[test]
    fn connect_gives_up_on_an_agent_that_stopped_accepting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        // Listening, never accepting: once its backlog is full, a connect waits.
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut held = Vec::new();
        let e = loop {
            match connect(&path, Duration::from_millis(50)) {
                Ok(stream) => {
                    // Nothing of the connect's timeout is left on the connection.
                    assert_eq!(stream.write_timeout().unwrap(), None);
                    held.push(stream);
                }
                Err(e) => break e,
            }
            assert!(held.len() < 100_000, "the backlog never filled");
        };
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(
            e.to_string().contains("connect timed out after 50ms"),
            "{e}"
        );
        // No socket at all: refused at once.
        let e = connect(&dir.path().join("none.sock"), Duration::from_secs(2)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }
}
