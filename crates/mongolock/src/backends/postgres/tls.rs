//! TLS for the PostgreSQL connections: libpq's `sslmode` and `sslrootcert`, on `rustls`.
//!
//! `tokio-postgres` itself knows only `sslmode=disable|prefer|require` and refuses the other
//! TLS parameters of libpq, so the connection string is read here first: `sslmode` and
//! `sslrootcert` are taken out (and the remaining string handed to `tokio-postgres`), the
//! client-certificate parameters (`sslcert`, `sslkey`, `sslpassword`, `sslcrl`) are refused
//! with a typed error, and a `rustls` configuration is built that verifies what the mode asks:
//!
//! | `sslmode` | TLS | server certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default) | when the server offers it | not checked, unless a root certificate is given (then as `verify-ca`) |
//! | `require` | always | not checked, unless a root certificate is given (then as `verify-ca`) |
//! | `verify-ca` | always | chain to a root of `sslrootcert` |
//! | `verify-full` | always | chain to a root of `sslrootcert`, and the host name (or IP address) of the connection string in the certificate |
//!
//! As in libpq, the root certificates are `sslrootcert` (a PEM file; `system` for the
//! operating system's trusted roots), else `~/.postgresql/root.crt` when that file exists;
//! `verify-ca`/`verify-full` without either is refused. `allow` (plain first, TLS on refusal)
//! is not supported: use `prefer` or `disable`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::config::SslMode as ClientSslMode;

use crate::error::{Error, Result};

/// The connector every PostgreSQL connection of a backend uses (pooled and listening).
pub(crate) type MakeTls = tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`, as far as mongolock supports it (see
/// [`PostgresBackendBuilder::ssl_mode`](super::PostgresBackendBuilder::ssl_mode)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS when the server offers it, else plain (the default, as in libpq). The certificate
    /// is checked only when root certificates are given.
    Prefer,
    /// TLS always; the certificate is checked only when root certificates are given (then as
    /// [`VerifyCa`](Self::VerifyCa)).
    Require,
    /// TLS always; the server's certificate must chain to a given root certificate.
    VerifyCa,
    /// TLS always; the certificate must chain to a given root certificate and name the host
    /// of the connection string.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(Error::invalid_option(
                    "url",
                    "sslmode=allow (plain first, TLS only if the server insists) is not \
                     supported; use sslmode=prefer (TLS when offered) or sslmode=disable",
                ))
            }
            other => {
                return Err(Error::invalid_option(
                    "url",
                    format!(
                        "unknown sslmode {other:?}; use disable, prefer, require, verify-ca or \
                         verify-full"
                    ),
                ))
            }
        })
    }

    fn from_client(mode: ClientSslMode) -> SslMode {
        match mode {
            ClientSslMode::Disable => SslMode::Disable,
            ClientSslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        }
    }

    /// What `tokio-postgres` is told: whether TLS is off, optional or required.
    fn client_mode(self) -> ClientSslMode {
        match self {
            SslMode::Disable => ClientSslMode::Disable,
            SslMode::Prefer => ClientSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => ClientSslMode::Require,
        }
    }
}

/// Where the root certificates come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RootCert {
    /// A PEM file (one or more certificates).
    File(PathBuf),
    /// The operating system's trusted roots (`sslrootcert=system`).
    System,
}

impl RootCert {
    fn parse(value: &str) -> RootCert {
        if value == "system" {
            RootCert::System
        } else {
            RootCert::File(PathBuf::from(value))
        }
    }
}

/// The TLS parameters taken out of a connection string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsParams {
    pub(crate) mode: Option<SslMode>,
    pub(crate) root_cert: Option<RootCert>,
}

/// Client-certificate parameters of libpq that mongolock does not support.
const UNSUPPORTED: &[&str] = &["sslcert", "sslkey", "sslpassword", "sslcrl", "sslcrldir"];

fn take(params: &mut TlsParams, key: &str, value: &str) -> Result<bool> {
    match key {
        "sslmode" => params.mode = Some(SslMode::parse(value)?),
        "sslrootcert" => params.root_cert = Some(RootCert::parse(value)),
        k if UNSUPPORTED.contains(&k) => {
            return Err(Error::invalid_option(
                "url",
                format!(
                    "{k}: client certificates are not supported by the PostgreSQL backend; \
                     authenticate with a password (or configure the server's pg_hba.conf \
                     accordingly)"
                ),
            ))
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Splits the TLS parameters off a connection string (URL or `key=value` pairs): returns the
/// string `tokio-postgres` should parse and what was taken out.
pub(crate) fn split_params(url: &str) -> Result<(String, TlsParams)> {
    let mut params = TlsParams::default();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let (head, fragment) = match url.split_once('#') {
            Some((h, f)) => (h, Some(f)),
            None => (url, None),
        };
        let Some((base, query)) = head.split_once('?') else {
            return Ok((url.to_owned(), params));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (key, value) = (percent_decode(k), percent_decode(v));
            if !take(&mut params, &key, &value)? {
                kept.push(pair);
            }
        }
        let mut out = base.to_owned();
        if !kept.is_empty() {
            out.push('?');
            out.push_str(&kept.join("&"));
        }
        if let Some(f) = fragment {
            out.push('#');
            out.push_str(f);
        }
        return Ok((out, params));
    }
    let mut kept = Vec::new();
    for (key, value) in key_values(url)? {
        if !take(&mut params, &key, &value)? {
            kept.push(format!(
                "{key}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            ));
        }
    }
    Ok((kept.join(" "), params))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                // Two hex digits: at most 255.
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// libpq's `key = value` syntax: values may be single-quoted; `\` escapes the next character.
fn key_values(s: &str) -> Result<Vec<(String, String)>> {
    let bad = |why: &str| {
        Error::invalid_option("url", format!("not a PostgreSQL connection string: {why}"))
    };
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(bad(&format!("missing `=` after {key:?}")));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => return Err(bad("unterminated quoted value")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}

/// Builds the connector for `mode` (`None`: the client configuration's own `sslmode`) and sets
/// the client configuration's `sslmode` to match.
pub(crate) fn connector(
    config: &mut tokio_postgres::Config,
    mode: Option<SslMode>,
    root_cert: Option<&RootCert>,
) -> Result<MakeTls> {
    let mode = mode.unwrap_or_else(|| SslMode::from_client(config.get_ssl_mode()));
    config.ssl_mode(mode.client_mode());
    let default_root = home_root_cert();
    let roots_from = root_cert
        .cloned()
        .or_else(|| default_root.map(RootCert::File));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::invalid_option("url", format!("TLS: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, roots_from) {
        (SslMode::Disable, _) | (SslMode::Prefer | SslMode::Require, None) => {
            Arc::new(NoVerification(provider))
        }
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(Error::invalid_option(
                "url",
                "sslmode=verify-ca and verify-full need root certificates: set sslrootcert to \
                 the CA's PEM file (or sslrootcert=system for the system's trusted roots), or \
                 put it at ~/.postgresql/root.crt",
            ))
        }
        (mode, Some(source)) => {
            let roots = Arc::new(load_roots(&source)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| Error::invalid_option("url", format!("sslrootcert: {e}")))?;
            if mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeTls::new(config))
}

/// `~/.postgresql/root.crt`, when it exists (libpq's default root certificate file).
fn home_root_cert() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = Path::new(&home).join(".postgresql").join("root.crt");
    path.is_file().then_some(path)
}

fn load_roots(source: &RootCert) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    match source {
        RootCert::System => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(Error::invalid_option(
                    "url",
                    "sslrootcert=system: no trusted root certificates found on this system \
                     (install ca-certificates, or give the CA's PEM file)",
                ));
            }
        }
        RootCert::File(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| {
                    Error::invalid_option(
                        "url",
                        format!(
                            "sslrootcert {}: cannot read PEM certificates: {e}",
                            path.display()
                        ),
                    )
                })?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(Error::invalid_option(
                    "url",
                    format!(
                        "sslrootcert {}: no usable certificate in the file",
                        path.display()
                    ),
                ));
            }
        }
    }
    Ok(roots)
}

/// `sslmode=require` without root certificates: encryption without authentication, as libpq.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name in the certificate is not
/// compared with the host.
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
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            // The chain was verified before the name was compared.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The TLS error behind a client error, if the connection failed in the TLS handshake (a
/// certificate that was not accepted, a server that refused TLS under `require`).
pub(crate) fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r.to_string());
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            // io::Error::source skips the wrapped error itself.
            if let Some(r) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(r.to_string());
            }
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_tls_parameters() {
        let (rest, p) = split_params(
            "postgres://u@h:5/db?connect_timeout=2&sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@h:5/db?connect_timeout=2");
        assert_eq!(p.mode, Some(SslMode::VerifyFull));
        assert_eq!(p.root_cert, Some(RootCert::File("/tmp/ca.pem".into())));
        let (rest, p) = split_params("postgresql://u@h/db?sslmode=require").unwrap();
        assert_eq!(rest, "postgresql://u@h/db");
        assert_eq!(p.mode, Some(SslMode::Require));
        let (rest, p) = split_params("postgres://u@h/db").unwrap();
        assert_eq!(rest, "postgres://u@h/db");
        assert_eq!(p, TlsParams::default());
        assert!(split_params("postgres://h/db?sslmode=allow").is_err());
        assert!(split_params("postgres://h/db?sslmode=bogus").is_err());
        assert!(split_params("postgres://h/db?sslcert=c.pem").is_err());
    }

    #[test]
    fn key_values_lose_their_tls_parameters() {
        let (rest, p) =
            split_params(r"host=h password='a\'b c' sslmode=verify-ca sslrootcert='/a b/ca.pem'")
                .unwrap();
        assert_eq!(rest, r"host='h' password='a\'b c'");
        assert_eq!(p.mode, Some(SslMode::VerifyCa));
        assert_eq!(p.root_cert, Some(RootCert::File("/a b/ca.pem".into())));
        let config: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&b"a'b c"[..]));
        assert_eq!(
            split_params("sslrootcert=system").unwrap().1.root_cert,
            Some(RootCert::System)
        );
        assert!(split_params("host=h sslmode").is_err());
        assert!(split_params("host='h").is_err());
    }
}
