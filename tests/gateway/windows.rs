//! Context windows: an engine's window learned from its `/v1/models` (or given in config), an
//! output budget cut to what the window leaves beside the prompt, a prompt sent only where it
//! fits, and a clear 400 in the client's dialect where it fits nowhere.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use tpsgate::sim::Fleet;
use tpsgate::sim::config::{EngineRaw, StreamRaw};

use crate::support;

/// Starts one simulated backend with a context window of `max_model_len` tokens (reported by
/// its `/v1/models`, refused past it as vLLM does).
pub(crate) async fn start_windowed(
    name: &str,
    engine: EngineRaw,
    max_model_len: u32,
) -> (Fleet, SocketAddr) {
    let mut raw = support::spec(name, engine, StreamRaw::default(), Vec::new()).raw;
    raw.max_model_len = Some(max_model_len);
    support::start(raw.validate("test").expect("test backend is valid")).await
}

/// A user message of `tokens` tokens as the simulator counts them (four bytes each).
fn prompt(tokens: usize) -> String {
    "word ".repeat(tokens * 4 / 5)
}

/// Waits until the gateway whose admin listener is `admin` knows `backend`'s window for `m`;
/// the window.
async fn window_known(admin: SocketAddr, backend: &str) -> Value {
    let backends = support::until(admin, "/admin/backends", Duration::from_secs(10), |v| {
        v["backends"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["name"] == backend && b["context_windows"]["m"].is_object())
    })
    .await;
    let found = backends["backends"].as_array().unwrap().iter();
    found
        .filter(|b| b["name"] == backend)
        .map(|b| b["context_windows"]["m"].clone())
        .next()
        .unwrap()
}

/// The output budget the gateway leaves beside a request body of `body_len` bytes in `window`:
/// its prompt estimated at a token per four bytes, and an eighth of that as margin.
fn room(window: u64, body_len: usize) -> u64 {
    let estimate = body_len as u64 / 4;
    window - estimate - estimate / 8
}

fn header<'a>(ex: &'a support::Exchange, name: &str) -> Option<&'a str> {
    ex.headers.get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_budget_past_the_engine_s_window_is_cut_to_fit_in_every_client_dialect() {
    let (_fleet, sim) = start_windowed("vllm", support::engine(1.0, 0.0, 8), 4096).await;
    let gw = support::gateway(&format!(
        "backends:\n{}",
        support::backend_yaml("vllm", sim, "openai", "    models: {m: m}\n")
    ))
    .await;
    // Learned from the engine's own `/v1/models`, as vLLM reports `max_model_len`.
    let window = window_known(gw.admin_addr(), "vllm").await;
    assert_eq!(window, json!({"tokens": 4096, "from": "/v1/models"}));

    let text = prompt(2000);
    let chat = json!({"model": "m", "max_tokens": 32000,
        "messages": [{"role": "user", "content": text}]});
    // The engine itself refuses it: 2,000 prompt tokens and 32,000 more do not fit in 4,096.
    let direct = support::post(sim, "/v1/chat/completions", &chat).await;
    assert_eq!(direct.status, StatusCode::BAD_REQUEST);
    assert!(
        direct.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 4096 tokens"),
        "{:?}",
        direct.json()
    );

    let messages = json!({"model": "m", "max_tokens": 32000,
        "messages": [{"role": "user", "content": text}]});
    let responses = json!({"model": "m", "max_output_tokens": 32000, "input": text});
    for (path, body) in [
        ("/v1/chat/completions", &chat),
        ("/v1/messages", &messages),
        ("/v1/responses", &responses),
    ] {
        let ex = support::post(gw.addr(), path, body).await;
        assert_eq!(ex.status, StatusCode::OK, "{path}: {:?}", ex.json());
        let budget = room(4096, body.to_string().len());
        assert_eq!(
            header(&ex, "x-tpsgate-clamped-max-tokens"),
            Some(budget.to_string().as_str()),
            "{path}"
        );
        let seen = support::seen(sim).await;
        let last = seen.last().unwrap();
        assert_eq!(
            last["max_tokens"], budget,
            "{path}: the engine got the cut budget"
        );
    }

    // A budget that fits goes as the client sent it, and nothing is said.
    let fits = json!({"model": "m", "max_tokens": 100,
        "messages": [{"role": "user", "content": text}]});
    let ex = support::post(gw.addr(), "/v1/chat/completions", &fits).await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(header(&ex, "x-tpsgate-clamped-max-tokens"), None);
    assert_eq!(support::seen(sim).await.last().unwrap()["max_tokens"], 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_goes_only_to_a_backend_whose_window_holds_it_and_gets_a_400_where_none_does() {
    let engine = support::engine(1.0, 0.0, 8);
    let (_small_fleet, small) = start_windowed("small", engine.clone(), 1024).await;
    let (_large_fleet, large) = start_windowed("large", engine, 8192).await;
    // The small engine's window given in config, by model; the large one's learned.
    let gw = support::gateway(&format!(
        "backends:\n{}{}",
        support::backend_yaml(
            "small",
            small,
            "openai",
            "    models: {m: m}\n    max_context_tokens: {m: 1024}\n"
        ),
        support::backend_yaml("large", large, "openai", "    models: {m: m}\n"),
    ))
    .await;
    assert_eq!(
        window_known(gw.admin_addr(), "small").await,
        json!({"tokens": 1024, "from": "config"})
    );
    assert_eq!(window_known(gw.admin_addr(), "large").await["tokens"], 8192);

    // 2,000 prompt tokens: past the small engine's window, within the large one's.
    let long = json!({"model": "m", "max_tokens": 16,
        "messages": [{"role": "user", "content": prompt(2000)}]});
    for _ in 0..6 {
        let ex = support::post(gw.addr(), "/v1/chat/completions", &long).await;
        assert_eq!(ex.status, StatusCode::OK, "{:?}", ex.json());
        assert_eq!(header(&ex, "x-tpsgate-backend"), Some("large"));
    }
    assert!(support::seen(small).await.is_empty());

    // 10,000 prompt tokens fit nowhere: the client is told so in its own dialect, with the
    // words and code agents read to compact their context, and no engine is sent it.
    let text = prompt(10_000);
    let chat = json!({"model": "m", "max_tokens": 16,
        "messages": [{"role": "user", "content": text}]});
    let ex = support::post(gw.addr(), "/v1/chat/completions", &chat).await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    let error = &ex.json()["error"];
    assert_eq!(error["code"], "context_length_exceeded");
    assert_eq!(error["type"], "invalid_request_error");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.starts_with("prompt is too long: ") && message.contains("> 8192 maximum"),
        "{message}"
    );
    let messages = json!({"model": "m", "max_tokens": 16,
        "messages": [{"role": "user", "content": text}]});
    let ex = support::post(gw.addr(), "/v1/messages", &messages).await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    let body = ex.json();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("prompt is too long: "),
        "{body}"
    );
    assert_eq!(support::seen(large).await.len(), 6);
    assert!(support::seen(small).await.is_empty());
}
