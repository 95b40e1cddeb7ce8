//! Timed I/O: a connection's byte stream (plain TCP or rustls over TCP) wrapped so that
//! the last write and the first read of each exchange are stamped on the monotonic clock,
//! into atomics: the forwarding path takes no lock to time itself.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::clock;

/// Lock-free socket stamps shared between a connection's I/O and the exchange using it.
#[derive(Debug, Default)]
pub(crate) struct IoStamps {
    last_write_ns: AtomicU64,
    first_read_ns: AtomicU64,
}

impl IoStamps {
    /// Forget the previous exchange's stamps (a connection is reused).
    pub(crate) fn reset(&self) {
        self.last_write_ns.store(0, Ordering::Relaxed);
        self.first_read_ns.store(0, Ordering::Relaxed);
    }
    fn get(a: &AtomicU64) -> Option<u64> {
        match a.load(Ordering::Relaxed) {
            0 => None,
            v => Some(v),
        }
    }

    /// When the last byte was written since [`IoStamps::reset`] (0 is unset).
    pub(crate) fn last_write_ns(&self) -> Option<u64> {
        IoStamps::get(&self.last_write_ns)
    }

    /// When the first byte was read since [`IoStamps::reset`].
    pub(crate) fn first_read_ns(&self) -> Option<u64> {
        IoStamps::get(&self.first_read_ns)
    }
}

/// The connection's byte stream: plain TCP or rustls over TCP.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Stamps the last write and the first read of each exchange on the monotonic clock.
/// It sits above TLS, so handshake and session-ticket records never count as response
/// bytes.
pub(crate) struct TimedIo {
    pub(crate) inner: Stream,
    pub(crate) stamps: Arc<IoStamps>,
}

impl AsyncRead for TimedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let r = match &mut this.inner {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        if let Poll::Ready(Ok(())) = r
            && buf.filled().len() > before
            && this.stamps.first_read_ns.load(Ordering::Relaxed) == 0
        {
            this.stamps
                .first_read_ns
                .store(clock::now_ns(), Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = match &mut this.inner {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        };
        if let Poll::Ready(Ok(n)) = r
            && n > 0
        {
            this.stamps
                .last_write_ns
                .store(clock::now_ns(), Ordering::Relaxed);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = match &mut this.inner {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        };
        if let Poll::Ready(Ok(n)) = r
            && n > 0
        {
            this.stamps
                .last_write_ns
                .store(clock::now_ns(), Ordering::Relaxed);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
