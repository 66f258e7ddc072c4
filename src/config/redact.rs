//! Passwords out of URLs and config text, for logs and errors. A leaf.

/// Returns `text` with the password of every URL in it, and the rest of every
/// line that sets a `password`, replaced by `<redacted>`.
pub fn redact_text(text: &str) -> String {
    text.lines()
        .map(|line| {
            if let Some(at) = line.find("password") {
                if line[at..].contains('=') {
                    return format!("{}password = <redacted>", &line[..at]);
                }
            }
            line.split_inclusive(|c: char| c.is_whitespace() || c == '"' || c == '\'')
                .map(redact_url)
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Returns `url` with any password replaced by `<redacted>`, for logs and errors.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:<redacted>{}",
            &url[..scheme_end + 3],
            &rest[..colon],
            &rest[at..]
        ),
        None => url.to_string(),
    }
}
