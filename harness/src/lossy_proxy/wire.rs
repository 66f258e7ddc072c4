//! The few pieces of the PostgreSQL wire protocol the proxy reads: the
//! client's opening (encryption requests, the startup message) and typed
//! messages (a type byte and a big-endian length that counts itself but not
//! the type byte).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The request codes a client may open with to negotiate encryption; the
/// server answers each with a single byte, not a message.
const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;

/// The first byte of a TLS record: a client that starts TLS directly
/// (PostgreSQL 17's `sslnegotiation=direct`) sends no request first.
const TLS_HANDSHAKE: u8 = 0x16;

/// Relays the client's opening: encryption requests and the server's
/// one-byte answers, then the first 8 bytes of the startup message. Returns
/// how many bytes of the startup message are left, or `None` when the
/// connection is encrypted (its messages cannot be parsed).
pub(super) async fn negotiate(
    client: &mut TcpStream,
    server: &mut TcpStream,
) -> std::io::Result<Option<usize>> {
    loop {
        let mut head = [0u8; 8];
        client.read_exact(&mut head).await?;
        server.write_all(&head).await?;
        if head[0] == TLS_HANDSHAKE {
            return Ok(None);
        }
        let length = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let code = i32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if length != 8 || (code != SSL_REQUEST && code != GSSENC_REQUEST) {
            // A startup (or cancel) message: from here on both sides speak
            // in typed messages.
            return Ok(Some(usize::try_from(length).unwrap_or(8).saturating_sub(8)));
        }
        let mut answer = [0u8; 1];
        server.read_exact(&mut answer).await?;
        client.write_all(&answer).await?;
        if answer[0] != b'N' {
            // `S` (TLS) or `G` (GSSAPI): encrypted from here on.
            return Ok(None);
        }
        // Refused: the client goes on in plaintext, with another request
        // or the startup message.
    }
}

/// Reads one message (type byte, length, body) into `buf`, replacing what
/// was there. Returns the type byte; the body is `buf[5..]`.
pub(super) async fn read_message(
    from: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> std::io::Result<u8> {
    let mut head = [0u8; 5];
    from.read_exact(&mut head).await?;
    let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if length < 4 {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    buf.clear();
    buf.extend_from_slice(&head);
    buf.resize(1 + length, 0);
    from.read_exact(&mut buf[5..]).await?;
    Ok(head[0])
}

/// Splits a NUL-terminated string off the front of `bytes`.
pub(super) fn c_string(bytes: &[u8]) -> (String, &[u8]) {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let text = String::from_utf8_lossy(&bytes[..end]).into_owned();
    (text, bytes.get(end + 1..).unwrap_or_default())
}
