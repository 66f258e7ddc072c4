//! Who may use the dashboard: a bearer token, basic-auth credentials, or
//! both, read from files or environment variables (never from the command
//! line, where every user of the machine can read them in `ps`).

use axum::http::HeaderMap;
use base64::Engine;
use std::path::{Path, PathBuf};
use subtle::ConstantTimeEq;

/// The environment variable holding a bearer token.
pub const TOKEN_ENV: &str = "SHARDQ_DASHBOARD_TOKEN";
/// The environment variable holding basic-auth credentials, `user:password`.
pub const BASIC_ENV: &str = "SHARDQ_DASHBOARD_BASIC_AUTH";

/// Credentials a request must carry.
#[derive(Clone, Default)]
pub struct Auth {
    token: Option<String>,
    basic: Option<(String, String)>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("basic_user", &self.basic.as_ref().map(|(u, _)| u))
            .finish()
    }
}

/// Credentials that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A credentials file could not be read.
    #[error("cannot read the dashboard credentials file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A token or password is empty or malformed.
    #[error("{what} {problem}")]
    Invalid {
        /// Where it came from.
        what: String,
        /// What is wrong and what to do.
        problem: &'static str,
    },
}

impl Auth {
    /// Requests must carry `Authorization: Bearer <token>`.
    ///
    /// # Errors
    ///
    /// [`AuthError::Invalid`] for an empty token.
    pub fn token(token: &str) -> Result<Auth, AuthError> {
        Auth::default().with_token(token.trim(), "the bearer token")
    }

    /// Requests must carry basic-auth credentials `user` and `password`.
    ///
    /// # Errors
    ///
    /// [`AuthError::Invalid`] for an empty user or password, or a user with `:`.
    pub fn basic(user: &str, password: &str) -> Result<Auth, AuthError> {
        Auth::default().with_basic(&format!("{user}:{password}"), "the basic-auth credentials")
    }

    /// Reads credentials from the files given and the environment
    /// ([`TOKEN_ENV`], [`BASIC_ENV`]); the file wins over the variable.
    /// `None` when none is configured.
    ///
    /// # Errors
    ///
    /// [`AuthError`] when a file cannot be read or holds no usable value.
    pub fn load(
        token_file: Option<&Path>,
        basic_file: Option<&Path>,
    ) -> Result<Option<Auth>, AuthError> {
        let mut auth = Auth::default();
        if let Some(path) = token_file {
            auth = auth.with_token(read(path)?.trim(), &path.display().to_string())?;
        } else if let Ok(token) = std::env::var(TOKEN_ENV) {
            auth = auth.with_token(token.trim(), TOKEN_ENV)?;
        }
        if let Some(path) = basic_file {
            auth = auth.with_basic(read(path)?.trim(), &path.display().to_string())?;
        } else if let Ok(pair) = std::env::var(BASIC_ENV) {
            auth = auth.with_basic(pair.trim(), BASIC_ENV)?;
        }
        Ok((auth.token.is_some() || auth.basic.is_some()).then_some(auth))
    }

    fn with_token(mut self, token: &str, what: &str) -> Result<Auth, AuthError> {
        if token.is_empty() {
            return Err(AuthError::Invalid {
                what: what.into(),
                problem: "is empty; put a long random token in it",
            });
        }
        self.token = Some(token.to_string());
        Ok(self)
    }

    fn with_basic(mut self, pair: &str, what: &str) -> Result<Auth, AuthError> {
        match pair.split_once(':') {
            Some((user, password)) if !user.is_empty() && !password.is_empty() => {
                self.basic = Some((user.to_string(), password.to_string()));
                Ok(self)
            }
            _ => Err(AuthError::Invalid {
                what: what.into(),
                problem: "must be `user:password`, both non-empty (the user without `:`)",
            }),
        }
    }

    /// Whether basic auth is accepted (then a refusal asks the browser for it).
    pub(crate) fn offers_basic(&self) -> bool {
        self.basic.is_some()
    }

    /// Whether `headers` carry accepted credentials (compared in constant time).
    pub(crate) fn allows(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            return self
                .token
                .as_ref()
                .is_some_and(|t| bool::from(t.as_bytes().ct_eq(rest.as_bytes())));
        }
        if scheme.eq_ignore_ascii_case("basic") {
            let Some((user, password)) = &self.basic else {
                return false;
            };
            let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(rest) else {
                return false;
            };
            let expected = format!("{user}:{password}");
            return bool::from(expected.as_bytes().ct_eq(&decoded));
        }
        false
    }
}

fn read(path: &Path) -> Result<String, AuthError> {
    std::fs::read_to_string(path).map_err(|source| AuthError::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn only_the_configured_credentials_pass() {
        let auth = Auth::token("s3cret").unwrap();
        assert!(auth.allows(&with("Bearer s3cret")));
        assert!(!auth.allows(&with("Bearer s3cre")));
        assert!(!auth.allows(&HeaderMap::new()));
        let basic = Auth::basic("ops", "pw").unwrap();
        let good = base64::engine::general_purpose::STANDARD.encode("ops:pw");
        let bad = base64::engine::general_purpose::STANDARD.encode("ops:px");
        assert!(basic.allows(&with(&format!("Basic {good}"))));
        assert!(!basic.allows(&with(&format!("Basic {bad}"))));
        assert!(!basic.allows(&with("Bearer pw")));
    }

    #[test]
    fn empty_or_malformed_credentials_are_refused_with_what_to_do() {
        assert!(Auth::token("  ").unwrap_err().to_string().contains("empty"));
        let err = Auth::default()
            .with_basic("nopassword", "FILE")
            .unwrap_err();
        assert!(err.to_string().contains("user:password"), "{err}");
    }
}
