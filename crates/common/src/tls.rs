//! TLS for both directions, with rustls and the ring provider (no OpenSSL):
//!
//! - [`ServerTls`]: a listener's certificate and key (PEM files), re-read on demand
//!   (SIGHUP) without touching established connections; ALPN `h2` and `http/1.1`.
//! - [`client_config`]: what the gateway trusts upstream: the system roots, the webpki
//!   roots, and an optional extra CA bundle. Certificates are always verified; there
//!   is deliberately no way to turn that off.
//! - [`webpki_client`]: an HTTP client for the authorization server's endpoints (JWK
//!   Sets, token exchange): the webpki roots, certificates always verified.
//! - [`TlsFailure`]: why a handshake with the upstream failed, found in an error's
//!   source chain, so logs and legacy hosts get a cause ("unknown issuer", "name
//!   mismatch", "expired") instead of "connection error".

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

// The throw-away CA (rcgen) is the `tls` feature's; its old path stays.
#[cfg(feature = "tls")]
pub use crate::throwaway_ca::{ThrowawayCa, Validity};

/// Errors loading TLS material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("cannot read {what} from {path}: {detail}")]
    Pem {
        /// What was expected (certificate chain, private key, CA bundle).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The certificate and key do not belong together, or rustls refused them.
    #[error("unusable certificate {cert} / key {key}: {detail}")]
    Unusable {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        detail: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration refused: {0}")]
    Config(#[from] rustls::Error),
}

/// An HTTP/1.1 client for an authorization server's endpoints (the modern server's
/// `jwks_uri`, the gateway's token exchange): TLS with the webpki roots, certificates
/// always verified; plain http only where the caller allowed it (loopback).
pub fn webpki_client<B>() -> hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    B,
>
where
    B: hyper::body::Body + Send,
    B::Data: Send,
{
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .build();
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(connector)
}

/// The crypto provider every TLS configuration here uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |detail: String| TlsError::Pem {
        what,
        path: path.to_owned(),
        detail,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem("no CERTIFICATE block in the file".into()));
    }
    Ok(certs)
}

fn load_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = read_certs(cert, "certificate chain")?;
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
        what: "private key",
        path: key.to_owned(),
        detail: e.to_string(),
    })?;
    let certified =
        CertifiedKey::from_der(chain, private, &provider()).map_err(|e| TlsError::Unusable {
            cert: cert.to_owned(),
            key: key.to_owned(),
            detail: e.to_string(),
        })?;
    Ok(Arc::new(certified))
}

/// A listener's certificate: the PEM files and what was last loaded from them.
#[derive(Debug)]
pub struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    resolver: Arc<Resolver>,
    config: Arc<rustls::ServerConfig>,
}

#[derive(Debug)]
struct Resolver(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().ok().map(|k| k.clone())
    }
}

impl ServerTls {
    /// Loads `cert` (the chain, leaf first) and `key` (PKCS#8, PKCS#1 or SEC1).
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let resolver = Arc::new(Resolver(RwLock::new(load_key(cert, key)?)));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            resolver,
            config: Arc::new(config),
        })
    }

    /// Re-reads both files; on success new handshakes use the new certificate, and
    /// connections already established keep theirs. On failure the old one stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = load_key(&self.cert, &self.key)?;
        if let Ok(mut current) = self.resolver.0.write() {
            *current = fresh;
        }
        Ok(())
    }

    /// The certificate file.
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// The acceptor for new connections.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }
}

/// The client configuration for HTTPS upstreams: system roots (when the system has
/// any) plus the webpki roots, plus every certificate of `extra_ca` (a PEM bundle).
/// ALPN is set by the connector that uses it.
pub fn client_config(extra_ca: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(error = %e, "a system certificate could not be loaded");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(added, ignored, "system root certificates loaded");
    if let Some(path) = extra_ca {
        for cert in read_certs(path, "CA bundle")? {
            roots.add(cert).map_err(|e| TlsError::Pem {
                what: "CA bundle",
                path: path.to_owned(),
                detail: e.to_string(),
            })?;
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Why a TLS connection to the upstream failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The certificate does not chain to a trusted root (wrong or missing CA).
    UnknownIssuer,
    /// The certificate is not valid for the host name in the URL.
    NameMismatch,
    /// The certificate has expired.
    Expired,
    /// The certificate is not valid yet.
    NotYetValid,
    /// The certificate was revoked.
    Revoked,
    /// Any other reason the certificate was refused.
    BadCertificate,
    /// The handshake itself failed (an alert, no common protocol, not TLS at all).
    Handshake,
}

impl TlsFailure {
    /// A machine-readable name, used as `data.reason` for legacy hosts.
    pub fn kind(self) -> &'static str {
        match self {
            Self::UnknownIssuer => "tlsUnknownIssuer",
            Self::NameMismatch => "tlsNameMismatch",
            Self::Expired => "tlsCertificateExpired",
            Self::NotYetValid => "tlsCertificateNotYetValid",
            Self::Revoked => "tlsCertificateRevoked",
            Self::BadCertificate => "tlsBadCertificate",
            Self::Handshake => "tlsHandshakeFailed",
        }
    }

    /// Finds a rustls error in `err`'s source chain and names its cause.
    pub fn find(err: &(dyn std::error::Error + 'static)) -> Option<(Self, String)> {
        let mut next = Some(err);
        while let Some(e) = next {
            // `io::Error::source` skips the error it wraps: look inside explicitly.
            let inner = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .map(|i| i as &(dyn std::error::Error + 'static));
            if let Some(r) = e.downcast_ref::<rustls::Error>() {
                return Some((Self::of(r), r.to_string()));
            }
            // hyper-rustls wraps tokio-rustls's `io::Error` in another one.
            next = inner.or_else(|| e.source());
        }
        None
    }

    fn of(e: &rustls::Error) -> Self {
        use rustls::CertificateError as C;
        match e {
            rustls::Error::InvalidCertificate(c) => match c {
                C::UnknownIssuer => Self::UnknownIssuer,
                C::NotValidForName | C::NotValidForNameContext { .. } => Self::NameMismatch,
                C::Expired | C::ExpiredContext { .. } => Self::Expired,
                C::NotValidYet | C::NotValidYetContext { .. } => Self::NotYetValid,
                C::Revoked => Self::Revoked,
                _ => Self::BadCertificate,
            },
            _ => Self::Handshake,
        }
    }
}

impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::UnknownIssuer => {
                "certificate signed by an unknown issuer (give its CA with --upstream-ca)"
            }
            Self::NameMismatch => "certificate not valid for the upstream's host name",
            Self::Expired => "certificate expired",
            Self::NotYetValid => "certificate not valid yet",
            Self::Revoked => "certificate revoked",
            Self::BadCertificate => "certificate refused",
            Self::Handshake => "TLS handshake failed",
        })
    }
}

/// Re-reads every listener certificate on SIGHUP, for the life of the runtime. A
/// reload that fails is logged and the previous certificate stays in use.
pub fn reload_on_sighup(listeners: Vec<Arc<ServerTls>>) {
    if listeners.is_empty() {
        return;
    }
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot install the SIGHUP handler; certificates will not be reloaded");
            return;
        };
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                for tls in &listeners {
                    match tls.reload() {
                        Ok(()) => {
                            tracing::info!(cert = %tls.cert_path().display(), "TLS certificate reloaded")
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "TLS certificate reload failed; the previous certificate stays in use")
                        }
                    }
                }
            }
        });
    }
}
