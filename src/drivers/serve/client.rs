//! One client connection's state, shared by its requests: the forwarding headers it adds
//! (built once per connection) and its recorder back-pressure gate.

use std::net::SocketAddr;
use std::sync::Mutex;

use http::header::HeaderValue;
use tokio::sync::oneshot;

fn forwarded_for(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

/// State of one client connection shared by its requests: what it adds to every request
/// it forwards, built once per connection instead of once per request (formatting an
/// address and a `Forwarded` value per request measured as a few percent of serve's CPU),
/// and its recorder back-pressure gate.
pub(super) struct ClientConn {
    pub(super) ip: std::net::IpAddr,
    /// `X-Forwarded-For` when the client sent none.
    pub(super) xff: Option<HeaderValue>,
    /// The last client `Host` seen and the `Forwarded` value made from it.
    last: Mutex<Option<(Option<HeaderValue>, Option<HeaderValue>)>>,
    /// Set while a finished exchange of this connection waits for room in the recorder's
    /// queue: the connection's next request waits for it first. So under `block`, rows
    /// waiting for the writer are bounded by the number of connections, and a slow disk
    /// slows the clients down instead of growing memory (measured before this gate: a
    /// soak whose writer stalled on fsync grew to 24 GB and was OOM-killed).
    backlog: Mutex<Option<oneshot::Receiver<()>>>,
}

impl ClientConn {
    pub(super) fn new(peer: SocketAddr) -> ClientConn {
        let ip = peer.ip();
        ClientConn {
            ip,
            xff: HeaderValue::from_str(&ip.to_string()).ok(),
            last: Mutex::new(None),
            backlog: Mutex::new(None),
        }
    }

    /// Close the gate until the returned sender is dropped.
    pub(super) fn hold(&self) -> oneshot::Sender<()> {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut b) = self.backlog.lock() {
            *b = Some(rx);
        }
        tx
    }

    /// Wait until this connection's previous row is in the recorder's queue.
    pub(super) async fn wait_backlog(&self) {
        let gate = self.backlog.lock().ok().and_then(|mut b| b.take());
        if let Some(rx) = gate {
            let _ = rx.await;
        }
    }

    /// `Forwarded: for=...;proto=...[;host="..."]` for a request whose `Host` is `host`.
    pub(super) fn forwarded(&self, host: Option<&HeaderValue>, proto: &str) -> Option<HeaderValue> {
        if let Ok(last) = self.last.lock()
            && let Some((h, v)) = last.as_ref()
            && h.as_ref() == host
        {
            return v.clone();
        }
        let mut fwd = format!("for={};proto={proto}", forwarded_for(self.ip));
        if let Some(host) = host.and_then(|v| v.to_str().ok()) {
            // A quoted-string (RFC 9110 section 5.6.4): `\` and `"` escaped.
            let quoted = host.replace('\\', "\\\\").replace('"', "\\\"");
            fwd.push_str(&format!(";host=\"{quoted}\""));
        }
        let v = HeaderValue::from_str(&fwd).ok();
        if let Ok(mut last) = self.last.lock() {
            *last = Some((host.cloned(), v.clone()));
        }
        v
    }
}
