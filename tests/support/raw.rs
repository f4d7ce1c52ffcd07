//! Backends written on raw sockets, for answers no real server would send, and a raw client.

use std::net::SocketAddr;
use std::time::Duration;

/// A backend that answers each request (read whole: head, and a body of its Content-Length)
/// with the bytes `answer` gives for it (the request's index on its connection, from 0, and the
/// request's bytes), written in one go; closes the connection after an answer when `close`
/// says so; the gateway's ask for its model list (`GET /v1/models`, for context windows) gets
/// an empty list, not `answer`. For responses no real server would send.
pub async fn raw_backend(
    answer: impl Fn(usize, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    close: bool,
) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let answer = std::sync::Arc::clone(&answer);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut i = 0;
                loop {
                    // One request: its head, then its body.
                    let head_end = loop {
                        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + length {
                        let mut chunk = [0u8; 4096];
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let request: Vec<u8> = buf.drain(..head_end + length).collect();
                    let reply = if head.starts_with("get /v1/models ") {
                        MODEL_LIST.to_vec()
                    } else {
                        i += 1;
                        answer(i - 1, &request)
                    };
                    if conn.write_all(&reply).await.is_err() {
                        return;
                    }
                    if close {
                        let _ = conn.shutdown().await;
                        return;
                    }
                }
            });
        }
    });
    addr
}

const MODEL_LIST: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"data\":[]}";

/// Sends `request` (raw bytes) to `addr` and reads until the server closes or `limit` passes;
/// what came back.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8], limit: Duration) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(limit, conn.read_to_end(&mut out)).await;
    out
}
