//! Lets the kubelet's gRPC clients reach our unix-socket servers whatever `:authority` they send.
//!
//! grpc-go dials a unix socket given by its bare path with the path as `:authority` (kubelet
//! 1.36's plugin watcher does so when it calls `GetInfo`); newer grpc-go percent-encodes it, other
//! gRPC stacks send it as is. The HTTP/2 server under tonic (h2) refuses any `:authority` that is
//! not a valid URI authority and resets the stream with `PROTOCOL_ERROR` before a service sees
//! the call. On a unix socket the authority means nothing, so each connection passes through a
//! small frame-level relay: it decodes every header block the client sends (HPACK), puts
//! `localhost` (what grpc-go itself sends for `unix:` targets) in place of an authority h2 would
//! refuse, and encodes the block again for the server; every other frame, and everything the
//! server sends, passes through unchanged.

use futures::{Stream, StreamExt};
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame types and flags this relay looks at (RFC 9113 §6).
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame every HTTP/2 peer accepts (SETTINGS_MAX_FRAME_SIZE's floor).
const MAX_FRAME: usize = 16_384;
/// The largest header block relayed (CONTINUATION frames included); h2 itself refuses header
/// lists far smaller.
const MAX_BLOCK: usize = 256 * 1024;
/// What replaces an authority the server would refuse.
pub const UNIX_AUTHORITY: &str = "localhost";

/// The connections of `listener`, each relayed so that any `:authority` is accepted; serve them
/// with `serve_with_incoming`.
pub fn incoming(listener: tokio::net::UnixListener) -> impl Stream<Item = io::Result<DuplexStream>> {
    tokio_stream::wrappers::UnixListenerStream::new(listener).map(|conn| conn.map(relay))
}

/// Starts relaying one client connection; returns the server's end.
fn relay(client: tokio::net::UnixStream) -> DuplexStream {
    let (server_end, relay_end) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (client_rx, mut client_tx) = client.into_split();
        let (server_rx, mut server_tx) = tokio::io::split(relay_end);
        let upstream = async {
            let r = forward_requests(client_rx, &mut server_tx).await;
            let _ = server_tx.shutdown().await;
            r
        };
        let downstream = async {
            let mut server_rx = server_rx;
            let r = tokio::io::copy(&mut server_rx, &mut client_tx).await.map(|_| ());
            let _ = client_tx.shutdown().await;
            r
        };
        let (up, _) = tokio::join!(upstream, downstream);
        if let Err(e) = up {
            tracing::warn!(error = %e, "dropped a kubelet connection whose HTTP/2 frames could not be relayed");
        }
    });
    server_end
}

/// Why a client's frames could not be relayed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A header block did not decode.
    #[error("stream {stream}: header block does not decode: {reason}")]
    Hpack {
        /// The HTTP/2 stream.
        stream: u32,
        /// The decoder's words.
        reason: String,
    },
    /// A frame broke the protocol in a way the relay cannot pass on.
    #[error("stream {stream}: {what}")]
    Protocol {
        /// The HTTP/2 stream.
        stream: u32,
        /// What was wrong.
        what: &'static str,
    },
}

/// One frame: its header fields and payload.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// Reads one frame; `None` at a clean end of the connection between frames.
async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 9];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some(Frame { kind: head[3], flags: head[4], stream, payload }))
}

/// Appends a frame's bytes to `out`.
fn put_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// A HEADERS payload's header block fragment (padding and priority fields dropped).
fn fragment(f: &Frame) -> Result<&[u8], RelayError> {
    let bad = |what| RelayError::Protocol { stream: f.stream, what };
    let mut body = &f.payload[..];
    let mut pad = 0usize;
    if f.flags & PADDED != 0 {
        let (&n, rest) = body.split_first().ok_or_else(|| bad("PADDED HEADERS without a pad length"))?;
        pad = usize::from(n);
        body = rest;
    }
    if f.flags & PRIORITY != 0 {
        body = body.get(5..).ok_or_else(|| bad("PRIORITY HEADERS shorter than its priority fields"))?;
    }
    body.get(..body.len().saturating_sub(pad))
        .filter(|_| pad <= body.len())
        .ok_or_else(|| bad("padding longer than the HEADERS payload"))
}

/// The header list with an `:authority` the server would refuse replaced by [`UNIX_AUTHORITY`];
/// `true` when it was replaced.
pub fn accepted_authority(headers: &mut [(Vec<u8>, Vec<u8>)]) -> bool {
    let mut replaced = false;
    for (name, value) in headers.iter_mut() {
        if name.as_slice() == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err() {
            *value = UNIX_AUTHORITY.as_bytes().to_vec();
            replaced = true;
        }
    }
    replaced
}

/// What the server receives for a client that sent `client` (the preface and frames), relayed as
/// [`incoming`] relays a connection; for tests and the fuzz target.
pub fn relay_bytes(client: &[u8]) -> Result<Vec<u8>, RelayError> {
    let mut out = Vec::new();
    futures::executor::block_on(forward_requests(client, &mut out))?;
    Ok(out)
}

/// Relays the client's frames to the server, decoding and re-encoding every header block.
async fn forward_requests<R, W>(mut from: R, to: &mut W) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if &preface != PREFACE {
        // Not HTTP/2: let the server refuse it in its own words.
        tokio::io::copy(&mut from, to).await?;
        return Ok(());
    }
    let mut decoder = loona_hpack::Decoder::new();
    let mut encoder = loona_hpack::Encoder::new();
    while let Some(frame) = read_frame(&mut from).await? {
        if frame.kind != HEADERS {
            let mut out = Vec::with_capacity(9 + frame.payload.len());
            put_frame(&mut out, frame.kind, frame.flags, frame.stream, &frame.payload);
            to.write_all(&out).await?;
            continue;
        }
        let stream = frame.stream;
        let mut block = fragment(&frame)?.to_vec();
        let mut end_headers = frame.flags & END_HEADERS != 0;
        while !end_headers {
            let next = read_frame(&mut from)
                .await?
                .ok_or(RelayError::Protocol { stream, what: "the connection ended inside a header block" })?;
            if next.kind != CONTINUATION || next.stream != stream {
                return Err(RelayError::Protocol { stream, what: "a header block not continued by CONTINUATION" });
            }
            block.extend_from_slice(&next.payload);
            if block.len() > MAX_BLOCK {
                return Err(RelayError::Protocol { stream, what: "a header block larger than 256 KiB" });
            }
            end_headers = next.flags & END_HEADERS != 0;
        }
        let mut headers = decoder.decode(&block).map_err(|e| RelayError::Hpack { stream, reason: e.to_string() })?;
        if accepted_authority(&mut headers) {
            tracing::debug!(stream, "a client sent an :authority h2 refuses (a socket path?); relayed as localhost");
        }
        let encoded = encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut out = Vec::with_capacity(encoded.len() + 18);
        let chunks: Vec<&[u8]> = if encoded.is_empty() { vec![&[]] } else { encoded.chunks(MAX_FRAME).collect() };
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let end = if i == last { END_HEADERS } else { 0 };
            let (kind, flags) = if i == 0 { (HEADERS, (frame.flags & END_STREAM) | end) } else { (CONTINUATION, end) };
            put_frame(&mut out, kind, flags, stream, chunk);
        }
        to.write_all(&out).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_authorities_h2_refuses_are_replaced() {
        for (sent, kept) in [
            ("/var/lib/kubelet/plugins_registry/gpu.gpupart.io-reg.sock", false),
            ("%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.gpupart.io-reg.sock", false),
            ("unix:///var/lib/kubelet/x.sock", false),
            ("", false),
            ("localhost", true),
            ("[::1]:1", true),
            ("gpu.gpupart.io-reg.sock", true),
        ] {
            let mut h = vec![(b":authority".to_vec(), sent.as_bytes().to_vec()), (b":path".to_vec(), b"/a/b".to_vec())];
            let replaced = accepted_authority(&mut h);
            assert_eq!(replaced, !kept, "{sent:?}");
            let want = if kept { sent } else { UNIX_AUTHORITY };
            assert_eq!(h[0].1, want.as_bytes(), "{sent:?}");
            assert_eq!(h[1].1, b"/a/b", "{sent:?}: other headers untouched");
        }
    }

    /// A client's preface, SETTINGS, a HEADERS split over a CONTINUATION, and DATA.
    fn client_stream(authority: &str) -> Vec<u8> {
        let block = loona_hpack::Encoder::new().encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", authority.as_bytes()),
            (b"content-type", b"application/grpc"),
        ]);
        let (a, b) = block.split_at(block.len() / 2);
        let mut out = PREFACE.to_vec();
        put_frame(&mut out, 0x4, 0, 0, &[]);
        put_frame(&mut out, HEADERS, 0, 1, a);
        put_frame(&mut out, CONTINUATION, END_HEADERS, 1, b);
        put_frame(&mut out, 0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]);
        out
    }

    /// The frames of a relayed stream after the preface, as (kind, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        bytes = &bytes[PREFACE.len()..];
        let mut out = Vec::new();
        while bytes.len() >= 9 {
            let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        out
    }

    #[test]
    fn a_socket_path_authority_reaches_the_server_as_localhost_and_the_rest_unchanged() {
        let relayed = relay_bytes(&client_stream("/var/lib/kubelet/plugins_registry/gpu.gpupart.io-reg.sock")).unwrap();
        let f = frames(&relayed);
        let kinds: Vec<(u8, u8)> = f.iter().map(|(k, fl, _, _)| (*k, *fl)).collect();
        assert_eq!(kinds, [(0x4, 0), (HEADERS, END_HEADERS), (0x0, END_STREAM)], "one HEADERS, the others as sent");
        let headers = loona_hpack::Decoder::new().decode(&f[1].3).unwrap();
        let get = |k: &[u8]| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get(b":authority").as_deref(), Some(&b"localhost"[..]));
        assert_eq!(get(b":path").as_deref(), Some(&b"/pluginregistration.Registration/GetInfo"[..]));
        assert_eq!(f[2].3, [0, 0, 0, 0, 0]);
        // A valid authority passes as it is.
        let kept = frames(&relay_bytes(&client_stream("localhost")).unwrap());
        let headers = loona_hpack::Decoder::new().decode(&kept[1].3).unwrap();
        assert!(headers.iter().any(|(n, v)| n == b":authority" && v == b"localhost"));
        // A header block that does not decode ends the connection with a reason.
        let mut bad = PREFACE.to_vec();
        put_frame(&mut bad, HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff]);
        assert!(relay_bytes(&bad).unwrap_err().to_string().contains("stream 1: header block does not decode"));
    }

    #[test]
    fn padding_and_priority_are_dropped_from_the_fragment() {
        let mut payload = vec![2u8];
        payload.extend_from_slice(&[0, 0, 0, 3, 16]);
        payload.extend_from_slice(b"abc");
        payload.extend_from_slice(&[0, 0]);
        let f = Frame { kind: HEADERS, flags: PADDED | PRIORITY | END_HEADERS, stream: 1, payload };
        assert_eq!(fragment(&f).unwrap(), b"abc");
        let short = Frame { kind: HEADERS, flags: PADDED, stream: 3, payload: vec![9, 1] };
        assert!(fragment(&short).unwrap_err().to_string().contains("stream 3: padding"));
    }
}
