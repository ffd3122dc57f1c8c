//! TLS for the catalog connections (tokio-postgres, backend/map_load.rs):
//! the same rustls settings as the coordinator's own server connections
//! (`server_tls_sslmode`), through tokio-rustls.

use crate::net::channel_binding;
use crate::net::tls_client::{server_name, TlsConnector};
use rustls::ClientConfig;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_postgres::Socket;

/// What tokio-postgres is given to make its TLS sessions with.
#[derive(Clone)]
pub struct CatalogTls {
    config: Option<Arc<ClientConfig>>,
}

impl CatalogTls {
    pub fn new(connector: Option<&TlsConnector>) -> CatalogTls {
        CatalogTls {
            config: connector.map(TlsConnector::config),
        }
    }
}

impl MakeTlsConnect<Socket> for CatalogTls {
    type Stream = CatalogTlsStream;
    type TlsConnect = CatalogTlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> io::Result<CatalogTlsConnect> {
        Ok(CatalogTlsConnect {
            config: self.config.clone(),
            host: host.to_owned(),
        })
    }
}

pub struct CatalogTlsConnect {
    config: Option<Arc<ClientConfig>>,
    host: String,
}

impl TlsConnect<Socket> for CatalogTlsConnect {
    type Stream = CatalogTlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<CatalogTlsStream>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            // (tokio-postgres asks only with an sslmode other than disable,
            // which it gets only when there are settings.)
            let config = self
                .config
                .ok_or_else(|| io::Error::other("TLS with servers is off"))?;
            let name = server_name(&self.host)?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await?;
            Ok(CatalogTlsStream(stream))
        })
    }
}

pub struct CatalogTlsStream(tokio_rustls::client::TlsStream<Socket>);

impl TlsStream for CatalogTlsStream {
    /// SCRAM-SHA-256-PLUS with the server's certificate when it can be
    /// hashed (RFC 5929's tls-server-end-point, as PostgreSQL offers it).
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.0.get_ref();
        session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|certificate| channel_binding::tls_server_end_point(certificate))
            .map(ChannelBinding::tls_server_end_point)
            .unwrap_or_else(ChannelBinding::none)
    }
}

impl AsyncRead for CatalogTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(context, buffer)
    }
}

impl AsyncWrite for CatalogTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(context, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(context)
    }
}
