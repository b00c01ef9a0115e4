//! PostgreSQL over TLS: what a store URL's `sslmode` and `sslrootcert` mean
//! (libpq's rules, research/contract.md, "Durable sessions", "PostgreSQL
//! over TLS"), and a failed TLS check told in words that name the check.
//!
//! `sqlx` reads both parameters itself and does the handshake (rustls); this
//! module checks them before a connection is tried, adds the libpq rules
//! `sqlx` leaves out (`require` with a root verifies the chain,
//! `sslrootcert=system`), and turns rustls' error into a sentence. Pure but
//! for reading the root file at open.

use std::fmt;

/// The query parameters `sqlx` reads as the TLS mode (libpq's name first).
const MODE_KEYS: [&str; 2] = ["sslmode", "ssl-mode"];
/// The query parameters `sqlx` reads as the root certificates.
const ROOT_KEYS: [&str; 3] = ["sslrootcert", "ssl-root-cert", "ssl-ca"];
/// Largest `sslrootcert` file read (CA bundles are a few hundred KiB).
const MAX_ROOT_FILE_BYTES: u64 = 4 << 20;
/// `sslrootcert=system`: the well-known roots (libpq's spelling).
const SYSTEM_ROOTS: &str = "system";
/// The accepted `sslmode` values, for error messages.
const MODES: &str = "disable, prefer, require, verify-ca or verify-full";

/// libpq's `sslmode`, without `allow` (plain first, TLS only when the
/// server insists), which `sqlx` would silently treat as `disable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, unchecked; plain otherwise (default).
    Prefer,
    /// TLS or fail, certificate unchecked (checked as `verify-ca` when a
    /// root is given, as libpq does).
    Require,
    /// TLS, the certificate chain checked against the roots.
    VerifyCa,
    /// `VerifyCa`, and the certificate must name the host of the URL.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, String> {
        match value {
            "disable" => Ok(Self::Disable),
            "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            "allow" => Err(format!(
                "sslmode=allow is not supported (it would connect without TLS); use {MODES}"
            )),
            other => Err(format!("unknown sslmode {other:?}: use {MODES}")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The TLS settings of one PostgreSQL URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    /// The mode in effect (`require` with a root is `verify-ca` here).
    pub(crate) mode: SslMode,
    /// The mode as given, for messages.
    given: SslMode,
    /// `sslrootcert` as given: a file, inline PEM, or `system`.
    root: Option<String>,
    /// The host of the URL, which `verify-full` checks.
    host: String,
}

impl Settings {
    /// Reads `sslmode` (default: `$PGSSLMODE`, else `prefer`, as libpq)
    /// and `sslrootcert` of `url`. A URL that does not parse has neither
    /// (the driver then names what is wrong with it).
    ///
    /// The errors never quote the URL: it may hold a password, and the
    /// caller shows it redacted (research/contract.md, "Durable sessions").
    ///
    /// # Errors
    /// A sentence for an unknown or unsupported `sslmode`, an empty
    /// `sslrootcert`, or a parameter given twice.
    pub(crate) fn from_url(url: &str) -> Result<Self, String> {
        let parsed = reqwest::Url::parse(url).ok();
        let mut mode = None;
        let mut root = None;
        let pairs = parsed.iter().flat_map(|parsed| parsed.query_pairs());
        for (key, value) in pairs {
            let slot = if MODE_KEYS.contains(&key.as_ref()) {
                &mut mode
            } else if ROOT_KEYS.contains(&key.as_ref()) {
                &mut root
            } else {
                continue;
            };
            if slot.replace(value.into_owned()).is_some() {
                return Err(format!("{key} is given twice in the PostgreSQL URL"));
            }
        }
        let mode = match (mode, std::env::var("PGSSLMODE")) {
            (Some(value), _) => SslMode::parse(&value)?,
            (None, Ok(value)) => SslMode::parse(&value).map_err(|e| format!("PGSSLMODE: {e}"))?,
            (None, Err(_)) => SslMode::Prefer,
        };
        if root.as_deref().is_some_and(|r| r.trim().is_empty()) {
            return Err("sslrootcert is empty: give a file of PEM certificates".into());
        }
        // libpq: "if a root CA file exists, the behavior of
        // sslmode=require will be the same as that of verify-ca".
        let given = mode;
        let mode = match (mode, &root) {
            (SslMode::Require, Some(_)) => SslMode::VerifyCa,
            (mode, _) => mode,
        };
        Ok(Self {
            mode,
            given,
            root,
            host: parsed
                .as_ref()
                .and_then(|parsed| parsed.host_str())
                .unwrap_or("localhost")
                .to_owned(),
        })
    }

    /// Whether the server's certificate is checked at all.
    fn verifies(&self) -> bool {
        matches!(self.mode, SslMode::VerifyCa | SslMode::VerifyFull)
    }

    /// `url` as `sqlx` should get it: the mode in effect, and no
    /// `sslrootcert=system` (`sqlx` trusts the Mozilla roots built in when
    /// no root file is given, and would read `system` as a file name).
    pub(crate) fn connect_url(&self, url: &str) -> String {
        let Ok(mut parsed) = reqwest::Url::parse(url) else {
            return url.to_owned();
        };
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .filter(|(key, value)| !(ROOT_KEYS.contains(&key.as_ref()) && value == SYSTEM_ROOTS))
            .filter(|(key, _)| !MODE_KEYS.contains(&key.as_ref()))
            .map(|(key, value)| (key.into_owned(), value.into_owned()))
            .collect();
        parsed
            .query_pairs_mut()
            .clear()
            .extend_pairs(pairs)
            .append_pair("sslmode", self.mode.name());
        parsed.to_string()
    }

    /// Reads the root file when the mode checks certificates, so a missing
    /// or empty one is named before connecting (`sqlx` says only "No such
    /// file or directory").
    ///
    /// # Errors
    /// A sentence naming the file and what is wrong with it.
    pub(crate) fn check_root_file(&self) -> Result<(), String> {
        let Some(root) = self.root.as_deref().filter(|_| self.verifies()) else {
            return Ok(());
        };
        let trimmed = root.trim();
        if root == SYSTEM_ROOTS || trimmed.starts_with("-----BEGIN") {
            return Ok(());
        }
        // A FIFO would block the start for ever and /dev/zero would fill
        // memory: only a regular file of a CA bundle's size is read.
        let meta = std::fs::metadata(root).map_err(|e| format!("sslrootcert {root}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("sslrootcert {root}: not a regular file"));
        }
        if meta.len() > MAX_ROOT_FILE_BYTES {
            return Err(format!(
                "sslrootcert {root}: {} bytes, more than a CA bundle ({MAX_ROOT_FILE_BYTES} bytes at most)",
                meta.len()
            ));
        }
        let text = std::fs::read(root).map_err(|e| format!("sslrootcert {root}: {e}"))?;
        if !text
            .windows(CERTIFICATE_PEM.len())
            .any(|w| w == CERTIFICATE_PEM)
        {
            return Err(format!(
                "sslrootcert {root}: no PEM certificate in it (\"-----BEGIN CERTIFICATE-----\")"
            ));
        }
        Ok(())
    }

    /// The roots the chain is checked against, in words.
    fn roots(&self) -> String {
        match self.root.as_deref() {
            None | Some(SYSTEM_ROOTS) => {
                "the Mozilla roots built in (no sslrootcert given; set sslrootcert to the \
                 server's CA file)"
                    .to_owned()
            }
            Some(root) if root.trim().starts_with("-----BEGIN") => {
                "the inline sslrootcert and the Mozilla roots built in".to_owned()
            }
            Some(root) => format!("sslrootcert {root} and the Mozilla roots built in"),
        }
    }

    /// A sentence naming the TLS check `error` failed, or `None` when
    /// `error` is not about TLS.
    pub(crate) fn explain(&self, error: &sqlx::Error) -> Option<String> {
        let mode = if self.given == self.mode {
            self.mode.to_string()
        } else {
            format!("{} with sslrootcert (as {})", self.given, self.mode)
        };
        if let sqlx::Error::Tls(inner) = error
            && inner.to_string() == SQLX_NO_TLS
        {
            return Some(format!(
                "TLS check failed: the server does not offer TLS, and sslmode={mode} requires \
                 it (sslmode=prefer or disable allow a plain connection)"
            ));
        }
        let rustls = rustls_error(error)?;
        let sentence = match rustls {
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            ) => format!(
                "TLS check failed: sslmode={mode} checks the host name, and the server's \
                 certificate is not valid for host name {:?} ({rustls})",
                self.host
            ),
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer) => format!(
                "TLS check failed: sslmode={mode} checks the certificate chain, and the \
                 server's certificate is not signed by a trusted root: it was checked against {} \
                 ({rustls})",
                self.roots()
            ),
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::Expired
                | rustls::CertificateError::ExpiredContext { .. }
                | rustls::CertificateError::NotValidYet
                | rustls::CertificateError::NotValidYetContext { .. },
            ) => format!(
                "TLS check failed: sslmode={mode} checks the validity period, and the \
                 server's certificate is outside it ({rustls})"
            ),
            rustls::Error::InvalidCertificate(_) => format!(
                "TLS check failed: sslmode={mode} refused the server's certificate ({rustls})"
            ),
            other => format!("TLS handshake with the server failed (sslmode={mode}): {other}"),
        };
        Some(sentence)
    }
}

/// What `sqlx` says when `require` or `verify-*` meets a server that
/// answers "no TLS" to the SSLRequest.
const SQLX_NO_TLS: &str = "server does not support TLS";

/// The start of a PEM certificate.
const CERTIFICATE_PEM: &[u8] = b"-----BEGIN CERTIFICATE-----";

/// The rustls error inside `error`: rustls reports a failed handshake as
/// an I/O error (`InvalidData`) wrapping its own, which `sqlx` passes on as
/// `Io`; configuration failures come as `Tls`.
fn rustls_error(error: &sqlx::Error) -> Option<&rustls::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if let Some(found) = current.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        // `io::Error::source` skips the wrapped error; `get_ref` is it.
        if let Some(io) = current.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
        {
            if let Some(found) = inner.downcast_ref::<rustls::Error>() {
                return Some(found);
            }
            cause = inner.source();
            continue;
        }
        cause = current.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_default_to_prefer() {
        let url = "postgres://u@db.example:5432/x";
        let settings = Settings::from_url(url).expect("parses");
        // The test process may have PGSSLMODE set; only check without it.
        if std::env::var_os("PGSSLMODE").is_none() {
            assert_eq!(settings.mode, SslMode::Prefer);
        }
        for (value, mode) in [
            ("disable", SslMode::Disable),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            let settings = Settings::from_url(&format!("{url}?sslmode={value}")).expect(value);
            assert_eq!(settings.mode, mode);
        }
        let error = Settings::from_url(&format!("{url}?sslmode=strict")).expect_err("unknown");
        assert!(error.contains("verify-full"), "{error}");
        let error = Settings::from_url(&format!("{url}?sslmode=allow")).expect_err("allow");
        assert!(error.contains("not supported"), "{error}");
        let error =
            Settings::from_url(&format!("{url}?sslmode=disable&sslmode=require")).expect_err("2");
        assert!(error.contains("twice"), "{error}");
    }

    #[test]
    fn require_with_a_root_verifies_the_chain_and_system_means_built_in_roots() {
        let url = "postgres://u@h/x?sslmode=require&sslrootcert=/ca.pem&application_name=a";
        let settings = Settings::from_url(url).expect("parses");
        assert_eq!(settings.mode, SslMode::VerifyCa);
        let connect = settings.connect_url(url);
        assert!(connect.contains("sslmode=verify-ca"), "{connect}");
        assert!(connect.contains("sslrootcert=%2Fca.pem"), "{connect}");
        assert!(connect.contains("application_name=a"), "{connect}");

        let url = "postgres://u@h/x?sslmode=verify-full&sslrootcert=system";
        let settings = Settings::from_url(url).expect("parses");
        let connect = settings.connect_url(url);
        assert!(!connect.contains("sslrootcert"), "{connect}");
        assert!(connect.contains("sslmode=verify-full"), "{connect}");
        assert_eq!(settings.check_root_file(), Ok(()));
    }

    #[test]
    fn a_missing_root_file_is_named() {
        let url = "postgres://u@h/x?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem";
        let error = Settings::from_url(url)
            .expect("parses")
            .check_root_file()
            .expect_err("missing");
        assert!(
            error.starts_with("sslrootcert /nonexistent/ca.pem: "),
            "{error}"
        );
    }

    #[test]
    fn a_failed_host_name_check_is_named() {
        let settings =
            Settings::from_url("postgres://u@db.example/x?sslmode=verify-full").expect("parses");
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName),
        );
        let sentence = settings
            .explain(&sqlx::Error::Io(io))
            .expect("a TLS failure");
        assert!(sentence.contains("checks the host name"), "{sentence}");
        assert!(sentence.contains("\"db.example\""), "{sentence}");
        let plain = sqlx::Error::Io(std::io::Error::other("connection refused"));
        assert_eq!(settings.explain(&plain), None);
    }
}
