//! Cross-site request forgery: a browser that is logged in (basic auth) or
//! on loopback sends requests from any page it visits. Every action must
//! therefore show this process's secret token twice, in its form and in a
//! `SameSite=Strict` cookie (another site can set neither), and a browser's
//! `Origin` (or `Sec-Fetch-Site`) must say the form came from the dashboard.

use axum::http::{header, HeaderMap};
use rand::RngCore;
use subtle::ConstantTimeEq;

/// The cookie holding the token.
pub(crate) const COOKIE: &str = "shardq_csrf";

/// The form field holding the token.
pub(crate) const FIELD: &str = "csrf";

/// This process's token: random, made at start.
#[derive(Clone)]
pub(crate) struct CsrfToken(String);

impl CsrfToken {
    pub fn new() -> CsrfToken {
        let mut bytes = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut bytes);
        CsrfToken(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    pub fn value(&self) -> &str {
        &self.0
    }

    /// The `Set-Cookie` value that gives it to the browser.
    pub fn cookie(&self) -> String {
        format!("{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", self.0)
    }

    fn matches(&self, given: &str) -> bool {
        bool::from(self.0.as_bytes().ct_eq(given.as_bytes()))
    }

    /// Why an action request must be refused, if it must: the form token,
    /// the cookie, and the browser's origin headers.
    pub fn refusal(&self, headers: &HeaderMap, form_token: Option<&str>) -> Option<&'static str> {
        if !form_token.is_some_and(|t| self.matches(t)) {
            return Some(
                "the form's CSRF token is missing or wrong; reload the page and try again",
            );
        }
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(name, _)| *name == COOKIE)
            .map(|(_, value)| value.to_string());
        if !cookie.is_some_and(|c| self.matches(&c)) {
            return Some("the CSRF cookie is missing or wrong; reload the page and try again");
        }
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        if let Some(origin) = text(header::ORIGIN.as_str()) {
            let host = text(header::HOST.as_str()).unwrap_or("");
            if origin != format!("http://{host}") && origin != format!("https://{host}") {
                return Some("the request comes from another site (Origin)");
            }
        } else if let Some(site) = text("sec-fetch-site") {
            if site != "same-origin" && site != "none" {
                return Some("the request comes from another site (Sec-Fetch-Site)");
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn an_action_needs_the_token_in_form_and_cookie_and_a_same_origin() {
        let token = CsrfToken::new();
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        let cookie = format!("{COOKIE}={}", token.value());
        headers.insert(header::COOKIE, HeaderValue::from_str(&cookie).unwrap());
        assert_eq!(token.refusal(&headers, Some(token.value())), None);
        assert!(token.refusal(&headers, Some("forged")).is_some());
        assert!(token.refusal(&headers, None).is_some());
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(token.refusal(&headers, Some(token.value())).is_some());
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert_eq!(token.refusal(&headers, Some(token.value())), None);
        headers.remove(header::COOKIE);
        assert!(token.refusal(&headers, Some(token.value())).is_some());
    }
}
