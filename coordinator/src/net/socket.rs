//! A non-blocking socket registered for readability only.
//!
//! tokio's TcpStream asks epoll for both readability and writability, and
//! with edge-triggered epoll a peer that reads what we sent produces a
//! writability event: every request to a server then woke the coordinator
//! twice (once when the server read the request, once for its answer).
//! Here writability is asked for only while a write is blocked, which is
//! what a proxy needs: writes of small messages complete at once.

use super::tls::TlsStream;
use bytes::BytesMut;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use tokio::io::unix::AsyncFd;
use tokio::io::{Interest, Ready};

/// Read at most this much per read call.
const READ_CHUNK: usize = 16 * 1024;

pub enum Inner {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
    /// A TCP socket once TLS was agreed on (net/tls.rs): a client's that
    /// asked for it, or a server's the coordinator asked.
    Tls(Box<TlsStream>),
}

impl AsRawFd for Inner {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Inner::Tcp(stream) => stream.as_raw_fd(),
            Inner::Unix(stream) => stream.as_raw_fd(),
            Inner::Tls(stream) => stream.tcp().as_raw_fd(),
        }
    }
}

impl Inner {
    fn read(&self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Inner::Tcp(stream) => (&*stream).read(buffer),
            Inner::Unix(stream) => (&*stream).read(buffer),
            Inner::Tls(stream) => stream.read(buffer),
        }
    }

    /// Plaintext a TLS session decrypted already (it may hold more than a
    /// read returned, with nothing left on the socket to wake a reader).
    fn read_buffered(&self, buffer: &mut [u8]) -> io::Result<Option<usize>> {
        match self {
            Inner::Tls(stream) => stream.read_buffered(buffer),
            _ => Ok(None),
        }
    }

    /// Sends what a TLS session holds encrypted but unsent; true when
    /// nothing is left (always, without TLS: a write sends or refuses).
    pub fn flush(&self) -> io::Result<bool> {
        match self {
            Inner::Tls(stream) => stream.flush(),
            _ => Ok(true),
        }
    }

    /// Writes what the socket takes of `data` without waiting. For TLS,
    /// taken means encrypted into the session: writers flush what is left
    /// ([`Socket`]'s and a pipe's, backend/multiplex.rs). Every send
    /// to a client and on a pooled or shared server connection goes
    /// through here (catalog connections and /metrics do not): see
    /// busy_poll.
    pub fn write(&self, data: &[u8]) -> io::Result<usize> {
        let result = match self {
            Inner::Tcp(stream) => (&*stream).write(data),
            Inner::Unix(stream) => (&*stream).write(data),
            Inner::Tls(stream) => stream.write(data),
        };
        if matches!(result, Ok(written) if written > 0) {
            super::busy_poll::sent();
        }
        result
    }
}

pub struct Socket {
    /// None only while being re-registered.
    fd: Option<AsyncFd<Inner>>,
    /// Where reads land before they are appended to the caller's buffer
    /// (allocated once, not zeroed per read).
    chunk: Box<[u8]>,
    /// Whether writability is currently part of the registration.
    writable_interest: bool,
}

impl Socket {
    /// Whether this is a Unix-domain socket (else TCP).
    pub fn is_unix(&self) -> bool {
        matches!(self.fd.as_ref().map(AsyncFd::get_ref), Some(Inner::Unix(_)))
    }

    /// Takes over a connected socket; must be called inside the runtime.
    pub fn new(inner: Inner) -> io::Result<Socket> {
        match &inner {
            Inner::Tcp(stream) => stream.set_nonblocking(true)?,
            Inner::Unix(stream) => stream.set_nonblocking(true)?,
            Inner::Tls(stream) => stream.tcp().set_nonblocking(true)?,
        }
        Ok(Socket {
            fd: Some(watch(inner, Interest::READABLE)?),
            chunk: vec![0u8; READ_CHUNK].into_boxed_slice(),
            writable_interest: false,
        })
    }

    pub fn from_tokio_tcp(stream: tokio::net::TcpStream) -> io::Result<Socket> {
        Socket::new(Inner::Tcp(stream.into_std()?))
    }

    fn fd(&self) -> io::Result<&AsyncFd<Inner>> {
        self.fd
            .as_ref()
            .ok_or_else(|| io::Error::other("socket lost during re-registration"))
    }

    /// Appends what can be read to `buffer`; 0 at end of stream.
    pub async fn read_buf(&mut self, buffer: &mut BytesMut) -> io::Result<usize> {
        loop {
            let fd = self
                .fd
                .as_ref()
                .ok_or_else(|| io::Error::other("socket lost during re-registration"))?;
            let chunk = &mut self.chunk;
            if let Some(read) = fd.get_ref().read_buffered(chunk)? {
                buffer.extend_from_slice(&chunk[..read]);
                return Ok(read);
            }
            let mut guard = fd.readable().await?;
            let tls = matches!(guard.get_inner(), Inner::Tls(_));
            match guard.get_inner().read(chunk) {
                Ok(read) => {
                    // (A TLS session may have read more records than it
                    // returned: only "would block" says it is drained.)
                    if read < chunk.len() && !tls {
                        // Drained: the next data comes with a new edge, so
                        // skip the read that would say "would block".
                        guard.clear_ready();
                    }
                    buffer.extend_from_slice(&chunk[..read]);
                    return Ok(read);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes all of `data`, waiting for room when the socket is full.
    pub async fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            match self.fd()?.get_ref().write(data) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(written) => data = &data[written..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait_writable().await?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        while !self.fd()?.get_ref().flush()? {
            self.wait_writable().await?;
        }
        if self.writable_interest {
            self.register(Interest::READABLE)?;
        }
        Ok(())
    }

    /// Writes what it can of `pending` (dropping the written part from
    /// it) and appends what can be read to `buffer`, whichever the socket
    /// allows first; returns the bytes read (0 at end of stream). With
    /// nothing pending this is [`Socket::read_buf`]. A proxy must read its
    /// peer's answers while it still writes: a peer that blocks writing
    /// its answers stops reading.
    pub async fn read_writing(
        &mut self,
        buffer: &mut BytesMut,
        pending: &mut &[u8],
    ) -> io::Result<usize> {
        loop {
            self.write_ready(pending)?;
            if pending.is_empty() && self.fd()?.get_ref().flush()? {
                if self.writable_interest {
                    self.register(Interest::READABLE)?;
                }
                return self.read_buf(buffer).await;
            }
            if !self.writable_interest {
                self.register(Interest::READABLE | Interest::WRITABLE)?;
            }
            let fd = self
                .fd
                .as_ref()
                .ok_or_else(|| io::Error::other("socket lost during re-registration"))?;
            let chunk = &mut self.chunk;
            if let Some(read) = fd.get_ref().read_buffered(chunk)? {
                buffer.extend_from_slice(&chunk[..read]);
                return Ok(read);
            }
            let mut guard = fd.ready(Interest::READABLE | Interest::WRITABLE).await?;
            let ready = guard.ready();
            if ready.is_readable() || ready.is_read_closed() {
                match guard.get_inner().read(chunk) {
                    Ok(read) => {
                        buffer.extend_from_slice(&chunk[..read]);
                        return Ok(read);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        guard.clear_ready_matching(Ready::READABLE)
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if ready.is_writable() && pending.is_empty() {
                // only encrypted records left (TLS)
                if !guard.get_inner().flush()? {
                    guard.clear_ready_matching(Ready::WRITABLE)
                }
            } else if ready.is_writable() {
                match guard.get_inner().write(pending) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(written) => *pending = &pending[written..],
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        guard.clear_ready_matching(Ready::WRITABLE)
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }

    /// Writes what the socket takes of `pending` without waiting.
    fn write_ready(&mut self, pending: &mut &[u8]) -> io::Result<()> {
        while !pending.is_empty() {
            match self.fd()?.get_ref().write(pending) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(written) => *pending = &pending[written..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn wait_writable(&mut self) -> io::Result<()> {
        if !self.writable_interest {
            self.register(Interest::READABLE | Interest::WRITABLE)?;
        }
        let mut guard = self.fd()?.writable().await?;
        guard.clear_ready();
        Ok(())
    }

    /// A second descriptor of the same socket (for a writer that runs
    /// beside a reader).
    pub fn try_clone_inner(&self) -> io::Result<Inner> {
        Ok(match self.fd()?.get_ref() {
            Inner::Tcp(stream) => Inner::Tcp(stream.try_clone()?),
            Inner::Unix(stream) => Inner::Unix(stream.try_clone()?),
            Inner::Tls(stream) => Inner::Tls(Box::new(stream.try_clone()?)),
        })
    }

    /// Turns this TCP socket into a TLS session (after SSLRequest was
    /// answered 'S') made by `session` — a client's (net/tls.rs) or a
    /// server's (net/tls_client.rs) — and shakes hands.
    pub async fn start_tls(
        &mut self,
        session: impl FnOnce(std::net::TcpStream) -> io::Result<TlsStream>,
    ) -> io::Result<()> {
        let fd = self
            .fd
            .take()
            .ok_or_else(|| io::Error::other("socket lost during re-registration"))?;
        let Inner::Tcp(tcp) = fd.into_inner() else {
            return Err(io::Error::other("TLS is only for TCP connections"));
        };
        self.fd = Some(watch(
            Inner::Tls(Box::new(session(tcp)?)),
            Interest::READABLE,
        )?);
        self.writable_interest = false;
        loop {
            let Inner::Tls(stream) = self.fd()?.get_ref() else {
                return Err(io::Error::other("TLS session lost"));
            };
            if !stream.flush()? {
                self.wait_writable().await?;
                continue;
            }
            if !stream.is_handshaking()? {
                break;
            }
            let mut guard = self.fd()?.readable().await?;
            let Inner::Tls(stream) = guard.get_inner() else {
                return Err(io::Error::other("TLS session lost"));
            };
            match stream.handshake_step() {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.writable_interest {
            self.register(Interest::READABLE)?;
        }
        Ok(())
    }

    /// Whether a TLS session runs here.
    pub fn is_tls(&self) -> bool {
        matches!(self.fd.as_ref().map(AsyncFd::get_ref), Some(Inner::Tls(_)))
    }

    /// Whether a TLS session runs here, and the server's binding data when
    /// this is the client side (SCRAM-SHA-256-PLUS).
    pub fn tls_binding(&self) -> Option<Option<Vec<u8>>> {
        match self.fd.as_ref().map(AsyncFd::get_ref) {
            Some(Inner::Tls(stream)) => Some(stream.peer_end_point()),
            _ => None,
        }
    }

    /// The TLS protocol and cipher of the session (None: plain).
    pub fn tls_description(&self) -> Option<String> {
        match self.fd.as_ref().map(AsyncFd::get_ref) {
            Some(Inner::Tls(stream)) => Some(stream.describe()),
            _ => None,
        }
    }

    fn register(&mut self, interest: Interest) -> io::Result<()> {
        let fd = self
            .fd
            .take()
            .ok_or_else(|| io::Error::other("socket lost during re-registration"))?;
        let inner = fd.into_inner();
        self.fd = Some(watch(inner, interest)?);
        self.writable_interest = interest.is_writable();
        Ok(())
    }
}

/// Registers the socket with the runtime's reactor.
pub fn watch(inner: Inner, interest: Interest) -> io::Result<AsyncFd<Inner>> {
    // SAFETY: `inner` owns its socket, so the descriptor stays open and
    // refers to the same socket until the AsyncFd is dropped or gives the
    // socket back with into_inner; as_raw_fd always returns that descriptor.
    unsafe { AsyncFd::register_with_interest(inner, interest) }.map_err(|e| e.into_parts().1)
}
