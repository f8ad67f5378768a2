//! Optional TLS: a CA and a server certificate (for `localhost`, `127.0.0.1` and the bound IP)
//! generated at start, so kubeconfigs carry the CA and clients verify the server as usual.

use axum::serve::Listener;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating certificates: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("configuring TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The generated CA (for clients) and the server's TLS configuration.
pub struct TlsMaterial {
    /// PEM of the CA certificate, as `certificate-authority-data` carries it (before base64).
    pub ca_pem: String,
    /// DER of the CA certificate (for `kube::Config::root_cert`).
    pub ca_der: Vec<u8>,
    acceptor: TlsAcceptor,
}

impl TlsMaterial {
    /// A fresh CA and a server certificate valid for `localhost`, `127.0.0.1` and `ip`.
    pub fn generate(ip: IpAddr) -> Result<Self, TlsError> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "kube-sim CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca_params.self_signed(&ca_key)?;

        let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
            names.push(ip.to_string());
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-sim");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let cert = params.signed_by(&key, &ca, &ca_key)?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone(), ca.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )?;
        // The server speaks HTTP/1.1 only.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            ca_pem: ca.pem(),
            ca_der: ca.der().to_vec(),
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    pub fn listener(&self, tcp: TcpListener) -> TlsListener {
        TlsListener {
            tcp,
            acceptor: self.acceptor.clone(),
        }
    }
}

/// A TCP listener that completes the TLS handshake before handing connections to the server.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (tcp, addr) = match self.tcp.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            // As for plain TCP (server.rs): no Nagle delay on watch events and small replies.
            let _ = tcp.set_nodelay(true);
            // A client that never finishes its handshake must not stall the accept loop for long.
            match tokio::time::timeout(Duration::from_secs(5), self.acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => return (stream, addr),
                Ok(Err(e)) => tracing::debug!(error = %e, %addr, "TLS handshake failed"),
                Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
