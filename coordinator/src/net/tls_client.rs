//! TLS with the nodes: the client side of the coordinator's connections to
//! PostgreSQL servers, checked as libpq's `sslmode` says
//! (`server_tls_sslmode`, named as PgBouncer names it).

use super::tls::{load_key_pair, provider, TlsError, TlsStream};
use crate::config::ServerTlsMode;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct};
use rustls::{RootCertStore, SignatureScheme};
use std::io;
use std::path::Path;
use std::sync::Arc;

/// How the coordinator opens TLS sessions with servers.
#[derive(Clone)]
pub struct TlsConnector {
    mode: ServerTlsMode,
    config: Arc<ClientConfig>,
    /// The same without the client certificate, for logins relayed for a
    /// client (the server must authenticate the client, not the
    /// coordinator). The same as `config` when there is no certificate.
    anonymous: Arc<ClientConfig>,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsConnector({})", self.mode.name())
    }
}

impl TlsConnector {
    /// The connector for `mode` (None for `disable`): `ca_file` holds the
    /// certificates servers' chains must lead to (verify-ca, verify-full;
    /// with `require`, as libpq does when a root certificate is there), and
    /// `client_pair` a certificate and key to show servers that ask.
    pub fn new(
        mode: ServerTlsMode,
        ca_file: Option<&Path>,
        client_pair: Option<(&Path, &Path)>,
    ) -> Result<Option<TlsConnector>, TlsError> {
        if mode == ServerTlsMode::Disable {
            return Ok(None);
        }
        let provider = provider();
        let verifier: Arc<dyn ServerCertVerifier> = match (mode, ca_file) {
            (ServerTlsMode::Prefer, _) | (ServerTlsMode::Require, None) => {
                Arc::new(AnyCertificate(provider.clone()))
            }
            (_, None) => return Err(TlsError::NoAuthority(mode.name())),
            (_, Some(file)) => {
                let roots = load_roots(file)?;
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| TlsError::Authority(file.into(), e.to_string()))?;
                if mode == ServerTlsMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(ChainOnly(webpki))
                }
            }
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Mismatch(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let anonymous = Arc::new(builder.clone().with_no_client_auth());
        let config = match client_pair {
            Some((certificate, key)) => {
                let (chain, key) = load_key_pair(certificate, key)?;
                Arc::new(
                    builder
                        .with_client_auth_cert(chain, key)
                        .map_err(|e| TlsError::ClientCertificate(e.to_string()))?,
                )
            }
            None => anonymous.clone(),
        };
        Ok(Some(TlsConnector {
            mode,
            config,
            anonymous,
        }))
    }

    pub fn mode(&self) -> ServerTlsMode {
        self.mode
    }

    /// The rustls settings (the catalog connections' TLS uses them too).
    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }

    /// A TLS session, not yet shaken hands, with the server `host` over
    /// `tcp` (after the server answered SSLRequest with 'S'), showing the
    /// client certificate (if any) when `identify`.
    pub fn connect(
        &self,
        tcp: std::net::TcpStream,
        host: &str,
        identify: bool,
    ) -> io::Result<TlsStream> {
        let config = if identify {
            self.config.clone()
        } else {
            self.anonymous.clone()
        };
        let session =
            ClientConnection::new(config, server_name(host)?).map_err(io::Error::other)?;
        Ok(TlsStream::new(tcp, session.into()))
    }
}

/// The name a server's certificate must carry: its host name or address.
pub fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    ServerName::try_from(host.to_owned()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host:?} is no host name for TLS: {e}"),
        )
    })
}

fn load_roots(file: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(file)
        .map_err(|e| TlsError::Authority(file.into(), e.to_string()))?
    {
        let certificate =
            certificate.map_err(|e| TlsError::Authority(file.into(), e.to_string()))?;
        roots
            .add(certificate)
            .map_err(|e| TlsError::Authority(file.into(), e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCertificate(file.into()));
    }
    Ok(Arc::new(roots))
}

/// `prefer` and `require`: any certificate (the session is encrypted, the
/// server not authenticated), as libpq does. The handshake's signatures
/// are still checked against the certificate's key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            certificate,
            signature,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            certificate,
            signature,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to the CA file's certificates; the
/// name in the certificate is not compared with the server's.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the name only once the chain is good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .verify_tls12_signature(message, certificate, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .verify_tls13_signature(message, certificate, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifying_needs_a_ca_file() {
        for mode in [ServerTlsMode::VerifyCa, ServerTlsMode::VerifyFull] {
            let error = TlsConnector::new(mode, None, None)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(error.contains("server_tls_ca_file"), "{error}");
        }
    }

    #[test]
    fn prefer_and_require_need_no_ca_file() {
        for mode in [ServerTlsMode::Prefer, ServerTlsMode::Require] {
            assert!(matches!(TlsConnector::new(mode, None, None), Ok(Some(_))));
        }
        assert!(matches!(
            TlsConnector::new(ServerTlsMode::Disable, None, None),
            Ok(None)
        ));
    }

    #[test]
    fn addresses_and_names_are_server_names() {
        assert!(server_name("127.0.0.1").is_ok());
        assert!(server_name("db1.example.com").is_ok());
        assert!(server_name("not a name").is_err());
    }
}
