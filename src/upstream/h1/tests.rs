//! The HTTP/1.1 client against real sockets on loopback: framing, early answers, reuse.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt as _;
use hyper::body::Body as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use super::*;

/// A backend that answers the requests it reads, in order across its connections, with
/// `replies` (written as they are, then the connection closed where the flag says), and
/// records each request's bytes.
async fn scripted(replies: Vec<(&'static [u8], bool)>) -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let requests = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut replies = replies.into_iter();
        while let Ok((mut socket, _)) = listener.accept().await {
            while let Some(request) = read_request(&mut socket).await {
                requests.lock().unwrap().push(request);
                let Some((reply, close)) = replies.next() else {
                    return;
                };
                socket.write_all(reply).await.unwrap();
                if close {
                    break;
                }
            }
        }
    });
    (addr, seen)
}

/// One request off the socket (head and `Content-Length` body); `None` at its close.
async fn read_request(socket: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut fields);
        if let httparse::Status::Complete(len) = req.parse(&buf).unwrap() {
            let body: usize = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map_or(0, |h| {
                    std::str::from_utf8(h.value).unwrap().parse().unwrap()
                });
            if buf.len() >= len + body {
                return Some(buf);
            }
        }
        let mut more = [0u8; 4096];
        match socket.read(&mut more).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&more[..n]),
        }
    }
}

async fn connect(addr: SocketAddr) -> Connection {
    let tcp = TcpStream::connect(addr).await.unwrap();
    Connection::new(MaybeHttpsStream::Http(TokioIo::new(tcp)))
}

fn post(body: &'static str) -> Request<UpstreamBody> {
    Request::post("http://backend/v1/chat/completions")
        .header("host", "backend")
        .body(UpstreamBody::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

#[tokio::test]
async fn a_request_goes_out_whole_and_its_length_delimited_response_leaves_the_connection_reusable()
{
    let (addr, seen) = scripted(vec![
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", false),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nbye", false),
    ])
    .await;
    let resp = connect(addr).await.send(post(r#"{"a":1}"#)).await.unwrap();
    let mut body = resp.into_body();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "hello"
    );
    assert!(body.is_end_stream());
    let conn = body
        .take_reusable()
        .expect("the connection outlives a delimited body");
    let resp = conn.send(post("")).await.unwrap();
    assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "bye");
    let seen = seen.lock().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&seen[0]),
        "POST /v1/chat/completions HTTP/1.1\r\nhost: backend\r\ncontent-length: 7\r\n\r\n{\"a\":1}"
    );
    assert!(seen[1].ends_with(b"content-length: 0\r\n\r\n"));
}

#[tokio::test]
async fn chunks_come_through_as_frames_with_their_trailers() {
    let (addr, _) = scripted(vec![(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
          6;note=x\r\ndata: \r\n3\r\none\r\n0\r\nx-usage: 7\r\n\r\n",
        false,
    )])
    .await;
    let resp = connect(addr).await.send(post("{}")).await.unwrap();
    let mut body = resp.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        frames.push(frame.unwrap());
    }
    assert_eq!(frames.len(), 3);
    assert_eq!(frames[0].data_ref().unwrap(), "data: ");
    assert_eq!(frames[1].data_ref().unwrap(), "one");
    assert_eq!(frames[2].trailers_ref().unwrap()["x-usage"], "7");
    assert!(body.take_reusable().is_some());
}

#[tokio::test]
async fn a_body_the_backend_cuts_short_ends_in_an_error_never_a_quiet_end() {
    let (addr, _) = scripted(vec![(
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello",
        true,
    )])
    .await;
    let resp = connect(addr).await.send(post("{}")).await.unwrap();
    let err = resp.into_body().collect().await.unwrap_err();
    assert!(matches!(err, Error::ClosedInBody), "{err}");
}

#[tokio::test]
async fn a_body_without_length_is_read_to_the_close_and_the_connection_not_kept() {
    let (addr, _) = scripted(vec![(b"HTTP/1.1 200 OK\r\n\r\nall of it", true)]).await;
    let resp = connect(addr).await.send(post("{}")).await.unwrap();
    let mut body = resp.into_body();
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        read.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    assert_eq!(read, b"all of it");
    assert!(body.take_reusable().is_none());
}

#[tokio::test]
async fn a_connection_the_backend_closed_is_seen_closed_before_a_request_is_written() {
    let (addr, _) = scripted(vec![(b"HTTP/1.1 204 No Content\r\n\r\n", true)]).await;
    let mut body = connect(addr)
        .await
        .send(post("{}"))
        .await
        .unwrap()
        .into_body();
    let mut conn = body.take_reusable().expect("a 204 has no body to wait for");
    for _ in 0..100 {
        if !conn.is_open() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the backend's close was never seen");
}

/// A backend that reads a request's head, answers 413 at once and reads no more of it:
/// then keeps the connection open, or closes it (a reset, with the body unread).
async fn answering_early(then_close: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_head(&mut socket).await;
        socket
            .write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 9\r\n\r\ntoo large")
            .await
            .unwrap();
        if !then_close {
            std::future::pending::<()>().await;
        }
    });
    addr
}

/// Reads a request's head off the socket and returns what came after it (the body's start).
async fn read_head(socket: &mut TcpStream) -> Vec<u8> {
    let mut read = Vec::new();
    loop {
        if let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            return read.split_off(end + 4);
        }
        let mut more = [0u8; 4096];
        let n = socket.read(&mut more).await.unwrap();
        assert!(n > 0, "closed before the request's head");
        read.extend_from_slice(&more[..n]);
    }
}

/// Sends a body far larger than loopback's socket buffers take, so that the write waits on
/// the backend, and returns the response, which must come within seconds.
async fn send_large(addr: SocketAddr, len: usize) -> Response<Body> {
    let req = Request::post("http://backend/v1/chat/completions")
        .header("host", "backend")
        .body(UpstreamBody::new(Bytes::from(vec![b'x'; len])))
        .unwrap();
    let conn = connect(addr).await;
    tokio::time::timeout(std::time::Duration::from_secs(20), conn.send(req))
        .await
        .expect("a response within seconds")
        .map_err(|(e, _)| e)
        .unwrap()
}

/// The early answer comes back whole, the connection not kept.
async fn early_answer_is_heard(addr: SocketAddr) {
    let resp = send_large(addr, 64 << 20).await;
    assert_eq!(resp.status(), 413);
    let mut body = resp.into_body();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "too large"
    );
    assert!(body.is_end_stream());
    assert!(
        body.take_reusable().is_none(),
        "the backend still expects the rest of the request"
    );
}

#[tokio::test]
async fn a_backend_that_answers_before_reading_a_large_body_is_heard_and_the_rest_not_sent() {
    early_answer_is_heard(answering_early(false).await).await;
}

#[tokio::test]
async fn a_backend_that_answers_early_and_resets_the_connection_is_still_heard() {
    early_answer_is_heard(answering_early(true).await).await;
}

#[tokio::test]
async fn an_interim_continue_while_a_large_body_goes_out_does_not_stop_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body_len = 64 << 20;
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut read = read_head(&mut socket).await.len();
        socket
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .unwrap();
        let mut more = vec![0u8; 64 << 10];
        while read < body_len {
            let n = socket.read(&mut more).await.unwrap();
            assert!(n > 0, "the request was cut short");
            read += n;
        }
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await
            .unwrap();
        std::future::pending::<()>().await;
    });
    let resp = send_large(addr, body_len).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "ok"
    );
    assert!(body.take_reusable().is_some(), "the request went out whole");
}

#[tokio::test]
async fn a_backend_that_closes_without_answering_fails_the_request_as_closed_before_its_head() {
    let (addr, _) = scripted(vec![(b"", true)]).await;
    let (err, unsent) = connect(addr).await.send(post("{}")).await.unwrap_err();
    assert!(matches!(err, Error::ClosedBeforeHead), "{err}");
    assert!(unsent.is_none(), "it was written");
}

#[tokio::test]
async fn bytes_a_backend_sends_after_a_response_are_never_the_next_requests_answer() {
    // A buggy backend answers the first request, then, a moment later, answers it again: that
    // second answer must not become the answer to the next request on the connection, which
    // goes back unsent instead (for the pool to send on a new connection).
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stray_sent, stray_arrived) = tokio::sync::oneshot::channel();
    let backend = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket).await.unwrap();
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst";
        socket.write_all(answer).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray")
            .await
            .unwrap();
        stray_sent.send(()).unwrap();
        // What else the client writes: nothing, if the next request went back unsent.
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest).await;
        rest
    });
    let resp = connect(addr).await.send(post("{}")).await.unwrap();
    let mut body = resp.into_body();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "first"
    );
    let conn = body
        .take_reusable()
        .expect("nothing came after the body yet");
    stray_arrived.await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;

    let (err, unsent) = conn.send(post("{}")).await.unwrap_err();
    assert!(matches!(err, Error::Unasked), "{err}");
    assert!(unsent.is_some(), "handed back unsent");
    assert!(backend.await.unwrap().is_empty(), "nothing was written");
}
