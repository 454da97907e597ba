//! The RPC server: a Unix socket in a 0700 directory, mode 0600, one request and one response
//! per connection (DESIGN §2). Each connection is its own task; a client that sends nothing,
//! half a line, an oversize line or garbage gets an error response (or a closed connection)
//! and never holds up the others.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flock_cni_proto::{CniError, ErrorCode};
use flock_rpc::rpc::{self, LineDecoder, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, info, warn};

use crate::agent::Agent;
use crate::trace::Phases;
use crate::{Error, Result};

/// How long a client may take to send its request line.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the agent socket: creates its directory with mode 0700, or makes an existing one
/// 0700 (a hostPath the kubelet created 0755), so there is no window in which the socket is
/// reachable with a looser mode; removes a stale socket, binds and sets the socket to 0600.
/// A shared directory (sticky, like `/tmp`) is refused rather than locked down.
pub fn bind(path: &Path) -> Result<UnixListener> {
    let io = |op: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| Error::Socket { op, path, source }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io("create socket directory", dir))?;
    let mode = std::fs::metadata(dir)
        .map_err(io("stat socket directory", dir))?
        .permissions()
        .mode();
    if mode & 0o1000 != 0 {
        return Err(Error::SharedSocketDir {
            path: dir.to_owned(),
            mode: mode & 0o7777,
        });
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io("chmod socket directory", dir))?;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove stale socket", path)(e)),
    }
    let listener = UnixListener::bind(path).map_err(io("bind agent socket", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io("chmod socket", path))?;
    Ok(listener)
}

/// How long a stopping server waits for the requests it has taken: below the kubelet's
/// default grace period of 30 s, so an ADD under way is answered before SIGKILL could come.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a stopping server waits for one more connection from the listen backlog.
const BACKLOG_POLL: Duration = Duration::from_millis(50);

/// Serves connections until `stop` completes, then drains: the caller has removed the
/// socket's path first, so nothing new can connect; what had connected and waits in the
/// listen backlog is accepted and served, and every request taken is answered (up to
/// [`DRAIN_TIMEOUT`]). A rolling update thus breaks no ADD: one that reached this agent gets
/// its answer from it, one that did not waits for the successor (the shim's restart wait).
pub async fn serve(
    listener: UnixListener,
    agent: Arc<Agent>,
    socket: PathBuf,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(serve_connection(stream, agent.clone()));
                }
                Err(e) => {
                    warn!(socket = %socket.display(), error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = &mut stop => break,
        }
    }
    while let Ok(Ok((stream, _))) = tokio::time::timeout(BACKLOG_POLL, listener.accept()).await {
        conns.spawn(serve_connection(stream, agent.clone()));
    }
    drop(listener);
    let taken = conns.len();
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    match drained {
        Ok(()) => info!(
            requests = taken,
            "stopped serving; every request taken was answered"
        ),
        Err(_) => warn!(
            unanswered = conns.len(),
            timeout_s = DRAIN_TIMEOUT.as_secs(),
            "stopped serving with requests unanswered"
        ),
    }
}

async fn serve_connection(mut stream: UnixStream, agent: Arc<Agent>) {
    let traced = agent.trace_begin();
    let mut phases = Phases::start();
    let (response, tag) = match tokio::time::timeout(READ_TIMEOUT, read_request(&mut stream)).await
    {
        Err(_) => (
            Response::error(bad_request(format!(
                "no complete request line within {}s",
                READ_TIMEOUT.as_secs()
            ))),
            None,
        ),
        Ok(Err(response)) => (response, None),
        Ok(Ok(request)) => {
            phases.mark("read");
            let (response, tag) = agent.handle_with(request, &mut phases).await;
            (response, Some(tag))
        }
    };
    let line = rpc::encode_line(&response);
    if let Err(e) = stream.write_all(&line).await {
        debug!(error = %e, "client went away before the response");
    }
    let _ = stream.shutdown().await;
    if let (Some(tag), Some(traced)) = (tag, traced) {
        phases.mark("reply");
        traced.record(&tag, &phases);
    }
}

async fn read_request(stream: &mut UnixStream) -> Result<rpc::Request, Response> {
    let mut decoder = LineDecoder::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match decoder.next_line() {
            Ok(Some(line)) => {
                return rpc::decode_request(&line)
                    .map_err(|e| Response::error(bad_request(format!("invalid request: {e}"))));
            }
            Ok(None) => {}
            Err(e) => {
                return Err(Response::error(bad_request(format!(
                    "invalid request: {e}"
                ))));
            }
        }
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| Response::error(bad_request(format!("read request: {e}"))))?;
        if n == 0 {
            let e = decoder.finish().err().unwrap_or(rpc::FrameError::Empty);
            return Err(Response::error(bad_request(format!(
                "invalid request: {e}"
            ))));
        }
        decoder.push(&buf[..n]);
    }
}

fn bad_request(msg: String) -> CniError {
    CniError::new(ErrorCode::DecodingFailure, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777
    }

    #[tokio::test]
    async fn socket_is_0600_in_a_0700_directory() {
        let tmp = tempfile::tempdir().expect("tmp");
        // A directory the agent creates.
        let socket = tmp.path().join("new/agent.sock");
        let _listener = bind(&socket).expect("bind");
        assert_eq!(mode(socket.parent().expect("dir")), 0o700);
        assert_eq!(mode(&socket), 0o600);
        // One that exists with a looser mode (a hostPath created 0755), and a stale socket.
        let dir = tmp.path().join("hostpath");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::write(dir.join("agent.sock"), b"stale").expect("stale file");
        let _listener = bind(&dir.join("agent.sock")).expect("bind over a stale socket");
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("agent.sock")), 0o600);
    }

    /// A STATUS request line; its config names the network as a runtime would.
    fn status_line() -> Vec<u8> {
        rpc::encode_line(&rpc::Request {
            v: rpc::PROTOCOL_VERSION,
            op: rpc::Op::Status,
            container_id: String::new(),
            netns: String::new(),
            if_name: String::new(),
            args: String::new(),
            path: String::new(),
            config: serde_json::json!({"cniVersion": "1.1.0", "name": "flock", "type": "flock"}),
        })
    }

    async fn agent(dir: &Path) -> Arc<Agent> {
        let kernel = Arc::new(crate::kernel::memory::MemoryKernel::new("boot-1"));
        let config: flock_k8s_api::NodeConfig = serde_json::from_value(serde_json::json!({
            "apiVersion": "flock.fritzlab.net/v1alpha1",
            "kind": "NodeConfig",
            "metadata": { "name": "node-a" },
            "spec": { "cidr6": "2001:db8:7::/64" }
        }))
        .expect("fixture");
        let (agent, _) = Agent::start(crate::agent::AgentParts {
            settings: Some(config.settings().expect("valid")),
            ..crate::agent::AgentParts::new(kernel, dir.join("state"))
        })
        .await
        .expect("agent starts");
        agent
    }

    async fn read_response(stream: &mut UnixStream) -> Response {
        let mut line = Vec::new();
        stream.read_to_end(&mut line).await.expect("read response");
        rpc::decode_response(line.trim_ascii_end()).expect("a framed response")
    }

    /// A rolling update's SIGTERM while a request is still being sent: it is answered, not reset.
    #[tokio::test]
    async fn a_stopping_server_answers_the_request_it_took() {
        let tmp = tempfile::tempdir().expect("tmp");
        let socket = tmp.path().join("run/agent.sock");
        let listener = bind(&socket).expect("bind");
        let agent = agent(tmp.path()).await;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, agent, socket.clone(), async move {
            let _ = stop_rx.await;
        }));
        // Taken: half a request line, sent before the stop.
        let line = status_line();
        let mut taken = UnixStream::connect(&socket).await.expect("connect");
        taken.write_all(&line[..10]).await.expect("half a line");
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The stop, as daemon::run does it: the path first, then the server.
        std::fs::remove_file(&socket).expect("unlink");
        assert!(
            UnixStream::connect(&socket).await.is_err(),
            "no new connections"
        );
        stop_tx.send(()).expect("stop");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !server.is_finished(),
            "the server waits for the request it took"
        );
        taken
            .write_all(&line[10..])
            .await
            .expect("the rest of the line");
        let response = read_response(&mut taken).await;
        assert!(response.error.is_none(), "{response:?}");
        server.await.expect("the server stops once it has answered");
    }

    /// One that connected but was never accepted (it waits in the listen backlog) is answered
    /// too: closing the listener would reset it.
    #[tokio::test]
    async fn a_connection_in_the_backlog_at_the_stop_is_answered() {
        let tmp = tempfile::tempdir().expect("tmp");
        let socket = tmp.path().join("run/agent.sock");
        let listener = bind(&socket).expect("bind");
        let agent = agent(tmp.path()).await;
        // Connected and sent before the server accepts anything: it sits in the backlog.
        let mut waiting = UnixStream::connect(&socket).await.expect("connect");
        waiting.write_all(&status_line()).await.expect("request");
        std::fs::remove_file(&socket).expect("unlink");
        serve(listener, agent, socket, std::future::ready(())).await;
        let response = read_response(&mut waiting).await;
        assert!(response.error.is_none(), "{response:?}");
    }

    #[tokio::test]
    async fn a_shared_directory_is_refused_not_locked_down() {
        let tmp = tempfile::tempdir().expect("tmp");
        let shared = tmp.path().join("tmp-like");
        std::fs::create_dir(&shared).expect("mkdir");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let err = bind(&shared.join("agent.sock")).expect_err("a sticky directory is refused");
        assert!(
            matches!(&err, Error::SharedSocketDir { path, mode: 0o1777 } if path == &shared),
            "{err}"
        );
        assert!(err.to_string().contains("--socket"), "{err}");
        assert_eq!(mode(&shared), 0o1777, "left as it was");
    }
}
