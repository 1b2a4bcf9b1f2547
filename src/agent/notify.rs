//! systemd `sd_notify` over `$NOTIFY_SOCKET` (READY and STATUS for `Type=notify` units); a no-op
//! when not started by systemd.

use std::os::unix::net::UnixDatagram;

/// Sends `message` (e.g. `READY=1\nSTATUS=…`) to systemd, if it is listening.
pub fn notify(message: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = UnixDatagram::unbound() else { return };
    let bytes = path.as_encoded_bytes();
    let result = if let Some(name) = bytes.strip_prefix(b"@") {
        abstract_send(&sock, name, message)
    } else {
        sock.send_to(message.as_bytes(), &path)
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

fn abstract_send(sock: &UnixDatagram, name: &[u8], message: &str) -> std::io::Result<usize> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    sock.send_to_addr(message.as_bytes(), &addr)
}
