//! TLS sessions over the coordinator's non-blocking TCP sockets: the
//! server side with clients ([`TlsAcceptor`]), the client side with the
//! nodes (net/tls_client.rs). rustls does no I/O of its own; [`TlsStream`]
//! feeds it what the socket has and sends what it produces, from the
//! socket's reads and writes (net/socket.rs), so a TLS connection goes
//! through the same event loop as a plain one.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{Connection, ServerConfig, ServerConnection};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the TLS certificate file {0}: {1}")]
    Certificate(PathBuf, String),
    #[error("the TLS certificate file {0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("cannot read the TLS key file {0}: {1}")]
    Key(PathBuf, String),
    #[error("the TLS certificate and key do not go together: {0}")]
    Mismatch(String),
    #[error("the client certificate for the nodes (server_tls_cert_file, server_tls_key_file) cannot be used: {0}")]
    ClientCertificate(String),
    #[error("cannot read the TLS CA file {0}: {1}")]
    Authority(PathBuf, String),
    #[error("server_tls_sslmode = {0} needs server_tls_ca_file (the certificates that sign the nodes' certificates)")]
    NoAuthority(&'static str),
}

/// Loads a PEM certificate chain (the holder's certificate first) and its
/// PEM private key (PKCS#8, PKCS#1 or SEC1).
pub(super) fn load_key_pair(
    certificate_file: &Path,
    key_file: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(certificate_file)
        .map_err(|e| TlsError::Certificate(certificate_file.into(), e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Certificate(certificate_file.into(), e.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(certificate_file.into()));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| TlsError::Key(key_file.into(), e.to_string()))?;
    Ok((chain, key))
}

/// The cryptography: ring rather than aws-lc-rs (which needs cmake and a
/// long C build); rustls 0.23.48 deprecates ring's provider for lacking
/// post-quantum key exchange, which PostgreSQL does not ask for yet.
pub(super) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What accepts TLS from clients: the certificate chain and key, loaded
/// once at start.
#[derive(Clone)]
pub struct TlsAcceptor {
    config: Arc<ServerConfig>,
    /// SCRAM-SHA-256-PLUS's binding data for this certificate (None when
    /// its signature's hash is not one to bind with).
    end_point: Option<Arc<[u8]>>,
}

impl TlsAcceptor {
    /// Loads a PEM certificate chain (server certificate first) and its PEM
    /// private key (PKCS#8, PKCS#1 or SEC1).
    pub fn load(certificate_file: &Path, key_file: &Path) -> Result<TlsAcceptor, TlsError> {
        let (chain, key) = load_key_pair(certificate_file, key_file)?;
        let end_point = super::channel_binding::tls_server_end_point(&chain[0]).map(Arc::from);
        let config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Mismatch(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Mismatch(e.to_string()))?;
        Ok(TlsAcceptor {
            config: Arc::new(config),
            end_point,
        })
    }

    /// The `tls-server-end-point` of the certificate (SCRAM channel binding).
    pub fn end_point(&self) -> Option<&[u8]> {
        self.end_point.as_deref()
    }

    /// A TLS session, not yet shaken hands, over `tcp`.
    pub fn accept(&self, tcp: std::net::TcpStream) -> io::Result<TlsStream> {
        let session = ServerConnection::new(self.config.clone()).map_err(io::Error::other)?;
        Ok(TlsStream::new(tcp, session.into()))
    }
}

/// A TCP socket carrying a TLS session. Reads and writes never wait: they
/// say `WouldBlock` as the socket would, and the caller waits for it.
pub struct TlsStream {
    tcp: std::net::TcpStream,
    /// Shared by the descriptors of one connection ([`TlsStream::try_clone`]:
    /// a pipe's writer beside its reader), so that their records go out in
    /// the session's order; the lock is held for one read or write only.
    /// None only while dropped.
    session: Option<Arc<Mutex<Connection>>>,
}

impl TlsStream {
    pub(super) fn new(tcp: std::net::TcpStream, session: Connection) -> TlsStream {
        TlsStream {
            tcp,
            session: Some(Arc::new(Mutex::new(session))),
        }
    }

    pub fn tcp(&self) -> &std::net::TcpStream {
        &self.tcp
    }

    /// A second descriptor of the socket in the same session, for a writer
    /// beside a reader. The writer only ever sends: what the session
    /// receives is read by the reader alone.
    pub fn try_clone(&self) -> io::Result<TlsStream> {
        Ok(TlsStream {
            tcp: self.tcp.try_clone()?,
            session: self.session.clone(),
        })
    }

    fn session(&self) -> io::Result<MutexGuard<'_, Connection>> {
        self.session
            .as_ref()
            .ok_or_else(|| io::Error::other("TLS session closed"))?
            .lock()
            .map_err(|_| io::Error::other("TLS session poisoned"))
    }

    /// Plaintext already decrypted, without touching the socket: `None`
    /// when there is none (the socket must be read), `Some(0)` when the
    /// client closed the session.
    pub fn read_buffered(&self, buffer: &mut [u8]) -> io::Result<Option<usize>> {
        match self.session()?.reader().read(buffer) {
            Ok(read) => Ok(Some(read)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            // the client closed the socket without close_notify: the end,
            // as a plain socket's 0
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(Some(0)),
            Err(e) => Err(e),
        }
    }

    /// Reads plaintext: what is decrypted already, else what the socket
    /// has; 0 at the end of the session.
    pub fn read(&self, buffer: &mut [u8]) -> io::Result<usize> {
        let mut session = self.session()?;
        loop {
            match session.reader().read(buffer) {
                Ok(read) => return Ok(read),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if self.receive(&mut session)? == 0 {
                return Ok(0);
            }
        }
    }

    /// Reads TLS records from the socket into the session and answers
    /// what the handshake asks; 0 at the end of the stream.
    fn receive(&self, session: &mut Connection) -> io::Result<usize> {
        let received = session.read_tls(&mut &self.tcp)?;
        if received == 0 {
            return Ok(0);
        }
        if let Err(e) = session.process_new_packets() {
            // rustls queued an alert saying why: send it, then give up.
            let _ = self.send(session);
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        // Answers of the session's own (and records a writer left): a
        // socket that cannot take them now fails the next write, not this
        // read, whose plaintext (a server's parting error) is good.
        let _ = self.send(session);
        Ok(received)
    }

    /// Takes `data` into the session (encrypted, sent as far as the socket
    /// allows): what was taken, or `WouldBlock` while earlier records still
    /// wait for room (then [`TlsStream::flush`] must finish them).
    pub fn write(&self, data: &[u8]) -> io::Result<usize> {
        let mut session = self.session()?;
        if !self.send(&mut session)? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let taken = session.writer().write(data)?;
        self.send(&mut session)?;
        Ok(taken)
    }

    /// Sends records waiting in the session; true when none is left.
    pub fn flush(&self) -> io::Result<bool> {
        let mut session = self.session()?;
        self.send(&mut session)
    }

    fn send(&self, session: &mut Connection) -> io::Result<bool> {
        while session.wants_write() {
            match session.write_tls(&mut &self.tcp) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// One step of the handshake: reads what the socket has and answers;
    /// `WouldBlock` when it must wait for the client, 0 when it left.
    pub fn handshake_step(&self) -> io::Result<usize> {
        let mut session = self.session()?;
        self.receive(&mut session)
    }

    pub fn is_handshaking(&self) -> io::Result<bool> {
        Ok(self.session()?.is_handshaking())
    }

    /// The server's `tls-server-end-point` (SCRAM channel binding), on
    /// the client side once shaken hands.
    pub fn peer_end_point(&self) -> Option<Vec<u8>> {
        let session = self.session().ok()?;
        let certificate = session.peer_certificates()?.first()?;
        super::channel_binding::tls_server_end_point(certificate)
    }

    /// The protocol and cipher, as SHOW CLIENTS shows them
    /// (`TLSv1.3/TLS13_AES_256_GCM_SHA384`).
    pub fn describe(&self) -> String {
        let Ok(session) = self.session() else {
            return String::new();
        };
        let version = match session.protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".to_string(),
            Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".to_string(),
            Some(other) => format!("{other:?}"),
            None => "TLS".to_string(),
        };
        match session.negotiated_cipher_suite() {
            Some(suite) => format!("{version}/{:?}", suite.suite()),
            None => version,
        }
    }
}

impl Drop for TlsStream {
    /// Says goodbye as PostgreSQL does (`SSL_shutdown`): a close_notify
    /// alert, sent if the socket takes it now (never waiting), so that the
    /// peer sees the session end rather than a truncated stream. Only the
    /// last descriptor of a session says it: a pipe's writer going first
    /// must not end the reader's session.
    fn drop(&mut self) {
        // (into_inner is Some for exactly one of the handles dropped, even
        // when two are dropped at once)
        let Some(session) = self.session.take().and_then(Arc::into_inner) else {
            return;
        };
        if let Ok(mut session) = session.into_inner() {
            session.send_close_notify();
            let _ = self.send(&mut session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_say_which() {
        let error = TlsAcceptor::load(
            Path::new("/nonexistent/server.crt"),
            Path::new("/nonexistent/server.key"),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            error.contains("/nonexistent/server.crt"),
            "unexpected error: {error}"
        );
    }

    #[test]
    fn a_file_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("pg_shard_tls_test_{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").ok();
        let error = TlsAcceptor::load(&empty, &empty)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        std::fs::remove_dir_all(&dir).ok();
        assert!(
            error.contains("holds no certificate"),
            "unexpected error: {error}"
        );
    }
}
