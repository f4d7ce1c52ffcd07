//! Aliases, credentials and ids: what reaches the upstream, and what never does.

use http::Method;
use serde_json::json;
use tpsgate::bench::http_client;

use crate::support;

const CHAT: &str = r#"{"model":"small","messages":[],"max_tokens":2,"stream":true}"#;

/// Sends [`CHAT`] to the gateway with `headers`.
async fn chat(gw: std::net::SocketAddr, headers: &[(&str, &str)]) -> support::Exchange {
    let path = "/v1/chat/completions";
    support::send(
        &http_client(None).unwrap(),
        gw,
        Method::POST,
        path,
        Some(CHAT.as_bytes()),
        headers,
    )
    .await
}

#[tokio::test]
async fn the_upstream_sees_its_own_model_name_and_the_configured_key_never_the_clients() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway_for(
        sim,
        "openai",
        "    models: {small: m}\n    api_key_env: SIM_KEY\n",
    )
    .await;
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer client-secret"),
        ("x-api-key", "client-secret"),
    ];
    let ex = chat(gw.addr(), &headers).await;
    assert_eq!(ex.status, 200, "{:?}", String::from_utf8_lossy(&ex.body()));
    let seen = support::seen(sim).await;
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["model"], "m");
    assert_eq!(seen[0]["authorization"], "Bearer key-of-SIM_KEY");
    assert_eq!(seen[0]["x_api_key"], json!(null));
}

#[tokio::test]
async fn a_key_can_go_bare_in_a_header_of_the_backends_choosing() {
    // Azure OpenAI's resource keys travel as `api-key: KEY`; the simulator shows `x-api-key`'s
    // value, so the test names that one.
    let (_fleet, sim) = support::start_engine("azure", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway_for(
        sim,
        "openai",
        "    models: {small: m}\n    api_key_env: AZURE_KEY\n    api_key_header: x-api-key\n",
    )
    .await;
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer client-secret"),
    ];
    let ex = chat(gw.addr(), &headers).await;
    assert_eq!(ex.status, 200, "{:?}", String::from_utf8_lossy(&ex.body()));
    let seen = support::seen(sim).await;
    assert_eq!(seen[0]["x_api_key"], "key-of-AZURE_KEY");
    assert_eq!(
        seen[0]["authorization"],
        json!(null),
        "the client's never goes up"
    );
}

#[tokio::test]
async fn an_anthropic_upstream_gets_x_api_key_and_a_default_version() {
    let (_fleet, sim) = support::start_engine("claude", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway_for(
        sim,
        "anthropic",
        "    models: {claude-small: m}\n    api_key_env: ANTHROPIC_KEY\n",
    )
    .await;
    let body = json!({"model": "claude-small", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer client-secret"),
    ];
    let ex = support::send(
        &http_client(None).unwrap(),
        gw.addr(),
        Method::POST,
        "/v1/messages",
        Some(body.as_bytes()),
        &headers,
    )
    .await;
    assert_eq!(ex.status, 200);
    let seen = &support::seen(sim).await[0];
    assert_eq!(seen["x_api_key"], "key-of-ANTHROPIC_KEY");
    assert_eq!(seen["anthropic_version"], "2023-06-01");
    assert_eq!(seen["authorization"], json!(null));
}

#[tokio::test]
async fn forward_client_auth_passes_the_clients_key_through() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway_for(
        sim,
        "openai",
        "    models: {small: m}\n    forward_client_auth: true\n",
    )
    .await;
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer client-secret"),
    ];
    chat(gw.addr(), &headers).await;
    assert_eq!(
        support::seen(sim).await[0]["authorization"],
        "Bearer client-secret"
    );
}

#[tokio::test]
async fn request_ids_are_kept_or_minted_and_reach_the_upstream() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway_for(sim, "openai", "    models: {small: m}\n").await;
    let mine = [
        ("content-type", "application/json"),
        ("x-request-id", "abc-123"),
    ];
    let ex = chat(gw.addr(), &mine).await;
    assert_eq!(ex.headers["x-request-id"], "abc-123");
    let ex = chat(gw.addr(), &mine[..1]).await;
    let minted = ex.headers["x-request-id"].to_str().unwrap().to_owned();
    assert!(minted.starts_with("tg-"), "{minted}");
    let seen = support::seen(sim).await;
    assert_eq!(seen[0]["request_id"], "abc-123");
    assert_eq!(seen[1]["request_id"], minted);
}

#[tokio::test]
async fn hop_by_hop_and_gateway_headers_stop_at_the_gateway_and_the_rest_go_through() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway_for(sim, "openai", "    models: {small: m}\n").await;
    let headers = [
        ("content-type", "application/json"),
        ("connection", "keep-alive, x-drop-me"),
        ("x-drop-me", "named by connection"),
        ("keep-alive", "timeout=5"),
        ("proxy-authorization", "Basic c2VjcmV0"),
        ("x-tpsgate-debug", "1"),
        ("x-custom", "kept"),
    ];
    let ex = chat(gw.addr(), &headers).await;
    assert_eq!(ex.status, 200, "{:?}", String::from_utf8_lossy(&ex.body()));
    let seen = support::seen(sim).await;
    let names: Vec<&str> = seen[0]["header_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(names.contains(&"x-custom"), "{names:?}");
    for gone in [
        "x-drop-me",
        "keep-alive",
        "proxy-authorization",
        "x-tpsgate-debug",
    ] {
        assert!(
            !names.contains(&gone),
            "{gone} reached the upstream: {names:?}"
        );
    }
}

#[tokio::test]
async fn a_gemini_shaped_backend_gets_its_path_prefix_in_place_of_v1() {
    let (_fleet, sim) = support::start_engine("gemini", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway_for(
        sim,
        "openai",
        "    models: {small: m}\n    path_prefix: /v1beta/openai\n",
    )
    .await;
    let ex = chat(gw.addr(), &[("content-type", "application/json")]).await;
    assert_eq!(ex.status, 200, "{:?}", String::from_utf8_lossy(&ex.body()));
    let seen = &support::seen(sim).await[0];
    assert_eq!(seen["path"], "/v1beta/openai/chat/completions");
    assert_eq!(seen["query"], json!(null));
    assert_eq!(seen["model"], "m");
}

#[tokio::test]
async fn an_azure_shaped_backend_gets_its_deployment_path_and_api_version_beside_the_clients_query()
{
    let (_fleet, sim) = support::start_engine("azure", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway_for(
        sim,
        "openai",
        "    models: {small: m}\n    path_prefix: /openai/deployments/gpt-4o\n    query: {api-version: 2024-10-21}\n",
    )
    .await;
    for (path, query) in [
        ("/v1/chat/completions", "api-version=2024-10-21"),
        (
            "/v1/chat/completions?trace=1",
            "trace=1&api-version=2024-10-21",
        ),
    ] {
        let ex = support::send(
            &http_client(None).unwrap(),
            gw.addr(),
            Method::POST,
            path,
            Some(CHAT.as_bytes()),
            &[("content-type", "application/json")],
        )
        .await;
        assert_eq!(ex.status, 200, "{:?}", String::from_utf8_lossy(&ex.body()));
        let seen = support::seen(sim).await;
        let last = seen.last().unwrap();
        assert_eq!(last["path"], "/openai/deployments/gpt-4o/chat/completions");
        assert_eq!(last["query"], query);
    }
}

#[tokio::test]
async fn browsers_get_cors_for_the_origins_configured_and_nothing_when_it_is_off() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let backend = support::backend_yaml("sim", sim, "openai", "    models: {small: m}\n");
    let gw = support::gateway(&format!(
        "backends:\n{backend}api_keys:\n  - {{key_env: WEB_KEY}}\ncors:\n  allowed_origins: [https://app.example.com]\n"
    ))
    .await;
    let preflight = |origin: &'static str| {
        [
            ("origin", origin),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "authorization, content-type",
            ),
        ]
    };
    let client = http_client(None).unwrap();
    let path = "/v1/chat/completions";
    // The preflight is answered by the gateway, with no key (browsers send none with it).
    let ex = support::send(
        &client,
        gw.addr(),
        Method::OPTIONS,
        path,
        None,
        &preflight("https://app.example.com"),
    )
    .await;
    assert_eq!(ex.status, 200);
    let header = |ex: &support::Exchange, name: &str| {
        ex.headers.get(name).map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(
        header(&ex, "access-control-allow-origin").as_deref(),
        Some("https://app.example.com")
    );
    assert!(
        header(&ex, "access-control-allow-methods")
            .unwrap()
            .contains("POST")
    );
    assert!(
        support::seen(sim).await.is_empty(),
        "a preflight never goes upstream"
    );
    // The request itself, and its error too, readable by the page.
    let auth = ("authorization", "Bearer key-of-WEB_KEY");
    let origin = ("origin", "https://app.example.com");
    let json = ("content-type", "application/json");
    let ex = chat(gw.addr(), &[auth, origin, json]).await;
    assert_eq!(ex.status, 200);
    assert_eq!(
        header(&ex, "access-control-allow-origin").as_deref(),
        Some("https://app.example.com")
    );
    assert!(
        header(&ex, "access-control-expose-headers")
            .unwrap()
            .contains("x-tpsgate-backend")
    );
    let ex = chat(gw.addr(), &[origin, json]).await;
    assert_eq!(ex.status, 401);
    assert!(header(&ex, "access-control-allow-origin").is_some());
    // Another origin gets no grant.
    let ex = support::send(
        &client,
        gw.addr(),
        Method::OPTIONS,
        path,
        None,
        &preflight("https://evil.example"),
    )
    .await;
    assert_eq!(header(&ex, "access-control-allow-origin"), None);
    // Off by default: no CORS header, and OPTIONS is no method of the API.
    let plain = support::gateway_for(sim, "openai", "    models: {small: m}\n").await;
    let ex = support::send(
        &client,
        plain.addr(),
        Method::OPTIONS,
        path,
        None,
        &preflight("https://app.example.com"),
    )
    .await;
    assert_eq!(ex.status, 405);
    assert_eq!(header(&ex, "access-control-allow-origin"), None);
}
