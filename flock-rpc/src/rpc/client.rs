//! The blocking client the shim uses: one request, one response per connection, with
//! the waits and retries of an agent that is restarting, and a [`ClientError`] for each way
//! that fails.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use flock_cni_proto::error::{CniError, ErrorCode, cause_chain};

use super::{
    DecodeError, FrameError, LineDecoder, Request, Response, decode_response, encode_line,
};

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing accepted the connection: the socket is missing, refused it,
    /// or the connect timed out. The request was not delivered.
    #[error("flock agent unreachable at {}", path.display())]
    Unreachable {
        /// The socket path.
        path: PathBuf,
        /// The connect error.
        #[source]
        source: io::Error,
    },
    /// The request could not be written (the agent closed the connection
    /// first); it was not delivered.
    #[error("sending the request to the flock agent at {}", path.display())]
    Send {
        /// The socket path.
        path: PathBuf,
        /// The write error.
        #[source]
        source: io::Error,
    },
    /// Reading the response failed or timed out.
    #[error("reading the flock agent's response from {}", path.display())]
    Receive {
        /// The socket path.
        path: PathBuf,
        /// The read error (`TimedOut`/`WouldBlock` after the read timeout).
        #[source]
        source: io::Error,
    },
    /// The response was not a complete line.
    #[error("the flock agent's response from {} is not framed", path.display())]
    Frame {
        /// The socket path.
        path: PathBuf,
        /// The framing error.
        #[source]
        source: FrameError,
    },
    /// The response line is not a valid response.
    #[error("the flock agent's response from {} is invalid", path.display())]
    Decode {
        /// The socket path.
        path: PathBuf,
        /// The decoding error.
        #[source]
        source: DecodeError,
    },
}

impl ClientError {
    /// Whether the request certainly did not reach the agent (so a DEL may
    /// be queued and retried later).
    pub fn is_undelivered(&self) -> bool {
        matches!(
            self,
            ClientError::Unreachable { .. } | ClientError::Send { .. }
        )
    }

    /// Whether the request was sent but no complete response came back: the
    /// read failed (the agent reset the connection, or the read timed out)
    /// or the connection closed before a whole line arrived. The agent may or
    /// may not have carried the request out.
    pub fn is_unanswered(&self) -> bool {
        matches!(
            self,
            ClientError::Receive { .. }
                | ClientError::Frame {
                    source: FrameError::Empty | FrameError::NoNewline { .. },
                    ..
                }
        )
    }

    /// Whether the agent may not have completed the request: it was not
    /// delivered ([`is_undelivered`](Self::is_undelivered)) or not answered
    /// ([`is_unanswered`](Self::is_unanswered)). An idempotent request (DEL)
    /// failing this way can safely be run again. `false` when the agent did
    /// answer, but with a line this side cannot read (too long, not a valid
    /// response): it finished the request, and its outcome is unknown.
    pub fn may_be_incomplete(&self) -> bool {
        self.is_undelivered() || self.is_unanswered()
    }

    /// Whether the agent could not be reached at all.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ClientError::Unreachable { .. })
    }

    /// The error with its whole `source` chain ([`cause_chain`]), for a CNI
    /// error's details.
    pub fn chain(&self) -> String {
        cause_chain(self)
    }

    /// The causes under this error ([`cause_chain`] of its source), for a CNI
    /// error's details under this error as its message.
    pub fn causes(&self) -> String {
        std::error::Error::source(self)
            .map(cause_chain)
            .unwrap_or_default()
    }

    /// This error as a CNI error with `code`: the message says what failed,
    /// the details why (the causes under it, down to the OS error), so a
    /// runtime printing `msg; details` does not print the message twice.
    pub fn to_cni(&self, code: ErrorCode) -> CniError {
        CniError::new(code, self.to_string()).with_details(self.causes())
    }
}

/// A blocking RPC client: one connection per call.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
    connect_timeout: Duration,
    read_timeout: Duration,
}

impl Client {
    /// Default connect timeout.
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    /// Default read timeout: generous, an ADD may wait for the pod watcher.
    pub const READ_TIMEOUT: Duration = Duration::from_secs(120);

    /// A client for the agent socket at `path` with the default timeouts.
    pub fn new(path: impl Into<PathBuf>) -> Client {
        Client {
            path: path.into(),
            connect_timeout: Self::CONNECT_TIMEOUT,
            read_timeout: Self::READ_TIMEOUT,
        }
    }

    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, t: Duration) -> Client {
        self.connect_timeout = t;
        self
    }

    /// Sets the read timeout (time allowed for the whole response).
    pub fn read_timeout(mut self, t: Duration) -> Client {
        self.read_timeout = t;
        self
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends `req` and waits for the response.
    pub fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let stream = self.connect().map_err(|source| ClientError::Unreachable {
            path: self.path.clone(),
            source,
        })?;
        self.call_on(stream, req)
    }

    /// Sends `req` on `stream`, a connection to the agent's socket the caller made itself
    /// (with a connect timeout of its own), and waits for the response.
    pub fn call_on(&self, mut stream: UnixStream, req: &Request) -> Result<Response, ClientError> {
        let path = || self.path.clone();
        stream
            .write_all(&encode_line(req))
            .and_then(|()| stream.flush())
            .map_err(|source| ClientError::Send {
                path: path(),
                source,
            })?;
        // One request per connection: tell the agent nothing more follows.
        // (It may already have closed its read side; that is not an error.)
        let _ = stream.shutdown(std::net::Shutdown::Write);
        stream
            .set_read_timeout(Some(self.read_timeout.max(Duration::from_millis(1))))
            .map_err(|source| ClientError::Receive {
                path: path(),
                source,
            })?;
        let mut decoder = LineDecoder::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            match decoder.next_line() {
                Ok(Some(line)) => {
                    return decode_response(&line).map_err(|source| ClientError::Decode {
                        path: path(),
                        source,
                    });
                }
                Ok(None) => {}
                Err(source) => {
                    return Err(ClientError::Frame {
                        path: path(),
                        source,
                    });
                }
            }
            match stream.read(&mut buf) {
                Ok(0) => {
                    let source = if decoder.is_empty() {
                        FrameError::Empty
                    } else {
                        decoder.finish().err().unwrap_or(FrameError::Empty)
                    };
                    return Err(ClientError::Frame {
                        path: path(),
                        source,
                    });
                }
                Ok(n) => decoder.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(ClientError::Receive {
                        path: path(),
                        source,
                    });
                }
            }
        }
    }

    /// std has no connect timeout for Unix sockets: connect on a helper
    /// thread and stop waiting after the timeout. (A caller that can set
    /// `SO_SNDTIMEO` before connecting, as flock's shim does, needs no thread:
    /// see [`call_on`](Self::call_on).)
    pub(super) fn connect(&self) -> io::Result<UnixStream> {
        let (tx, rx) = mpsc::channel();
        let path = self.path.clone();
        std::thread::Builder::new()
            .name("flock-connect".into())
            .spawn(move || {
                let _ = tx.send(UnixStream::connect(path));
            })?;
        match rx.recv_timeout(self.connect_timeout) {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect timed out after {:?}", self.connect_timeout),
            )),
        }
    }
}
