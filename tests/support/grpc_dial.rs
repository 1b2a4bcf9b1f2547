//! A unary gRPC call over a unix socket that sends the `:authority` grpc-go sends when it dials
//! a socket by its bare path, as kubelet 1.36's plugin watcher does
//! (`pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go`, `dial`: a
//! `grpc.DialContext` on the path with a context dialer and no `WithAuthority`): the path itself.
//! tonic's client cannot send such an authority (its URI type refuses it), so this speaks
//! HTTP/2 by hand: the preface, SETTINGS, one HEADERS and one DATA frame, then it reads frames
//! until the stream ends, acknowledging SETTINGS and answering PINGs as grpc-go does. A stream
//! reset is reported in grpc-go's words.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len();
    let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Calls `method` (`/package.Service/Method`) on the socket with `authority` as `:authority`.
pub async fn unary<Req: prost::Message, Resp: prost::Message + Default>(
    socket: &Path,
    authority: &str,
    method: &str,
    req: &Req,
) -> Result<Resp, String> {
    tokio::time::timeout(Duration::from_secs(10), call(socket, authority, method, req))
        .await
        .map_err(|_| format!("{method}: no answer in 10 s"))?
}

async fn call<Req: prost::Message, Resp: prost::Message + Default>(
    socket: &Path,
    authority: &str,
    method: &str,
    req: &Req,
) -> Result<Resp, String> {
    let mut conn = tokio::net::UnixStream::connect(socket).await.map_err(|e| e.to_string())?;
    // grpc-go's header order and values for a unary call.
    let headers: [(&str, &str); 7] = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", method),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.72.1"),
        ("te", "trailers"),
    ];
    let block = loona_hpack::Encoder::new().encode(headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
    let body = req.encode_to_vec();
    let mut data = vec![0u8];
    data.extend_from_slice(&(body.len() as u32).to_be_bytes());
    data.extend_from_slice(&body);
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &block));
    out.extend(frame(0x0, 0x1, 1, &data));
    conn.write_all(&out).await.map_err(|e| e.to_string())?;

    let mut decoder = loona_hpack::Decoder::new();
    let (mut message, mut fields) = (Vec::new(), Vec::<(Vec<u8>, Vec<u8>)>::new());
    loop {
        let mut head = [0u8; 9];
        conn.read_exact(&mut head).await.map_err(|e| format!("connection closed: {e}"))?;
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).await.map_err(|e| e.to_string())?;
        match kind {
            0x4 if flags & 0x1 == 0 => conn.write_all(&frame(0x4, 0x1, 0, &[])).await.map_err(|e| e.to_string())?,
            0x6 if flags & 0x1 == 0 => {
                conn.write_all(&frame(0x6, 0x1, 0, &payload)).await.map_err(|e| e.to_string())?
            }
            0x3 if stream == 1 => {
                let code = u32::from_be_bytes(payload[..4].try_into().map_err(|_| "short RST_STREAM")?);
                let name = match code {
                    1 => "PROTOCOL_ERROR".to_string(),
                    2 => "INTERNAL_ERROR".to_string(),
                    c => format!("{c}"),
                };
                return Err(format!(
                    "rpc error: code = Internal desc = stream terminated by RST_STREAM with error code: {name}"
                ));
            }
            0x7 => return Err(format!("GOAWAY: {}", String::from_utf8_lossy(payload.get(8..).unwrap_or(&[])))),
            0x1 if stream == 1 => {
                // The answer's headers (no CONTINUATION: they are small).
                let (mut body, mut pad) = (&payload[..], 0);
                if flags & 0x8 != 0 {
                    pad = usize::from(body[0]);
                    body = &body[1..];
                }
                if flags & 0x20 != 0 {
                    body = &body[5..];
                }
                let decoded = decoder.decode(&body[..body.len() - pad]).map_err(|e| e.to_string())?;
                fields.extend(decoded);
                if flags & 0x1 != 0 {
                    break;
                }
            }
            0x0 if stream == 1 => {
                let pad = if flags & 0x8 != 0 { usize::from(payload[0]) + 1 } else { 0 };
                let start = usize::from(flags & 0x8 != 0);
                message.extend_from_slice(&payload[start..payload.len() + start - pad]);
                if flags & 0x1 != 0 {
                    break;
                }
            }
            _ => {}
        }
    }
    let field = |k: &str| fields.iter().find(|(n, _)| n == k.as_bytes()).map(|(_, v)| String::from_utf8_lossy(v));
    match field("grpc-status").as_deref() {
        Some("0") => {}
        status => {
            return Err(format!(
                "rpc error: code = {} desc = {}",
                status.unwrap_or("?"),
                field("grpc-message").unwrap_or_default()
            ))
        }
    }
    let body = message.get(5..).ok_or("an answer without a message")?;
    Resp::decode(body).map_err(|e| e.to_string())
}
