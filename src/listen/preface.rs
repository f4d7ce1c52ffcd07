//! Telling HTTP/2 (with prior knowledge) from HTTP/1.1 on a plain-TCP connection by its first
//! bytes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::net::TcpStream;

/// The first bytes of an HTTP/2 connection with prior knowledge (RFC 9113, section 3.4).
pub(super) const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether a plain-TCP client opens with the HTTP/2 preface, from the bytes it sent first:
/// they are read (a read that finds nothing waits for the socket, where a peek would return the
/// same partial bytes at once, again and again) and handed back first by the [`Prefixed`]
/// stream the connection is then served on.
///
/// Why not hyper-util's auto builder, which tells them apart too: its connection future holds
/// the HTTP/1 and the HTTP/2 state inline, so every HTTP/1 connection's task is the size of
/// both, and an idle stream kept more resident memory (docs/benchmarks/overhead.md, "Per-request trims and
/// plain-TCP connections").
pub(super) async fn opens_with_h2_preface(mut stream: TcpStream) -> io::Result<Prefixed> {
    use tokio::io::AsyncReadExt as _;
    let mut first = [0u8; H2_PREFACE.len()];
    let mut n = 0;
    while n < first.len() {
        let got = stream.read(&mut first[n..]).await?;
        if got == 0 {
            break;
        }
        n += got;
        if first[..n] != H2_PREFACE[..n] {
            break;
        }
    }
    Ok(Prefixed {
        h2: first[..n] == H2_PREFACE[..],
        first,
        len: n,
        given: 0,
        stream,
    })
}

/// A client's connection with the bytes read to tell HTTP/1 from HTTP/2 given back first.
#[derive(Debug)]
pub(super) struct Prefixed {
    stream: TcpStream,
    first: [u8; H2_PREFACE.len()],
    len: usize,
    given: usize,
    /// They were the HTTP/2 preface.
    pub(super) h2: bool,
}

impl tokio::io::AsyncRead for Prefixed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.given < this.len {
            let n = (this.len - this.given).min(buf.remaining());
            buf.put_slice(&this.first[this.given..this.given + n]);
            this.given += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Prefixed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    use super::*;

    /// What `opens_with_h2_preface` says of a client that sends `parts`, a pause between each.
    async fn told(parts: &[&[u8]]) -> bool {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let parts: Vec<Vec<u8>> = parts.iter().map(|p| p.to_vec()).collect();
        tokio::spawn(async move {
            for part in parts {
                client.write_all(&part).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        opens_with_h2_preface(server).await.unwrap().h2
    }

    #[tokio::test]
    async fn the_h2_preface_is_told_from_http1_even_when_it_arrives_in_pieces() {
        assert!(told(&[H2_PREFACE]).await);
        assert!(told(&[b"PRI * HT", b"TP/2.0\r\n\r\nSM", b"\r\n\r\n"]).await);
        assert!(!told(&[b"POST /v1/chat/completions HTTP/1.1\r\n"]).await);
        assert!(!told(&[b"P", b"OST / HTTP/1.1\r\n"]).await);
        assert!(
            !told(&[]).await,
            "a client that closes at once is left to HTTP/1"
        );
    }
}
