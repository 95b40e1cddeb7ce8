//! A client connection on serve's own HTTP/1 core: its byte stream (plain TCP or TLS),
//! the bytes read from it and not yet used, request heads read under the limits
//! (`engine::http1::request`, hyper's server rules), and the refusals serve answers itself
//! (their heads written by `engine::http1::write`). Imports nothing else from serve.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use http::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::engine::http1::codec::CodecError;
use crate::engine::http1::request::{RequestHead, parse_request_head};
use crate::engine::http1::write;

/// A client's byte stream: plain TCP or rustls over TCP.
pub(super) trait DownIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> DownIo for T {}

/// Bytes asked for per read of a client connection (heads are small; a larger read
/// buffer per idle connection is memory ten thousand idle clients would hold).
const READ_CHUNK: usize = 4096;

/// One client connection.
pub(super) struct Down {
    pub(super) io: Box<dyn DownIo>,
    /// Bytes read and not yet used (the start of the next request, when pipelined).
    pub(super) buf: BytesMut,
}

/// What waiting for the next request head gave.
pub(super) enum NextHead {
    Head(Box<RequestHead>),
    /// The client closed (or went quiet past `--header-read-timeout`, or serve is
    /// stopping and no request had begun): close the connection.
    Closed,
    /// A head serve refuses, with the status it answers (400, 431).
    Refuse(StatusCode),
}

impl Down {
    pub(super) fn new(io: Box<dyn DownIo>) -> Down {
        Down {
            io,
            buf: BytesMut::new(),
        }
    }

    /// Read more bytes from the client: how many (0 at its close).
    pub(super) async fn read_more(&mut self) -> std::io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 4 {
            self.buf.reserve(READ_CHUNK);
        }
        self.io.read_buf(&mut self.buf).await
    }

    /// The next request head: read within `timeout` of starting to wait for it (idle
    /// time on a kept-alive connection counts, as in hyper), at most `limit` bytes of it.
    /// A connection with no request begun closes as soon as `stopping` turns true.
    pub(super) async fn next_head(
        &mut self,
        limit: usize,
        timeout: Duration,
        stopping: &mut watch::Receiver<bool>,
    ) -> NextHead {
        tokio::time::timeout(timeout, self.head_within(limit, stopping))
            .await
            .unwrap_or(NextHead::Closed)
    }

    /// [`Down::next_head`] without its deadline.
    async fn head_within(
        &mut self,
        limit: usize,
        stopping: &mut watch::Receiver<bool>,
    ) -> NextHead {
        loop {
            if !self.buf.is_empty() {
                match parse_request_head(&self.buf) {
                    Ok(Some((_, n))) if n > limit => {
                        return NextHead::Refuse(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
                    }
                    Ok(Some((head, n))) => {
                        self.buf.advance(n);
                        return NextHead::Head(Box::new(head));
                    }
                    Ok(None) if self.buf.len() > limit => {
                        return NextHead::Refuse(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
                    }
                    Ok(None) => {}
                    Err(CodecError::TooLarge) => {
                        return NextHead::Refuse(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
                    }
                    Err(_) => return NextHead::Refuse(StatusCode::BAD_REQUEST),
                }
            }
            let begun = self.buf.iter().any(|&b| b != b'\r' && b != b'\n');
            if *stopping.borrow() && !begun {
                return NextHead::Closed;
            }
            tokio::select! {
                r = self.read_more() => match r {
                    Ok(0) | Err(_) => return NextHead::Closed,
                    Ok(_) => {}
                },
                r = stopping.changed(), if !*stopping.borrow() => {
                    if r.is_err() {
                        return NextHead::Closed;
                    }
                }
            }
        }
    }

    /// Wait until the client closes its side (or its connection fails), keeping what it
    /// sends meanwhile (a pipelined request) up to `limit` bytes; past that, never ends.
    pub(super) async fn until_closed(&mut self, limit: usize) {
        loop {
            if self.buf.len() >= limit {
                std::future::pending::<()>().await;
            }
            match self.read_more().await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// Write `bytes` and flush.
    pub(super) async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.io.write_all(bytes).await?;
        self.io.flush().await
    }

    /// Answer a refused request (`status`, no body) and close: the write side first, then
    /// what the client still sends is read and dropped for a moment, so that unread bytes
    /// do not turn the close into a reset that could destroy the answer before the client
    /// reads it (nginx's lingering close).
    pub(super) async fn refuse(mut self, status: StatusCode) {
        if self.send(&write::refusal_head(status)).await.is_ok() {
            self.close().await;
        }
    }

    /// Close the connection: the write side, then a bounded lingering read.
    pub(super) async fn close(mut self) {
        let linger = async {
            let _ = self.io.shutdown().await;
            let mut sink = [0u8; 4096];
            for _ in 0..64 {
                match self.io.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(200), linger).await;
    }
}

/// When the client's side of a response ended, and whether completely.
#[derive(Debug)]
pub(super) struct DownstreamEnd {
    pub(super) at_ns: u64,
    pub(super) complete: bool,
}
