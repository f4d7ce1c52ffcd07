//! Clients that hold a connection without using it (a part of the HTTP/2 preface, idle
//! streams, a body trickled a byte at a time, a client that stops reading), responses that end
//! in trailers, and uploads that name no model: each costs bounded time and memory and gives its
//! connection back.

use std::time::Duration;

use http::StatusCode;

use super::hardening::{chat, chunked, gateway_to};
use crate::support;

#[tokio::test]
async fn connections_that_send_part_of_the_http2_preface_and_wait_cost_no_cpu() {
    // Regression: the listener peeked, slept 1 ms and peeked again until the header timeout:
    // 1,500 such connections used half a core.
    use tokio::io::AsyncWriteExt as _;
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        format!(
            "listen: {{address: 127.0.0.1:0}}\nadmin: {{listen: 127.0.0.1:0}}\nbackends:\n{}",
            support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
        ),
    )
    .unwrap();
    let mut command = support::tpsgate();
    command
        .args(["serve", "--config"])
        .arg(file.path())
        .stderr(std::process::Stdio::null());
    let gw = support::spawn_listening(command).await;
    let mut held = Vec::new();
    for _ in 0..300 {
        let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        conn.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        held.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = support::cpu_seconds(gw.child.id());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = support::cpu_seconds(gw.child.id()) - before;
    assert!(
        used < 0.1,
        "{used:.2} CPU seconds in 2 s while 300 connections wait"
    );
    drop(held);
}

#[tokio::test]
async fn idle_http2_connections_do_not_keep_a_client_out_for_good() {
    // Regression: with max_connections: 20, twenty idle h2c connections (preface and SETTINGS,
    // then nothing) kept a legitimate client out for good.
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = gateway_to(
        sim,
        "",
        "limits: {max_connections: 2, idle_timeout_s: 0.5}\n",
    )
    .await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut conn = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
        conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await
            .unwrap();
        idle.push(conn);
    }
    let started = tokio::time::Instant::now();
    let mut client = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    client
        .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
        .await
        .expect("served once an idle connection is closed")
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    drop(idle);
}

#[tokio::test]
async fn a_request_body_trickled_a_byte_at_a_time_gets_a_408_and_frees_its_connection() {
    // Regression: bodies trickling one byte every 3 s held connection slots for good.
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = gateway_to(
        sim,
        "",
        "limits: {body_read_timeout_s: 0.5, body_min_bytes_per_s: 100}\n",
    )
    .await;
    let mut conn = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    conn.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{",
    )
    .await
    .unwrap();
    let trickle = tokio::spawn(async move {
        let mut reply = Vec::new();
        let mut buf = [0u8; 1024];
        for _ in 0..50 {
            if conn.write_all(b" ").await.is_err() {
                break;
            }
            if let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf)).await
            {
                if n == 0 {
                    break;
                }
                reply.extend_from_slice(&buf[..n]);
            }
        }
        reply
    });
    let reply = tokio::time::timeout(Duration::from_secs(8), trickle)
        .await
        .expect("refused long before the body could finish")
        .unwrap();
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
}

#[tokio::test]
async fn a_client_that_stops_reading_loses_its_connection_and_the_backend_slot_is_released() {
    // Regression: a client that read nothing held the backend's slot (and its KV cache) for as
    // long as its socket stayed open: deadlines are not checked while hyper cannot write.
    use tokio::io::AsyncWriteExt as _;
    let answer = |_: usize, _: &[u8]| {
        let event = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}}]}\n\n";
        let body = event.repeat(400_000); // ~44 MB, far more than the sockets hold
        let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        out.extend_from_slice(&chunked(body.as_bytes()));
        out
    };
    let gw = gateway_to(
        support::raw_backend(answer, false).await,
        "",
        "limits: {client_write_timeout_s: 0.5}\n",
    )
    .await;
    let mut client = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    client
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 29\r\n\r\n{\"model\":\"m\",\"stream\":true}  ")
        .await
        .unwrap();
    // Never read. The backend's slot is taken, then released once the write times out.
    let in_flight = async || {
        support::get_json(gw.admin_addr(), "/admin/backends").await["backends"][0]["in_flight"]
            .as_u64()
            .unwrap()
    };
    let mut seen_busy = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = in_flight().await;
        seen_busy |= n == 1;
        if seen_busy && n == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was never released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = support::exchange(gw.admin_addr(), http::Method::GET, "/metrics", None).await;
    let metrics = String::from_utf8(metrics.body()).unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tpsgate_client_write_timeouts_total ")),
        "counted"
    );
    drop(client);
}

#[tokio::test]
async fn a_response_that_ends_in_trailers_gives_its_connection_back_for_the_next_request() {
    // Regression: the trailers ended the body but the connection was not given back (the
    // framing counted the body over only when polled once more, which nobody did), so every
    // such response cost a new connection.
    let answer = |i: usize, _: &[u8]| {
        let body = format!("{{\"id\":\"x\",\"request_on_connection\":{i}}}");
        let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                        transfer-encoding: chunked\r\n\r\n"
            .to_vec();
        out.extend_from_slice(
            format!("{:x}\r\n{body}\r\n0\r\nx-checksum: 1\r\n\r\n", body.len()).as_bytes(),
        );
        out
    };
    // A window in the config: the gateway never asks this backend for its model list, so no
    // ask races the first request for a second pooled connection.
    let gw = gateway_to(
        support::raw_backend(answer, false).await,
        "    max_context_tokens: 100000\n",
        "",
    )
    .await;
    for want in 0..3 {
        let ex = chat(&gw, false).await;
        assert_eq!(ex.status, StatusCode::OK);
        assert_eq!(
            ex.json()["request_on_connection"],
            want,
            "one connection, reused"
        );
    }
}

#[tokio::test]
async fn a_multipart_upload_reaches_the_default_backend_byte_for_byte() {
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    let store = std::sync::Arc::clone(&received);
    let backend = support::raw_backend(
        move |_: usize, request: &[u8]| {
            store.lock().unwrap().push(request.to_vec());
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n{\"text\":\"hi\"}\n\n"
                .to_vec()
        },
        false,
    )
    .await;
    let gw = gateway_to(backend, "", "default_backend: raw\n").await;
    let boundary = "tpsgate-boundary";
    // Bytes that are no JSON and no UTF-8: audio, as a client uploads it.
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
    )
    .into_bytes();
    body.extend((0..=255u8).cycle().take(70_000));
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let content_type = format!("multipart/form-data; boundary={boundary}");
    for path in ["/v1/audio/transcriptions", "/v1/files"] {
        let ex = support::send(
            &tpsgate::bench::http_client(None).unwrap(),
            gw.addr(),
            http::Method::POST,
            path,
            Some(&body),
            &[("content-type", &content_type)],
        )
        .await;
        assert_eq!(
            ex.status,
            StatusCode::OK,
            "{path}: {:?}",
            String::from_utf8_lossy(&ex.body())
        );
        let request = received.lock().unwrap().pop().unwrap();
        let head_end = request.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&request[..head_end]).to_ascii_lowercase();
        assert!(head.starts_with(&format!("post {path} ")), "{head}");
        assert!(
            head.contains(&format!("content-type: {content_type}")),
            "{head}"
        );
        assert!(
            request[head_end..] == body[..],
            "{path}: the body arrives unchanged"
        );
    }
}

#[tokio::test]
async fn a_route_sends_uploads_on_its_path_to_its_own_backend() {
    let answering = |name: &'static str| {
        move |_: usize, _: &[u8]| {
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{{\"by\":\"{name}\"}}",
                name.len() + 9
            )
            .into_bytes()
        }
    };
    let files = support::raw_backend(answering("files"), false).await;
    let whisper = support::raw_backend(answering("whisper"), false).await;
    let gw = support::gateway(&format!(
        "default_backend: files\nroutes:\n  - {{path: /v1/audio/transcriptions, backend: whisper}}\nbackends:\n{}{}",
        support::backend_yaml("files", files, "openai", "    models: {m: m}\n"),
        support::backend_yaml("whisper", whisper, "openai", "    models: {whisper-1: whisper-1}\n"),
    ))
    .await;
    let content_type = "multipart/form-data; boundary=b";
    let body = b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF\r\n--b--\r\n";
    for (path, by) in [
        ("/v1/audio/transcriptions", "whisper"),
        ("/v1/files", "files"),
    ] {
        let ex = support::send(
            &tpsgate::bench::http_client(None).unwrap(),
            gw.addr(),
            http::Method::POST,
            path,
            Some(body),
            &[("content-type", content_type)],
        )
        .await;
        assert_eq!(ex.status, StatusCode::OK, "{path}");
        assert_eq!(ex.json()["by"], by, "{path}");
        assert_eq!(ex.headers["x-tpsgate-backend"], by, "{path}");
    }
}
