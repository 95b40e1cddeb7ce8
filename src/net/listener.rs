//! The listening socket, with an accept queue as deep as asked for.

use std::io;
use std::net::SocketAddr;

use tokio::net::TcpListener;

/// The deepest accept queue [`bind_listener`] asks for; the kernel then caps it at
/// `net.core.somaxconn`.
const MAX_LISTEN_BACKLOG: u32 = 65_535;

/// Bind a listening socket whose accept queue holds `backlog` completed connections
/// (the kernel caps it at `net.core.somaxconn`). The queue tokio's `TcpListener::bind`
/// left (128, as `ss -ltn` showed) is too small for a proxy that a campaign opens
/// thousands of connections to at once: a connection that finds the queue full has its
/// SYN dropped, and the client waits a full second for the retransmit. SO_REUSEADDR is
/// set as std does on Unix, so a restarted proxy can take its port back while old
/// connections sit in TIME_WAIT.
pub(crate) fn bind_listener(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog.clamp(1, MAX_LISTEN_BACKLOG))
}

/// The accept queue [`bind_listener`] gets for `backlog`: what it asks for, capped by
/// `net.core.somaxconn` (read from /proc; `None` where it cannot be read).
pub(crate) fn effective_backlog(backlog: u32) -> Option<u32> {
    let cap = std::fs::read_to_string("/proc/sys/net/core/somaxconn").ok()?;
    let cap: u32 = cap.trim().parse().ok()?;
    Some(backlog.clamp(1, MAX_LISTEN_BACKLOG).min(cap))
}
