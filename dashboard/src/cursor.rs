//! Page cursors in URLs: the per-shard positions as JSON, base64url.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use shardq::client::PageCursor;

pub(crate) fn encode(cursor: &PageCursor) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(cursor).unwrap_or_default())
}

/// The cursor in `text`, or `None` when it is not one of ours.
pub(crate) fn decode(text: &str) -> Option<PageCursor> {
    let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
    serde_json::from_slice(&bytes).ok()
}
