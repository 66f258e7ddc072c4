//! TLS to the shards: libpq-style `sslmode`s on rustls.
//!
//! Every pool uses the same connector type, [`MakeRustlsConnect`], so that
//! `Shard` has one concrete pool type whatever the mode; `disable` is carried
//! by tokio-postgres's own `SslMode::Disable`, which never calls the connector.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// How a shard connection is protected, as libpq's `sslmode`.
#[derive(Clone, Default)]
pub enum TlsMode {
    /// Plain TCP.
    #[default]
    Disable,
    /// Encrypted, but the server's certificate is not checked: protects against
    /// eavesdroppers, not against an active man in the middle.
    Require,
    /// Encrypted; the certificate chain must lead to `roots` and name the host
    /// the shard is addressed by.
    VerifyFull(CaRoots),
}

impl TlsMode {
    /// The name used in `shards.toml` (`disable`, `require`, `verify-full`).
    pub fn name(&self) -> &'static str {
        match self {
            TlsMode::Disable => "disable",
            TlsMode::Require => "require",
            TlsMode::VerifyFull(_) => "verify-full",
        }
    }

    /// What tokio-postgres must do before the startup message.
    pub fn pg_ssl_mode(&self) -> SslMode {
        match self {
            TlsMode::Disable => SslMode::Disable,
            TlsMode::Require | TlsMode::VerifyFull(_) => SslMode::Require,
        }
    }
}

impl std::fmt::Debug for TlsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsMode::VerifyFull(roots) => f.debug_tuple("VerifyFull").field(roots).finish(),
            other => f.write_str(other.name()),
        }
    }
}

/// Trusted CA certificates read from a `sslrootcert` file.
#[derive(Clone)]
pub struct CaRoots {
    path: PathBuf,
    store: Arc<RootCertStore>,
}

impl std::fmt::Debug for CaRoots {
    // The store itself is pages of DER bytes; the file and count say enough.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaRoots")
            .field("path", &self.path)
            .field("certificates", &self.store.len())
            .finish()
    }
}

impl CaRoots {
    /// Reads every PEM certificate in `path`.
    ///
    /// # Errors
    ///
    /// [`TlsError`] when the file cannot be read, holds no certificate, or
    /// holds one that is not a valid CA certificate.
    pub fn from_pem_file(path: &Path) -> Result<CaRoots, TlsError> {
        let pem = std::fs::read(path).map_err(TlsError::Read)?;
        let mut store = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            store
                .add(cert.map_err(TlsError::Pem)?)
                .map_err(TlsError::Certificate)?;
        }
        if store.is_empty() {
            return Err(TlsError::NoCertificate);
        }
        Ok(CaRoots {
            path: path.to_path_buf(),
            store: Arc::new(store),
        })
    }

    /// The file the certificates came from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Why TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA file cannot be read.
    #[error("cannot read the file")]
    Read(#[source] std::io::Error),
    /// The CA file is not PEM.
    #[error("not a PEM file")]
    Pem(#[source] rustls::pki_types::pem::Error),
    /// The CA file holds no `BEGIN CERTIFICATE` section.
    #[error("holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate,
    /// A certificate in the CA file cannot be a trust anchor.
    #[error("holds a certificate that cannot be used as a CA")]
    Certificate(#[source] rustls::Error),
    /// rustls refused the client settings.
    #[error("cannot build the TLS client settings")]
    Client(#[source] rustls::Error),
}

// The connector is shardq's own (a shard's pools); opened to this workspace's
// tools by the `internal` feature (see `lib.rs`).
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use connect::connector;
#[cfg(not(feature = "internal"))]
pub(crate) use connect::connector;

#[cfg_attr(not(feature = "internal"), allow(unreachable_pub))]
mod connect {
    use super::*;

    /// The connector for a shard in `mode`.
    ///
    /// # Errors
    ///
    /// [`TlsError::Client`] when rustls refuses the settings (it does not with
    /// its own provider; kept so that a future change cannot panic here).
    pub fn connector(mode: &TlsMode) -> Result<MakeRustlsConnect, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Client)?;
        let config = match mode {
            // Never used (tokio-postgres skips TLS), but should that change it
            // fails closed: no certificate verifies against an empty store.
            TlsMode::Disable => builder
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth(),
            TlsMode::Require => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyServerCert { provider }))
                .with_no_client_auth(),
            TlsMode::VerifyFull(roots) => builder
                .with_root_certificates(roots.store.clone())
                .with_no_client_auth(),
        };
        Ok(MakeRustlsConnect::new(config))
    }
}

/// libpq's `sslmode=require`: any certificate is accepted (without a root
/// file libpq checks neither chain nor name either). The handshake signatures
/// are still checked, so the server must hold the key of the certificate it
/// shows, which keeps SCRAM channel binding meaningful.
#[derive(Debug)]
struct AnyServerCert {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AnyServerCert {
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
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_builds_a_connector() {
        for mode in [TlsMode::Disable, TlsMode::Require] {
            connector(&mode).unwrap();
        }
    }

    #[test]
    fn a_file_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("shardq-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("empty.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let err = CaRoots::from_pem_file(&path).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate), "{err:?}");
        let err = CaRoots::from_pem_file(&dir.join("missing.pem")).unwrap_err();
        assert!(matches!(err, TlsError::Read(_)), "{err:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn modes_map_onto_tokio_postgres() {
        assert_eq!(TlsMode::Disable.pg_ssl_mode(), SslMode::Disable);
        assert_eq!(TlsMode::Require.pg_ssl_mode(), SslMode::Require);
        assert_eq!(format!("{:?}", TlsMode::Require), "require");
    }
}
