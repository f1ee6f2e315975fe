//! A request-head read timeout for `axum::serve`, which has no such setting: a [`Listener`]
//! whose connections fail their reads (so hyper closes them) when a request head — the request
//! line and headers, up to the empty line — is not complete within the timeout. The clock starts
//! when the connection is accepted, and for each later request on a kept-alive connection at its
//! first byte; bodies and responses are not timed. So a client that sends half a request line and
//! waits (a slow-header, "slowloris" client) is disconnected instead of holding a connection
//! forever. An idle kept-alive connection (no byte after a response) is not timed.
//!
//! Where a head ends is found by scanning the bytes hyper reads for an empty line (`\n\n` or
//! `\n\r\n` after some text); where a response starts, by hyper's first write of something that
//! is not an interim `HTTP/1.1 1xx` (such as `100 Continue`) after the head.
use axum::serve::Listener;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{sleep, Sleep};

/// The default time a client has to send a request head: 10 s.
pub const DEFAULT_HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// `inner` with every accepted connection wrapped in [`HeadTimed`].
pub struct HeadTimeout<L> {
    inner: L,
    timeout: Duration,
}

impl<L> HeadTimeout<L> {
    /// Connections of `inner` that must deliver each request head within `timeout`.
    pub fn new(inner: L, timeout: Duration) -> HeadTimeout<L> {
        HeadTimeout { inner, timeout }
    }
}

impl<L: Listener> Listener for HeadTimeout<L> {
    type Io = HeadTimed<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = self.inner.accept().await;
        (HeadTimed::new(io, self.timeout), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// Where a connection is in its request/response cycle.
enum Phase {
    /// Reading a request head, which must end before `deadline`. `newlines` counts the line
    /// ends in a row (CRs ignored), `text` says whether the head has a byte that is not one.
    Head {
        deadline: Pin<Box<Sleep>>,
        newlines: u8,
        text: bool,
    },
    /// The head is in: the body is read and the request handled, untimed.
    Body,
    /// The response has started; the next byte read starts the next head.
    Responded,
}

/// A connection whose request heads must arrive within a timeout (see the module docs); reads
/// fail with [`io::ErrorKind::TimedOut`] past it.
pub struct HeadTimed<T> {
    io: T,
    timeout: Duration,
    phase: Phase,
}

impl<T> HeadTimed<T> {
    fn new(io: T, timeout: Duration) -> HeadTimed<T> {
        let mut t = HeadTimed {
            io,
            timeout,
            phase: Phase::Body,
        };
        t.start_head();
        t
    }

    fn start_head(&mut self) {
        self.phase = Phase::Head {
            deadline: Box::pin(sleep(self.timeout)),
            newlines: 0,
            text: false,
        };
    }

    /// `bytes` were read: track where the head ends.
    fn scan(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if let Phase::Responded = self.phase {
            self.start_head();
        }
        let Phase::Head { newlines, text, .. } = &mut self.phase else {
            return;
        };
        for &b in bytes {
            match b {
                b'\n' if *text => {
                    *newlines += 1;
                    if *newlines == 2 {
                        self.phase = Phase::Body;
                        return;
                    }
                }
                b'\r' | b'\n' => {}
                _ => {
                    *text = true;
                    *newlines = 0;
                }
            }
        }
    }

    /// `first` bytes of a write: a response (not an interim 1xx) starts after its head.
    fn wrote(&mut self, first: &[u8]) {
        if matches!(self.phase, Phase::Body)
            && !first.is_empty()
            && !first.starts_with(b"HTTP/1.1 1")
        {
            self.phase = Phase::Responded;
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the client did not send a request head in time",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for HeadTimed<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.scan(&buf.filled()[before..]);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match &mut this.phase {
                Phase::Head { deadline, .. } => match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(timed_out())),
                    Poll::Pending => Poll::Pending,
                },
                _ => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for HeadTimed<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.wrote(&buf[..n.min(16)]);
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            this.wrote(&first[..n.min(first.len()).min(16)]);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
