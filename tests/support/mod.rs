//! Shared helpers of the integration tests: simulated backends on port 0 and a client that
//! records what arrives and when.

#![allow(
    dead_code,
    unused_imports,
    unreachable_pub,
    reason = "each test binary uses a different subset"
)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::time::Instant;
use tpsgate::bench::{BenchDialect, HttpClient, RequestSpec, http_client};
use tpsgate::sim::config::{BackendRaw, EngineRaw, FaultRaw, StreamRaw};
use tpsgate::sim::{BackendSpec, Fleet};

mod raw;
pub use raw::{raw_backend, raw_exchange};

/// A backend spec on 127.0.0.1:0 serving model `m`.
pub fn spec(
    name: &str,
    engine: EngineRaw,
    stream: StreamRaw,
    faults: Vec<FaultRaw>,
) -> BackendSpec {
    BackendRaw {
        name: name.to_owned(),
        listen: "127.0.0.1:0".to_owned(),
        models: vec!["m".to_owned()],
        tls: None,
        device: None,
        engine,
        stream,
        faults,
        prefix_cache: None,
        max_model_len: None,
    }
    .validate("test")
    .expect("test backend is valid")
}

/// Engine settings with no prefill cost unless given.
pub fn engine(step_base_ms: f64, step_per_seq_ms: f64, max_batch: u32) -> EngineRaw {
    EngineRaw {
        step_base_ms,
        step_per_seq_ms,
        max_batch: Some(max_batch),
        ..EngineRaw::default()
    }
}

/// Starts one backend and returns the fleet and its address.
pub async fn start(spec: BackendSpec) -> (Fleet, SocketAddr) {
    let name = spec.name.clone();
    let fleet = Fleet::start(&[spec]).await.expect("bind on port 0");
    let addr = fleet.addr(&name).expect("started");
    (fleet, addr)
}

/// Keeps simulated fleets running until dropped.
pub struct FleetGuard(pub Vec<Fleet>);

/// Starts one backend with default stream options and no faults.
pub async fn start_engine(name: &str, engine: EngineRaw) -> (Fleet, SocketAddr) {
    start(spec(name, engine, StreamRaw::default(), Vec::new())).await
}

/// A streaming bench request for model `m`.
pub fn request(
    addr: SocketAddr,
    dialect: BenchDialect,
    prompt_tokens: u32,
    max_tokens: u32,
) -> RequestSpec {
    RequestSpec::new(
        &base(addr),
        dialect,
        "m",
        prompt_tokens,
        max_tokens,
        Vec::new(),
    )
    .expect("valid request")
}

/// `http://ADDR`.
pub fn base(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// Everything one response delivered.
#[derive(Debug)]
pub struct Exchange {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Time from sending to the response head.
    pub head_after: Duration,
    /// Each body frame with its arrival time since sending.
    pub frames: Vec<(Duration, Bytes)>,
    /// The body error, if the body broke.
    pub error: Option<String>,
}

impl Exchange {
    /// The whole body.
    pub fn body(&self) -> Vec<u8> {
        self.frames.iter().flat_map(|(_, b)| b.to_vec()).collect()
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body()).expect("JSON body")
    }

    /// The `data:` payloads of an SSE body, `[DONE]` included.
    pub fn data_events(&self) -> Vec<String> {
        String::from_utf8(self.body())
            .expect("utf-8")
            .split("\n\n")
            .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(str::to_owned)
            .collect()
    }
}

/// Sends `method path` with a JSON body (or none) and records the response as it arrives.
pub async fn exchange(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Option<&[u8]>,
) -> Exchange {
    exchange_with(&http_client(None).unwrap(), addr, method, path, body).await
}

/// [`exchange`] on a given client.
pub async fn exchange_with(
    client: &HttpClient,
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Option<&[u8]>,
) -> Exchange {
    send(
        client,
        addr,
        method,
        path,
        body,
        &[("content-type", "application/json")],
    )
    .await
}

/// Sends a request with exactly these headers and records the response as it arrives.
pub async fn send(
    client: &HttpClient,
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> Exchange {
    let mut builder = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(Full::new(Bytes::copy_from_slice(body.unwrap_or_default())))
        .unwrap();
    record(client.request(request)).await
}

/// Records a response as it arrives.
pub async fn record<B>(
    response: impl std::future::Future<Output = Result<http::Response<B>, impl std::fmt::Debug>>,
) -> Exchange
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let start = Instant::now();
    let response = response.await.expect("response head");
    let head_after = start.elapsed();
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let mut frames = Vec::new();
    let mut error = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    frames.push((start.elapsed(), data));
                }
            }
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    Exchange {
        status,
        headers,
        head_after,
        frames,
        error,
    }
}

/// POSTs a JSON value.
pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> Exchange {
    exchange(addr, Method::POST, path, Some(body.to_string().as_bytes())).await
}

/// GETs a JSON document.
pub async fn get_json(addr: SocketAddr, path: &str) -> Value {
    let ex = exchange(addr, Method::GET, path, None).await;
    assert_eq!(ex.status, StatusCode::OK, "GET {path}");
    ex.json()
}

/// The analytic point of a backend at concurrency `c`.
pub async fn truth(addr: SocketAddr, prompt_tokens: u32, output_tokens: u32, c: usize) -> Value {
    let curve = get_json(
        addr,
        &format!("/sim/truth?prompt_tokens={prompt_tokens}&output_tokens={output_tokens}"),
    )
    .await;
    curve["points"][c - 1].clone()
}

/// |got - want| / want.
pub fn rel_err(got: f64, want: f64) -> f64 {
    (got - want).abs() / want
}

/// A gateway config backend entry for a sim at `addr`.
/// A loopback address that refuses connections, held for as long as the socket lives: the
/// port is bound but not listened on, so no server another test starts in parallel can take it.
pub fn refusing_port() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind("127.0.0.1:0".parse().unwrap())
        .expect("a free port");
    let addr = socket.local_addr().expect("its address");
    (socket, addr)
}

pub fn backend_yaml(name: &str, addr: SocketAddr, dialect: &str, extra: &str) -> String {
    format!("  - name: {name}\n    url: http://{addr}\n    dialect: {dialect}\n{extra}")
}

/// Starts a gateway from config text on port 0 (both listeners). Environment lookups answer
/// `key-of-NAME` for every variable NAME.
pub async fn gateway(body: &str) -> tpsgate::gateway::Gateway {
    let admin = if body.contains("admin:") {
        ""
    } else {
        "admin: {listen: 127.0.0.1:0}\n"
    };
    let text = format!("listen: {{address: 127.0.0.1:0}}\n{admin}{body}");
    let config = tpsgate::config::parse(&text, |name| Some(format!("key-of-{name}")))
        .map_err(|e| format!("test config: {e}\n{text}"))
        .unwrap();
    tpsgate::gateway::Gateway::start(&config)
        .await
        .expect("gateway starts")
}

/// The generation requests a sim backend received, oldest first.
/// Waits up to `limit` for `check` to hold on `admin`'s answer at `path`; the last answer.
pub async fn until(
    admin: SocketAddr,
    path: &str,
    limit: Duration,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let got = get_json(admin, path).await;
        if check(&got) || tokio::time::Instant::now() >= deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn seen(addr: SocketAddr) -> Vec<Value> {
    get_json(addr, "/sim/requests").await["requests"]
        .as_array()
        .unwrap()
        .clone()
}

/// The body with every `"created":DIGITS` set to 0: the only bytes two identical requests to
/// the simulator may differ in (it is a clock reading in seconds).
pub fn without_created(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out = String::with_capacity(text.len());
    let mut rest = &*text;
    while let Some(at) = rest.find("\"created\":") {
        let (head, tail) = rest.split_at(at + "\"created\":".len());
        out.push_str(head);
        out.push('0');
        rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// The `tpsgate` binary under test.
pub fn tpsgate() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_tpsgate"))
}

/// A `tpsgate` process serving on the address it printed first; killed when dropped.
pub struct Spawned {
    pub child: std::process::Child,
    pub addr: SocketAddr,
    /// `admin http://ADDR` on the same line, if printed.
    pub admin: Option<SocketAddr>,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The admin address a spawned `tpsgate serve` printed (`admin http://ADDR`).
pub fn admin_of(spawned: &Spawned) -> SocketAddr {
    spawned
        .admin
        .expect("the first line named an admin address")
}

/// Starts `command` with stdout piped and waits for its first line, which names `http://ADDR`.
pub async fn spawn_listening(mut command: std::process::Command) -> Spawned {
    use std::io::BufRead;
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        line
    })
    .await
    .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("no address in {line:?}"))
        .unwrap();
    let admin = line
        .split("admin http://")
        .nth(1)
        .and_then(|rest| rest.split([')', ' ']).next())
        .and_then(|a| a.parse().ok());
    Spawned { child, addr, admin }
}

/// A gateway with one backend: the sim at `sim`, serving `extra` (YAML lines of the backend).
pub async fn gateway_for(sim: SocketAddr, dialect: &str, extra: &str) -> tpsgate::gateway::Gateway {
    gateway(&format!(
        "backends:\n{}",
        backend_yaml("sim", sim, dialect, extra)
    ))
    .await
}

/// One closed-loop level of `tpsgate bench` against `addr`: `n` measured requests at
/// concurrency `c`, without a progress bar.
pub async fn closed_level(
    addr: SocketAddr,
    dialect: BenchDialect,
    prompt: u32,
    output: u32,
    c: usize,
    n: usize,
) -> tpsgate::bench::LevelReport {
    let spec = request(addr, dialect, prompt, output);
    let bar = indicatif::ProgressBar::hidden();
    let limit = std::time::Duration::from_secs(60);
    let mix = tpsgate::bench::Mix::fixed(prompt, output);
    tpsgate::bench::closed_loop(&http_client(None).unwrap(), &spec, &mix, c, n, limit, &bar).await
}

/// Reading the gateway's measured curves.
pub mod curves {
    use serde_json::Value;
    use tpsgate::bench::{BenchDialect, LevelReport};

    // Short prompts: a burst of warm-up requests (all admitted at once) stacks their prefills, which
    // the gateway measures honestly and the truth, assuming spread arrivals, does not describe.
    pub const PROMPT: u32 = 8;
    pub const OUTPUT: u32 = 32;

    pub async fn level(gw: std::net::SocketAddr, c: usize, n: usize) -> LevelReport {
        super::closed_level(gw, BenchDialect::Openai, PROMPT, OUTPUT, c, n).await
    }

    pub async fn curve(admin: std::net::SocketAddr) -> Value {
        let all = super::get_json(admin, "/admin/curves").await;
        all["curves"][0].clone()
    }

    pub fn point(curve: &Value, c: u64) -> Value {
        curve["points"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["concurrency"] == c)
            .cloned()
            .ok_or_else(|| format!("no bucket {c} in {curve}"))
            .unwrap()
    }
}

/// A real Redis (Debian's `redis-server`, which `.ci/run` installs) on a free loopback port,
/// with no persistence, stopped when dropped.
pub struct Redis {
    child: Option<std::process::Child>,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Redis {
    /// Starts one on a free port and waits until it answers.
    pub async fn start() -> Self {
        Self::on_a_free_port(|port| vec!["--port".into(), port.to_string()]).await
    }

    /// Starts one on `port` (again, after [`Redis::kill`]) and waits until it answers.
    pub async fn on(port: u16) -> Self {
        Self::spawn(port, &["--port".into(), port.to_string()])
            .await
            .expect("redis-server listens on the port it was given")
    }

    /// Starts one that speaks only TLS, with the PEM certificate and key given, on a free port,
    /// and waits until it accepts connections (clients are not asked for certificates).
    pub async fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> Self {
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        Self::on_a_free_port(|port| {
            [
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-auth-clients",
                "no",
            ]
            .map(String::from)
            .into()
        })
        .await
    }

    /// Starts one with `args(port)` on a port free a moment ago; on another where a server a
    /// test started in parallel took that one in between (redis-server then exits at once).
    async fn on_a_free_port(args: impl Fn(u16) -> Vec<String>) -> Self {
        let mut started = None;
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            started = Self::spawn(port, &args(port)).await;
            if started.is_some() {
                break;
            }
        }
        started.expect("redis-server listens on one of three ports free a moment before")
    }

    /// `None` where it exited before answering (its port was taken).
    async fn spawn(port: u16, args: &[String]) -> Option<Self> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let child = std::process::Command::new("redis-server")
            .args(args)
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server starts: install it with `apt-get install redis-server` (.ci/run does)");
        let mut redis = Self {
            child: Some(child),
            port,
            _dir: dir,
        };
        let tls = args.iter().any(|a| a == "--tls-port");
        for _ in 0..200 {
            if redis.ready(tls).await {
                return Some(redis);
            }
            if let Some(child) = redis.child.as_mut()
                && matches!(child.try_wait(), Ok(Some(_)))
            {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            redis.ready(tls).await,
            "redis-server on port {port} did not answer within 2 s"
        );
        Some(redis)
    }

    /// Whether it answers: PING, or over TLS, a connection.
    async fn ready(&self, tls: bool) -> bool {
        if tls {
            tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
        } else {
            self.ping().await
        }
    }

    /// Whether it answers PING.
    pub async fn ping(&self) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut conn) = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await else {
            return false;
        };
        let mut reply = [0u8; 7];
        conn.write_all(b"PING\r\n").await.is_ok()
            && conn.read_exact(&mut reply).await.is_ok()
            && &reply == b"+PONG\r\n"
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Stops it at once (as a crash would: nothing is said to the clients).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// CPU seconds (user and system) the process `pid` has used so far, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("a running process");
    // Fields after the command name (which is in parentheses and may hold spaces).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    let per_second = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0);
    ticks / per_second
}

/// `program`, when it runs (`--version`); else the test fails, naming what installs it: no test
/// passes by skipping itself.
pub fn tool(program: &str, package: &str) -> std::path::PathBuf {
    let runs = std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok();
    assert!(
        runs,
        "{program} is missing: run .ci/test, which installs what the tests need (or apt-get install {package})"
    );
    std::path::PathBuf::from(program)
}

/// A program of the tests' Python venv (`TPSGATE_TEST_VENV`, else `target/test-venv`), which
/// `.ci/install` makes; the test fails, naming it, when it is not there.
pub fn venv_program(name: &str) -> std::path::PathBuf {
    let venv = std::env::var_os("TPSGATE_TEST_VENV").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv"),
        std::path::PathBuf::from,
    );
    let program = venv.join("bin").join(name);
    assert!(
        program.exists(),
        "{} is missing: run .ci/test, which makes the tests' venv ({})",
        program.display(),
        venv.display()
    );
    program
}

/// The names of the backends the admin plane at `admin` lists, in its order.
pub async fn backend_names(admin: SocketAddr) -> Vec<String> {
    get_json(admin, "/admin/backends").await["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_owned())
        .collect()
}

/// A simulator named `name` on `listen` serving HTTPS with a fresh self-signed certificate for
/// the host name `host`, written to `dir` (cert.pem, key.pem): the fleet, the certificate and
/// its file.
pub async fn tls_sim(
    name: &str,
    listen: &str,
    host: &str,
    dir: &std::path::Path,
) -> (
    Fleet,
    rcgen::CertifiedKey<rcgen::KeyPair>,
    std::path::PathBuf,
) {
    let cert = rcgen::generate_simple_self_signed(vec![host.to_owned()]).unwrap();
    let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_file, cert.cert.pem()).unwrap();
    std::fs::write(&key_file, cert.signing_key.serialize_pem()).unwrap();
    let sim = BackendRaw {
        name: name.into(),
        listen: listen.into(),
        models: vec!["m".into()],
        tls: Some(tpsgate::sim::config::SimTls {
            cert_file: cert_file.clone(),
            key_file,
        }),
        device: None,
        engine: EngineRaw {
            step_base_ms: 1.0,
            ..EngineRaw::default()
        },
        stream: StreamRaw::default(),
        faults: vec![],
        prefix_cache: None,
        max_model_len: None,
    }
    .validate("test")
    .unwrap();
    (Fleet::start(&[sim]).await.unwrap(), cert, cert_file)
}

/// A chat stream through the gateway at `gw` for `model`, of `max_tokens`, held open: its
/// status checked (200) and its first frame read.
pub async fn open_stream(gw: SocketAddr, model: &str, max_tokens: u32) -> hyper::body::Incoming {
    let body = serde_json::json!({"model": model, "messages": [], "max_tokens": max_tokens, "stream": true});
    let request = Request::post(format!("http://{gw}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = http_client(None).unwrap().request(request).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    assert!(body.frame().await.unwrap().unwrap().is_data());
    body
}

/// Headless Chromium on the dashboard at `admin`, with `extra` (`--dump-dom`,
/// `--screenshot=FILE`), after its script had 8 s of virtual time to fetch and draw. `.ci/test`
/// installs Chromium (Debian `chromium`).
pub async fn chromium(admin: SocketAddr, extra: &str) -> std::process::Output {
    let browser = tool("chromium", "chromium");
    let (url, extra) = (format!("http://{admin}/"), extra.to_owned());
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--virtual-time-budget=8000",
                "--window-size=1280,2400",
            ])
            .arg(extra)
            .arg(url)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The dashboard at `admin` as Chromium rendered it.
pub async fn dashboard_dom(admin: SocketAddr) -> String {
    let dom = chromium(admin, "--dump-dom").await;
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    String::from_utf8_lossy(&dom.stdout).into_owned()
}
