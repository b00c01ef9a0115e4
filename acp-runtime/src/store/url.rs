//! Where sessions are kept: `--store` URLs parsed, and passwords redacted
//! before a URL is shown.

use super::handle::*;
use std::path::{Path, PathBuf};

/// Where sessions are kept (`--store`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// Nothing is written; a restart forgets every session.
    Memory,
    /// A SQLite file, created when missing.
    Sqlite(PathBuf),
    /// A PostgreSQL database, `postgres://user[:password]@host[:port]/db[?…]`,
    /// over TLS as its `sslmode` and `sslrootcert` say (libpq's rules).
    Postgres(String),
}

impl StoreUrl {
    /// Parses `memory`, `sqlite:PATH` (or `sqlite://PATH`) and
    /// `postgres://…` / `postgresql://…`.
    ///
    /// A PostgreSQL URL is taken as it is: its `sslmode` and `sslrootcert`
    /// are checked when the store is opened, whose error shows the URL
    /// redacted (a parser's error would quote it, password and all).
    ///
    /// # Errors
    /// A message naming the accepted forms.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "memory" {
            return Ok(Self::Memory);
        }
        if let Some(path) = text
            .strip_prefix("sqlite://")
            .or_else(|| text.strip_prefix("sqlite:"))
        {
            if path.is_empty() {
                return Err("sqlite: needs a file path, as in sqlite:/data/sessions.db".into());
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(Self::Postgres(text.to_owned()));
        }
        Err(format!(
            "unknown store {text:?}: use memory, sqlite:PATH or postgres://USER@HOST:PORT/DB"
        ))
    }

    /// The default: `sqlite:<data_dir>/sessions.db`.
    pub fn default_for(data_dir: &Path) -> Self {
        Self::Sqlite(data_dir.join(DEFAULT_SQLITE_FILE))
    }

    /// The backend's name as `GET /v2/health` shows it.
    pub fn backend(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// The URL with any password replaced by `***`, for logs and errors.
    pub fn redacted(&self) -> String {
        match self {
            Self::Memory => "memory".into(),
            Self::Sqlite(path) => format!("sqlite:{}", path.display()),
            Self::Postgres(url) => redact_password(url),
        }
    }
}

/// `url` with the password (in the user info or a `password=` query
/// parameter) replaced by `***`; a URL that does not parse shows only its
/// scheme, since a password may be anywhere in it.
pub(crate) fn redact_password(url: &str) -> String {
    let Ok(mut parsed) = reqwest::Url::parse(url) else {
        let scheme = url
            .split_once("://")
            .map_or("postgres", |(scheme, _)| scheme);
        return format!("{scheme}://*** (unparsable URL, not shown)");
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    // Rebuilt only when it holds a password: rebuilding re-encodes every
    // value, and `sslrootcert=/etc/ca.pem` should read as typed.
    if parsed
        .query_pairs()
        .any(|(key, _)| key.eq_ignore_ascii_case("password"))
    {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(key, value)| {
                let secret = key.eq_ignore_ascii_case("password");
                (
                    key.into_owned(),
                    if secret {
                        "***".to_owned()
                    } else {
                        value.into_owned()
                    },
                )
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}
