//! Config validation: defaults, every rule and the message that names the field and the fix.

use super::super::parse;
use super::*;
use crate::config::ResponsesApi;

const BASE: &str = "backends:\n  - name: a\n    url: http://127.0.0.1:9101/\n    dialect: openai\n    models: {small: upstream-small, \"*\": \"*\"}\n";

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn a_minimal_config_gets_documented_defaults() {
    let c = parse(&BASE.replace("9101/", "9101/v1"), no_env).unwrap();
    assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(c.admin_listen, "127.0.0.1:9090".parse().unwrap());
    assert_eq!(c.limits.max_body_bytes, 4 << 20);
    let b = &c.backends[0];
    assert_eq!(b.url, "http://127.0.0.1:9101");
    assert_eq!(b.host, "127.0.0.1:9101");
    assert_eq!(b.models.upstream("small"), Some("upstream-small"));
    assert_eq!(b.models.upstream("other"), Some("other"));
    assert_eq!(b.anthropic_version, "2023-06-01");
    assert_eq!(b.thinking, crate::translate::Thinking::Drop);
    assert_eq!(b.hosted_tools, crate::translate::HostedTools::Drop);
}

#[test]
fn a_responses_client_is_translated_for_every_engine_but_openai_s_own_unless_told() {
    let api = |url: &str, extra: &str| {
        let text = format!("{BASE}{extra}").replace("http://127.0.0.1:9101/", url);
        parse(&text, no_env).unwrap().backends[0].responses_api
    };
    assert_eq!(api("http://127.0.0.1:9101/", ""), ResponsesApi::Translate);
    assert_eq!(api("https://api.openai.com/", ""), ResponsesApi::Native);
    assert_eq!(api("https://x.openai.azure.com/", ""), ResponsesApi::Native);
    // A backend whose requests are never rewritten gets them as they came.
    assert_eq!(
        api("http://127.0.0.1:9101/", "    translate: false\n"),
        ResponsesApi::Native
    );
    // vLLM and SGLang have their own.
    assert_eq!(
        api("http://127.0.0.1:9101/", "    responses_api: native\n"),
        ResponsesApi::Native
    );
}

#[test]
fn a_context_window_is_one_number_or_one_per_model_and_a_mistake_names_its_field() {
    let window = |n: u32| std::num::NonZeroU32::new(n);
    let backend = |extra: &str| {
        parse(&format!("{BASE}{extra}"), no_env).map(|c| c.backends[0].max_context_tokens.clone())
    };
    let none = backend("").unwrap();
    assert_eq!((none.of("small"), none.covers_all()), (None, false));
    let all = backend("    max_context_tokens: 32768\n").unwrap();
    assert_eq!(
        (all.of("small"), all.of("other"), all.covers_all()),
        (window(32768), window(32768), true)
    );
    let by_model = backend("    max_context_tokens: {small: 8192, big: 131072}\n").unwrap();
    assert_eq!(
        (
            by_model.of("small"),
            by_model.of("big"),
            by_model.of("other")
        ),
        (window(8192), window(131072), None)
    );
    let starred = backend("    max_context_tokens: {small: 8192, \"*\": 4096}\n").unwrap();
    assert_eq!(
        (
            starred.of("small"),
            starred.of("other"),
            starred.covers_all()
        ),
        (window(8192), window(4096), true)
    );

    let named_only = BASE.replace(", \"*\": \"*\"", "");
    let cases = [
        (
            format!("{BASE}    max_context_tokens: 0\n"),
            "backends[0].max_context_tokens",
            "above 0",
        ),
        (
            format!("{BASE}    max_context_tokens: {{small: 99999999999}}\n"),
            "backends[0].max_context_tokens.small",
            "at most",
        ),
        (
            format!("{named_only}    max_context_tokens: {{big: 8192}}\n"),
            "backends[0].max_context_tokens.big",
            "not among this backend's `models`",
        ),
        (
            format!("{BASE}    max_context_tokens: lots\n"),
            "backends[0].max_context_tokens",
            "a token count",
        ),
    ];
    for (text, path, why) in cases {
        let err = parse(&text, no_env).unwrap_err();
        assert_eq!(err.path, path, "{text}\n{err}");
        assert!(err.to_string().contains(why), "{err}");
    }
}

#[test]
fn a_backend_prices_its_tokens_per_model_and_its_engine_by_the_hour() {
    let cost =
        |extra: &str| parse(&format!("{BASE}{extra}"), no_env).map(|c| c.backends[0].cost.clone());
    assert_eq!(cost("").unwrap(), None);
    let priced = cost(
        "    cost: {input_per_1m: 1, output_per_1m: 2, models: {small: {input_per_1m: 10, output_per_1m: 20}}}\n",
    )
    .unwrap()
    .unwrap();
    assert_eq!(priced.price("small").usd(1_000_000, 1_000_000), 30.0);
    assert_eq!(priced.price("other").usd(1_000_000, 1_000_000), 3.0);
    assert_eq!(priced.gpu_hour_usd, None);
    let hourly = cost("    cost: {gpu_hour_usd: 2.5}\n").unwrap().unwrap();
    assert_eq!(
        (hourly.gpu_hour_usd, hourly.price("small").usd(9, 9)),
        (Some(2.5), 0.0)
    );

    let named_only = BASE.replace(", \"*\": \"*\"", "");
    let cases = [
        (
            format!("{BASE}    cost: {{input_per_1m: -1}}\n"),
            "backends[0].cost.input_per_1m",
            "USD per million tokens",
        ),
        (
            format!("{named_only}    cost: {{models: {{big: {{output_per_1m: 1}}}}}}\n"),
            "backends[0].cost.models.big",
            "not among this backend's `models`",
        ),
        (
            format!("{BASE}    cost: {{models: {{small: {{output_per_1m: -2}}}}}}\n"),
            "backends[0].cost.models.small.output_per_1m",
            "out of range",
        ),
        (
            format!("{BASE}    cost: {{gpu_hour_usd: -3}}\n"),
            "backends[0].cost.gpu_hour_usd",
            "USD per hour",
        ),
    ];
    for (text, path, why) in cases {
        let err = parse(&text, no_env).unwrap_err();
        assert_eq!(err.path, path, "{text}\n{err}");
        assert!(err.to_string().contains(why), "{err}");
    }
}

#[test]
fn a_class_without_an_slo_waits_for_room_unless_told_otherwise() {
    let text = format!(
        "{BASE}classes:\n  - {{name: chat, min_tps: 20}}\n  - {{name: batch}}\n  - {{name: bulk, on_miss: shed}}\n"
    );
    let c = parse(&text, no_env).unwrap();
    let on_miss: Vec<OnMiss> = c.classes.iter().map(|k| k.on_miss).collect();
    assert_eq!(on_miss, [OnMiss::BestEffort, OnMiss::Queue, OnMiss::Shed]);
    assert_eq!(c.classes[1].queue_max_wait, Duration::from_secs(60));
}

#[test]
fn the_upstream_host_header_carries_the_port_only_when_it_is_not_the_default() {
    let host = |url: &str| {
        let c = parse(&BASE.replace("http://127.0.0.1:9101/", url), no_env).unwrap();
        c.backends[0].host.to_str().unwrap().to_owned()
    };
    assert_eq!(host("http://127.0.0.1:9101/"), "127.0.0.1:9101");
    assert_eq!(host("https://api.example.com/v1"), "api.example.com");
    assert_eq!(host("https://api.example.com:443"), "api.example.com");
    assert_eq!(host("http://upstream:80"), "upstream");
    assert_eq!(host("https://upstream:8443"), "upstream:8443");
}

#[test]
fn a_missing_key_variable_is_named_with_the_fix() {
    let text = format!("{BASE}    api_key_env: TPSGATE_TEST_KEY\n");
    let err = parse(&text, no_env).unwrap_err();
    assert_eq!(err.path, "backends[0].api_key_env");
    assert!(
        err.message.contains("TPSGATE_TEST_KEY is not set"),
        "{}",
        err.message
    );
    let c = parse(&text, |_| Some("sk-secret".into())).unwrap();
    let (name, value) = c.backends[0].api_key.as_ref().unwrap();
    assert_eq!(
        (name.as_str(), value.as_bytes()),
        ("authorization", &b"Bearer sk-secret"[..])
    );
    let err = parse(&text, |_| Some("sk-\nsecret".into())).unwrap_err();
    assert_eq!(err.path, "backends[0].api_key_env");
    assert!(err.message.contains("cannot carry"), "{}", err.message);
    assert!(
        !err.message.contains("secret"),
        "the key stays out of messages"
    );
    assert!(
        !format!("{c:?}").contains("sk-secret"),
        "keys never show in debug output"
    );
}

#[test]
fn bad_values_name_their_field() {
    let cases = [
        (
            BASE.replace("http://127.0.0.1:9101/", "ftp://x"),
            "backends[0].url",
        ),
        (
            BASE.replace("dialect: openai", "dialect: cohere"),
            "backends[0].dialect",
        ),
        (
            format!("{BASE}    max_concurrency: 0\n"),
            "backends[0].max_concurrency",
        ),
        (format!("{BASE}default_backend: nope\n"), "default_backend"),
        (
            format!("{BASE}routing: {{policy: slo}}\n"),
            "routing.policy",
        ),
        (
            format!(
                "{BASE}  - name: a\n    url: http://x\n    dialect: openai\n    models: {{m: m}}\n"
            ),
            "backends[1].name",
        ),
        (
            format!("{BASE}    headers: {{Host: x}}\n"),
            "backends[0].headers.Host",
        ),
        (
            format!("{BASE}limits: {{max_connections: 100000000000}}\n"),
            "limits.max_connections",
        ),
        (
            format!("{BASE}limits: {{max_connections: 0}}\n"),
            "limits.max_connections",
        ),
        (
            format!("{BASE}    thinking: sometimes\n"),
            "backends[0].thinking",
        ),
        (
            format!("{BASE}    thinking: chat_template\n")
                .replace("dialect: openai", "dialect: anthropic"),
            "backends[0].thinking",
        ),
        (
            format!("{BASE}    responses_api: native\n")
                .replace("dialect: openai", "dialect: anthropic"),
            "backends[0].responses_api",
        ),
        (
            format!("{BASE}    responses_api: translate\n    translate: false\n"),
            "backends[0].responses_api",
        ),
        (
            format!("{BASE}    hosted_tools: keep\n"),
            "backends[0].hosted_tools",
        ),
    ];
    for (text, path) in cases {
        let err = parse(&text, no_env).unwrap_err();
        assert_eq!(err.path, path, "{text}\n{err}");
    }
}

#[test]
fn errors_after_parsing_are_placed_at_their_line_and_column() {
    let text = format!("{BASE}    max_concurrency: 0\n");
    let err = parse(&text, no_env).unwrap_err();
    let placed = crate::yaml::place(err, Path::new("gw.yaml"), &text);
    assert_eq!(
        placed.to_string(),
        "gw.yaml:6:22: backends[0].max_concurrency: must be at least 1"
    );
}

#[test]
fn a_cluster_gets_its_defaults_and_keeps_its_password_out_of_sight() {
    let text = format!(
        "{BASE}cluster: {{redis_url: 'redis://:hunter2@redis.internal:6379/2', password_env: REDIS_PW}}\n"
    );
    let c = parse(&text, |_| Some("from-env".into())).unwrap();
    let cluster = c.cluster.unwrap();
    assert_eq!(cluster.key_prefix, "tpsgate");
    assert_eq!(cluster.sync_interval, Duration::from_millis(50));
    assert_eq!(cluster.replica_id, None);
    assert_eq!(
        cluster.password.as_ref().map(Secret::expose),
        Some("from-env")
    );
    assert!(!format!("{cluster:?}").contains("hunter2"));
    assert_eq!(
        without_password(cluster.redis_url.expose()),
        "redis://:***@redis.internal:6379/2"
    );
    assert!(parse(BASE, no_env).unwrap().cluster.is_none());
}

#[test]
fn a_bad_cluster_field_is_named_with_the_fix() {
    let bad = |cluster: &str| {
        let err = parse(&format!("{BASE}cluster: {{{cluster}}}\n"), no_env).unwrap_err();
        (err.path, err.message)
    };
    let (path, message) = bad("redis_url: 'http://redis:6379'");
    assert_eq!(path, "cluster.redis_url");
    assert!(message.contains("write redis://HOST:PORT/DB"), "{message}");
    let (path, message) = bad("redis_url: 'redis://r', sync_interval_ms: 5");
    assert_eq!(path, "cluster.sync_interval_ms");
    assert!(message.contains("10 to 10000"), "{message}");
    let (path, message) = bad("redis_url: 'redis://r', key_prefix: 'a b'");
    assert_eq!(path, "cluster.key_prefix");
    assert!(message.contains("letters, digits"), "{message}");
    let (path, _) = bad("redis_url: 'redis://r', replica_id: ''");
    assert_eq!(path, "cluster.replica_id");
    let (path, message) = bad("redis_url: 'redis://r', password_env: NOPE");
    assert_eq!(path, "cluster.password_env");
    assert!(message.contains("NOPE is not set"), "{message}");
    let (path, _) = bad("redis_url: 'redis://r', ca_file: /nonexistent/ca.pem");
    assert_eq!(path, "cluster.ca_file");
    let (path, message) = bad("redis_url: 'redis://r', sync_ms: 50");
    assert!(path.starts_with("cluster"), "{path}");
    assert!(message.contains("unknown field"), "{message}");
}

#[test]
fn the_prefix_index_is_on_by_default_sized_per_backend_and_a_bad_field_is_named() {
    let c = parse(BASE, no_env).unwrap();
    let size = c.backends[0].prefix_index.unwrap();
    assert_eq!((size.blocks, size.block_tokens), (16_384, 64));
    assert_eq!(c.routing.prefix.map(|p| p.min_match_tokens), Some(256));
    let own = parse(&format!("{BASE}    prefix_cache_tokens: 12800\n"), no_env).unwrap();
    assert_eq!(own.backends[0].prefix_index.map(|s| s.blocks), Some(200));
    let off = parse(&format!("{BASE}prefix_cache: {{enabled: false}}\n"), no_env).unwrap();
    assert!(off.backends[0].prefix_index.is_none() && off.routing.prefix.is_none());
    let bad = |text: String| {
        let err = parse(&text, no_env).unwrap_err();
        (err.path, err.message)
    };
    let (path, message) = bad(format!("{BASE}prefix_cache: {{block_tokens: 0}}\n"));
    assert_eq!(path, "prefix_cache.block_tokens");
    assert!(message.contains("1 to 4096"), "{message}");
    let (path, message) = bad(format!("{BASE}prefix_cache: {{min_match_tokens: 16}}\n"));
    assert_eq!(path, "prefix_cache.min_match_tokens");
    assert!(message.contains("give at least block_tokens"), "{message}");
    let (path, _) = bad(format!("{BASE}prefix_cache: {{ttl_s: 0}}\n"));
    assert_eq!(path, "prefix_cache.ttl_s");
    let (path, message) = bad(format!("{BASE}    prefix_cache_tokens: 10\n"));
    assert_eq!(path, "backends[0].prefix_cache_tokens");
    assert!(message.contains("not one block"), "{message}");
}

#[test]
fn every_number_is_bounded_and_an_absurd_one_is_named_with_its_range() {
    let text = |extra: &str| format!("{extra}{BASE}");
    for (config, path) in [
        (
            "limits: {drain_timeout_s: 1e300}\n",
            "limits.drain_timeout_s",
        ),
        (
            "limits: {header_read_timeout_s: 1e300}\n",
            "limits.header_read_timeout_s",
        ),
        (
            "limits: {max_body_bytes: 18446744073709551615}\n",
            "limits.max_body_bytes",
        ),
        ("curves: {half_life_s: .inf}\n", "curves.half_life_s"),
    ] {
        let err = parse(&text(config), no_env).unwrap_err();
        assert_eq!(err.path, path, "{config}");
        assert!(err.message.contains("out of range"), "{}", err.message);
    }
    let class = |c: &str| format!("{BASE}classes:\n  - {{name: x, {c}}}\n");
    let err = parse(&class("queue_max_wait_ms: 1e300, on_miss: queue"), no_env).unwrap_err();
    assert_eq!(err.path, "classes[0].queue_max_wait_ms");
    let err = parse(&class("max_ttft_ms: 1e300"), no_env).unwrap_err();
    assert_eq!(err.path, "classes[0].max_ttft_ms");
    let backend = |b: &str| format!("{BASE}    {b}\n");
    let err = parse(
        &backend("first_token_timeout_ms: 18446744073709551615"),
        no_env,
    )
    .unwrap_err();
    assert_eq!(err.path, "backends[0].first_token_timeout_ms");
    assert!(err.message.contains("1 to 86400000"), "{}", err.message);
    let err = parse(&backend("ejection: {max_ms: 18446744073709551615}"), no_env).unwrap_err();
    assert_eq!(err.path, "backends[0].ejection");
}

#[test]
fn a_backend_url_with_credentials_is_refused_rather_than_shown() {
    let err = parse(
        &BASE.replace(
            "http://127.0.0.1:9101/",
            "http://user:secret@127.0.0.1:9101/",
        ),
        no_env,
    )
    .unwrap_err();
    assert_eq!(err.path, "backends[0].url");
    assert!(err.message.contains("api_key_env"), "{}", err.message);
    assert!(!err.message.contains("secret"), "{}", err.message);
}

#[test]
fn a_hosted_providers_path_prefix_and_query_are_checked_and_kept_ready_to_send() {
    let with = |extra: &str| parse(&format!("{BASE}    {extra}\n"), no_env);
    let c = with("path_prefix: /v1beta/openai/").unwrap();
    assert_eq!(c.backends[0].path_prefix.as_deref(), Some("/v1beta/openai"));
    assert_eq!(c.backends[0].query, None);
    let c = with("query: {api-version: 2024-10-21, b: x}").unwrap();
    assert_eq!(
        c.backends[0].query.as_deref(),
        Some("api-version=2024-10-21&b=x")
    );
    for (extra, path) in [
        ("path_prefix: v1beta", "backends[0].path_prefix"),
        ("path_prefix: /a/../b", "backends[0].path_prefix"),
        ("path_prefix: '/a b'", "backends[0].path_prefix"),
        (
            "query: {api-version: 'a&b'}",
            "backends[0].query.api-version",
        ),
        ("query: {'': x}", "backends[0].query."),
    ] {
        let err = with(extra).unwrap_err();
        assert_eq!(err.path, path, "{extra}");
        assert!(err.message.contains("letters, digits"), "{}", err.message);
    }
}

#[test]
fn a_key_may_claim_its_own_class_and_the_ones_it_lists_only() {
    let env = |_: &str| Some("sk".to_owned());
    let text = format!(
        "{BASE}classes:\n  - {{name: chat}}\n  - {{name: batch}}\napi_keys:\n  - {{key_env: A, class: batch, classes: [chat, batch]}}\n  - {{key_env: B, class: batch}}\n  - {{key_env: C, slo_overrides: true}}\n"
    );
    let c = parse(&text, env).unwrap();
    let grants: Vec<(Vec<&str>, bool)> = c
        .api_keys
        .iter()
        .map(|k| {
            (
                k.grant.classes.iter().map(|c| &**c).collect(),
                k.grant.slo_overrides,
            )
        })
        .collect();
    assert_eq!(
        grants,
        [
            (vec!["batch", "chat"], false),
            (vec!["batch"], false),
            (vec![], true)
        ]
    );
    let err = parse(&text.replace("[chat, batch]", "[chat, gold]"), env).unwrap_err();
    assert_eq!(err.path, "api_keys[0].classes[1]");
}

#[test]
fn key_limits_name_the_field_and_the_fix() {
    let env = |_: &str| Some("sk".to_owned());
    let with = |keys: &str| parse(&format!("{BASE}api_keys:\n{keys}"), env);
    let c = with("  - {key_env: A, limits: {requests_per_minute: 60, budget_usd: 5}}\n").unwrap();
    let key = &c.api_keys[0];
    assert_eq!(
        &*key.name, "A",
        "a key is named by its key_env unless named"
    );
    assert_eq!(key.limits.requests_per_minute, Some(60));
    assert_eq!(
        key.limits.budget.unwrap().period,
        crate::config::BudgetPeriod::Day
    );
    for (keys, path, says) in [
        (
            "  - {key_env: A, name: x}\n  - {key_env: B, name: x}\n",
            "api_keys[1].name",
            "a name of its own",
        ),
        (
            "  - {key_env: A, limits: {tokens_per_minute: 0}}\n",
            "api_keys[0].limits.tokens_per_minute",
            "at least 1",
        ),
        (
            "  - {key_env: A, limits: {budget_period: month}}\n",
            "api_keys[0].limits.budget_period",
            "set budget_usd",
        ),
        (
            "  - {key_env: A, limits: {budget_usd: -1}}\n",
            "api_keys[0].limits.budget_usd",
            "above 0",
        ),
        (
            "  - {key_env: A, name: ''}\n",
            "api_keys[0].name",
            "1 to 64",
        ),
        (
            "  - {key_env: A, weight: 0}\n",
            "api_keys[0].weight",
            "0.001 to 1000",
        ),
    ] {
        let err = with(keys).unwrap_err();
        assert_eq!(err.path, path, "{keys}");
        assert!(err.message.contains(says), "{}", err.message);
    }
    let err = with("  - {key_env: A, limits: {rpm: 5}}\n").unwrap_err();
    assert!(
        err.message.contains("requests_per_minute"),
        "{}",
        err.message
    );
}

#[test]
fn cors_origins_are_origins_or_a_lone_star() {
    let with = |cors: &str| parse(&format!("{BASE}cors: {cors}\n"), no_env);
    let c =
        with("{allowed_origins: ['https://app.example.com', 'http://localhost:3000']}").unwrap();
    assert_eq!(c.cors.unwrap().origins.unwrap().len(), 2);
    assert_eq!(
        with("{allowed_origins: ['*']}")
            .unwrap()
            .cors
            .unwrap()
            .origins,
        None
    );
    assert_eq!(parse(BASE, no_env).unwrap().cors, None, "off by default");
    for (cors, path) in [
        ("{allowed_origins: []}", "cors.allowed_origins"),
        (
            "{allowed_origins: ['https://a.example/']}",
            "cors.allowed_origins[0]",
        ),
        (
            "{allowed_origins: ['https://a.example', 'app.example']}",
            "cors.allowed_origins[1]",
        ),
        (
            "{allowed_origins: ['*'], max_age_s: 100000000}",
            "cors.max_age_s",
        ),
    ] {
        assert_eq!(with(cors).unwrap_err().path, path, "{cors}");
    }
}

#[test]
fn discovery_resolves_a_name_every_five_seconds_unless_told_otherwise() {
    let named = BASE.replace("127.0.0.1:9101/", "pods.default.svc:8000");
    let c = parse(&format!("{named}    discovery: dns\n"), no_env).unwrap();
    let d = c.backends[0].discovery.unwrap();
    assert_eq!(d.refresh, Duration::from_secs(5));
    assert_eq!(c.backends[0].dial, None);
    assert_eq!(c.resolver, None, "the system's resolver");
    let c = parse(
        &format!(
            "{named}    discovery: dns\n    refresh_s: 0.5\nresolver: {{nameservers: [10.96.0.10, \"127.0.0.1:5353\"]}}\n"
        ),
        no_env,
    )
    .unwrap();
    assert_eq!(
        c.backends[0].discovery.unwrap().refresh,
        Duration::from_millis(500)
    );
    let r = c.resolver.unwrap();
    assert_eq!(
        r.nameservers,
        [
            "10.96.0.10:53".parse().unwrap(),
            "127.0.0.1:5353".parse().unwrap()
        ]
    );
    assert_eq!(r.timeout, Duration::from_secs(2));
}

#[test]
fn discovery_mistakes_are_named_with_the_fix() {
    let named = BASE.replace("127.0.0.1:9101/", "pods.default.svc:8000");
    for (text, path, says) in [
        (
            format!("{BASE}    discovery: dns\n"),
            "backends[0].discovery",
            "already an address",
        ),
        (
            format!("{named}    refresh_s: 2\n"),
            "backends[0].refresh_s",
            "only with `discovery: dns`",
        ),
        (
            format!("{named}    discovery: dns\n    refresh_s: 0\n"),
            "backends[0].refresh_s",
            "0.1 to 3600",
        ),
        (
            format!("{named}resolver: {{nameservers: []}}\n"),
            "resolver.nameservers",
            "at least one nameserver",
        ),
        (
            format!("{named}resolver: {{nameservers: [dns.local]}}\n"),
            "resolver.nameservers[0]",
            "IP or IP:PORT",
        ),
    ] {
        let err = parse(&text, no_env).unwrap_err();
        assert_eq!(err.path, path, "{text}");
        assert!(err.message.contains(says), "{}", err.message);
    }
    let err = parse(&format!("{named}    discovery: consul\n"), no_env).unwrap_err();
    assert!(err.to_string().contains("dns"), "{err}");
}

#[test]
fn a_shared_device_is_named_on_engines_and_a_mistake_names_the_field() {
    let c = parse(&format!("{BASE}    device: host-a/gpu0\n"), no_env).unwrap();
    assert_eq!(c.backends[0].device.as_deref(), Some("host-a/gpu0"));
    assert_eq!(parse(BASE, no_env).unwrap().backends[0].device, None);
    let named = BASE.replace("127.0.0.1:9101/", "pods.default.svc:8000");
    for (text, says) in [
        (format!("{BASE}    device: ' '\n"), "1 to 256 characters"),
        (
            format!("{named}    discovery: dns\n    device: gpu0\n"),
            "a device of their own",
        ),
    ] {
        let err = parse(&text, no_env).unwrap_err();
        assert_eq!(err.path, "backends[0].device", "{text}");
        assert!(err.message.contains(says), "{}", err.message);
    }
}

#[test]
fn a_route_picks_a_backend_for_bodies_naming_no_model_by_path_alone() {
    let ok = format!("{BASE}routes:\n  - {{path: /v1/audio/transcriptions, backend: a}}\n");
    let c = parse(&ok, no_env).unwrap();
    assert_eq!(c.routes[0].backend, Some(0));
    assert_eq!(c.routes[0].class, None);
    for (rule, path, says) in [
        (
            "{path: /v1/files, backend: nope}",
            "routes[0].backend",
            "no backend is called `nope`",
        ),
        (
            "{model: m, backend: a}",
            "routes[0].backend",
            "give path and no model",
        ),
        ("{path: /v1/files}", "routes[0]", "give at least one"),
    ] {
        let err = parse(&format!("{BASE}routes:\n  - {rule}\n"), no_env).unwrap_err();
        assert_eq!(err.path, path, "{rule}");
        assert!(err.message.contains(says), "{}", err.message);
    }
}

#[test]
fn a_key_header_needs_a_key_and_a_header_the_gateway_does_not_own() {
    let keyed = format!("{BASE}    api_key_env: K\n");
    let c = parse(&format!("{keyed}    api_key_header: api-key\n"), |_| {
        Some("s3cret".into())
    })
    .unwrap();
    let (name, value) = c.backends[0].api_key.clone().unwrap();
    assert_eq!(
        (name.as_str(), value.to_str().unwrap()),
        ("api-key", "s3cret")
    );
    for (text, says) in [
        (
            format!("{BASE}    api_key_header: api-key\n"),
            "add api_key_env",
        ),
        (
            format!("{keyed}    api_key_header: host\n"),
            "managed by the gateway",
        ),
        (
            format!("{keyed}    api_key_header: \"bad name\"\n"),
            "not a valid header name",
        ),
    ] {
        let err = parse(&text, |_| Some("s3cret".into())).unwrap_err();
        assert_eq!(err.path, "backends[0].api_key_header", "{text}");
        assert!(err.message.contains(says), "{}", err.message);
    }
}

#[test]
fn one_run_names_every_error_each_at_its_line() {
    let text = "listen: {address: nowhere}\nbackends:\n  - name: a\n    url: http://127.0.0.1:9101\n    dialect: openai\n    models: {m: m}\n    max_concurrency: 0\n  - name: b\n    url: ftp://x\n    dialect: openai\n    models: {m: m}\nclasses:\n  - {name: chat, min_tps: -1}\nroutes:\n  - {path: /v1/x, class: nope}\n  - {path: /v1/y, class: chat}\n";
    let err = parse(text, no_env).unwrap_err();
    let paths: Vec<&str> = std::iter::once(err.path.as_str())
        .chain(err.also.iter().map(|e| e.path.as_str()))
        .collect();
    // A route naming a class whose entry failed (chat) is not a second error.
    assert_eq!(
        paths,
        [
            "listen.address",
            "backends[0].max_concurrency",
            "backends[1].url",
            "classes[0].min_tps",
            "routes[0].class"
        ]
    );
    let placed = crate::yaml::place(err, Path::new("gw.yaml"), text).to_string();
    let lines: Vec<&str> = placed.lines().collect();
    assert_eq!(lines.len(), 5, "{placed}");
    assert!(
        lines[1].starts_with("gw.yaml:7:22: backends[0].max_concurrency"),
        "{placed}"
    );
    assert!(lines[4].starts_with("gw.yaml:15:"), "{placed}");
}
