//! Checks `[[shards]]` entries: address, password source and TLS.

use super::super::error::ConfigError;
use super::super::file::ShardFile;
use super::checks::positive;
use crate::tls::{CaRoots, TlsMode};
use std::collections::HashSet;
use std::path::PathBuf;
use std::str::FromStr;
use tokio_postgres::config::SslMode;

/// One shard, ready to connect. `Debug` never shows the password.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// Unique name.
    pub name: String,
    /// Connection settings (tokio-postgres redacts the password in `Debug`).
    /// Its `ssl_mode` follows `tls`.
    pub pg: tokio_postgres::Config,
    /// TLS to this shard (`sslmode`, `sslrootcert`).
    pub tls: TlsMode,
    /// Pool size for this process.
    pub pool_size: usize,
    /// Reached through a transaction-pooling proxy: no startup settings.
    pub transaction_pooler: bool,
}

/// The `sslmode` values shardq understands, for messages.
const SSLMODES: &str = "use \"disable\", \"require\" or \"verify-full\"";

pub(super) fn validate_shards(
    files: Vec<ShardFile>,
    default_pool_size: usize,
) -> Result<Vec<ShardConfig>, ConfigError> {
    if files.is_empty() {
        return Err(ConfigError::NoShards);
    }
    let mut names = HashSet::new();
    let mut shards = Vec::with_capacity(files.len());
    for (index, mut f) in files.into_iter().enumerate() {
        // The name is only shown (errors, logs); a URL pasted into it must
        // not show its password.
        f.name = super::super::redact::redact_text(&f.name);
        if !names.insert(f.name.clone()) {
            return Err(ConfigError::DuplicateShard(f.name));
        }
        shards.push(validate_shard(index, f, default_pool_size)?);
    }
    Ok(shards)
}

fn validate_shard(
    index: usize,
    f: ShardFile,
    default_pool_size: usize,
) -> Result<ShardConfig, ConfigError> {
    let (mut pg, url_tls) = address(index, &f)?;
    password(index, &f, &mut pg)?;
    let tls = tls_mode(index, &f, url_tls)?;
    pg.ssl_mode(tls.pg_ssl_mode());
    if pg.get_user().is_none() {
        pg.user("postgres");
    }
    Ok(ShardConfig {
        name: f.name,
        pg,
        tls,
        pool_size: positive(
            "shards[].pool_size",
            f.pool_size.unwrap_or(default_pool_size),
        )?,
        transaction_pooler: f.transaction_pooler,
    })
}

/// libpq's TLS parameters as written in the URL; tokio-postgres does not know
/// `verify-full` or `sslrootcert`, so they are taken out before it parses.
#[derive(Debug, Default, PartialEq, Eq)]
struct UrlTls {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

fn address(index: usize, f: &ShardFile) -> Result<(tokio_postgres::Config, UrlTls), ConfigError> {
    let (pg, url_tls) = match (&f.url, &f.host) {
        (Some(url), None) => {
            let (rest, mut url_tls) = split_tls_params(url);
            let pg =
                tokio_postgres::Config::from_str(&rest).map_err(|source| ConfigError::BadUrl {
                    index,
                    name: f.name.clone(),
                    source,
                })?;
            // A `key=value` string: tokio-postgres read its sslmode itself, and
            // `prefer` (its default) is indistinguishable from none given.
            if url_tls.sslmode.is_none() {
                url_tls.sslmode = match pg.get_ssl_mode() {
                    SslMode::Disable => Some("disable".into()),
                    SslMode::Require => Some("require".into()),
                    _ => None,
                };
            }
            (pg, url_tls)
        }
        (None, Some(host)) => {
            let mut pg = tokio_postgres::Config::new();
            pg.host(host)
                .port(f.port.unwrap_or(5432))
                .dbname(f.dbname.as_deref().unwrap_or("shardq"))
                .user(f.user.as_deref().unwrap_or("postgres"));
            (pg, UrlTls::default())
        }
        (url, _) => {
            return Err(ConfigError::Address {
                index,
                name: f.name.clone(),
                what: if url.is_some() { "both" } else { "neither" },
            })
        }
    };
    if pg.get_hosts().is_empty() {
        return Err(ConfigError::Address {
            index,
            name: f.name.clone(),
            what: "a URL without a host",
        });
    }
    Ok((pg, url_tls))
}

/// Takes `sslmode` and `sslrootcert` out of a `postgres://` URL's query.
/// Other strings are returned as they are.
fn split_tls_params(url: &str) -> (String, UrlTls) {
    let mut tls = UrlTls::default();
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((base, query)) = url.split_once('?').filter(|_| is_url) else {
        return (url.to_string(), tls);
    };
    let mut kept = Vec::new();
    for param in query.split('&') {
        match param.split_once('=') {
            Some(("sslmode", value)) => tls.sslmode = Some(percent_decode(value)),
            Some(("sslrootcert", value)) => tls.sslrootcert = Some(percent_decode(value)),
            _ => kept.push(param),
        }
    }
    if kept.is_empty() {
        (base.to_string(), tls)
    } else {
        (format!("{base}?{}", kept.join("&")), tls)
    }
}

/// Decodes `%XX` escapes (a path may be written `%2Fetc%2Fca.pem`).
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Sets the password from `password`, `password_file` or `password_env`;
/// more than one source (the URL included) is an error, not a silent choice.
fn password(
    index: usize,
    f: &ShardFile,
    pg: &mut tokio_postgres::Config,
) -> Result<(), ConfigError> {
    let given = [
        ("url", pg.get_password().is_some()),
        ("password", f.password.is_some()),
        ("password_file", f.password_file.is_some()),
        ("password_env", f.password_env.is_some()),
    ];
    let mut sources = given.iter().filter(|(_, yes)| *yes).map(|(key, _)| *key);
    if let (Some(first), Some(second)) = (sources.next(), sources.next()) {
        return Err(ConfigError::PasswordTwice {
            index,
            name: f.name.clone(),
            first,
            second,
        });
    }
    if let Some(password) = &f.password {
        pg.password(password);
    }
    if let Some(path) = &f.password_file {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::PasswordFile {
            index,
            path: path.clone(),
            source,
        })?;
        pg.password(text.lines().next().unwrap_or("").trim_end());
    }
    if let Some(var) = &f.password_env {
        let problem = |problem| ConfigError::PasswordEnv {
            index,
            name: f.name.clone(),
            var: var.clone(),
            problem,
        };
        // VarError is not kept as the source: its message would print the value.
        match std::env::var(var) {
            Ok(value) => pg.password(value),
            Err(std::env::VarError::NotPresent) => return Err(problem("not set")),
            Err(std::env::VarError::NotUnicode(_)) => return Err(problem("not valid UTF-8")),
        };
    }
    Ok(())
}

fn tls_mode(index: usize, f: &ShardFile, url: UrlTls) -> Result<TlsMode, ConfigError> {
    let tls_error = |key, problem: String| ConfigError::Tls {
        index,
        name: f.name.clone(),
        key,
        problem,
    };
    let sslmode = match (f.sslmode.as_deref(), url.sslmode.as_deref()) {
        (Some(key), Some(url)) if key != url => {
            return Err(tls_error(
                "sslmode",
                format!("{key:?} here but {url:?} in the url; give it in one place"),
            ))
        }
        (Some(mode), _) | (None, Some(mode)) => mode,
        (None, None) => "disable",
    };
    let rootcert = match (&f.sslrootcert, url.sslrootcert) {
        (Some(_), Some(_)) => {
            return Err(tls_error(
                "sslrootcert",
                "given both here and in the url; give it in one place".into(),
            ))
        }
        (Some(path), None) => Some(path.clone()),
        (None, url_path) => url_path.map(PathBuf::from),
    };
    let mode = match sslmode {
        "disable" => TlsMode::Disable,
        "require" => TlsMode::Require,
        "verify-full" => {
            let Some(path) = rootcert else {
                return Err(tls_error(
                    "sslrootcert",
                    "sslmode = \"verify-full\" needs the PEM file of the CA that signed the \
                     server's certificate; set sslrootcert = \"path/to/ca.pem\""
                        .into(),
                ));
            };
            let roots = CaRoots::from_pem_file(&path).map_err(|source| ConfigError::RootCert {
                index,
                name: f.name.clone(),
                path: path.clone(),
                source: Box::new(source),
            })?;
            return Ok(TlsMode::VerifyFull(roots));
        }
        other => {
            return Err(tls_error(
                "sslmode",
                format!("{other:?} is not supported; {SSLMODES}"),
            ))
        }
    };
    if let Some(path) = rootcert {
        // Silently ignoring it would leave a reader believing the server is verified.
        return Err(tls_error(
            "sslrootcert",
            format!(
                "{} is only used with sslmode = \"verify-full\" (this shard has {:?}); \
                 set that, or remove sslrootcert",
                path.display(),
                mode.name()
            ),
        ));
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_params_are_taken_out_of_the_url_query() {
        let (rest, tls) = split_tls_params(
            "postgres://u@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u@h:5/db?application_name=x");
        assert_eq!(tls.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(tls.sslrootcert.as_deref(), Some("/tmp/ca.pem"));

        let (rest, tls) = split_tls_params("postgres://u@h/db?sslmode=require");
        assert_eq!(rest, "postgres://u@h/db");
        assert_eq!(tls.sslmode.as_deref(), Some("require"));

        let (rest, tls) = split_tls_params("host=h sslmode=require");
        assert_eq!(rest, "host=h sslmode=require");
        assert_eq!(tls, UrlTls::default());
    }

    #[test]
    fn percent_decoding_leaves_broken_escapes_alone() {
        assert_eq!(percent_decode("a%20b%2"), "a b%2");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
