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
use tracing::{debug, warn};

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

/// Serves connections until the listener fails.
pub async fn serve(listener: UnixListener, agent: Arc<Agent>, socket: PathBuf) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let agent = agent.clone();
                tokio::spawn(async move { serve_connection(stream, agent).await });
            }
            Err(e) => {
                warn!(socket = %socket.display(), error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_connection(mut stream: UnixStream, agent: Arc<Agent>) {
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
    if let Some(tag) = tag {
        phases.mark("reply");
        agent.trace(&tag, &phases);
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
