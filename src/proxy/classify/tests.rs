#[test]
fn a_pass_through_path_that_could_leave_v1_is_caught_however_it_is_written() {
    for path in [
        "/v1/../metrics",
        "/v1/%2e%2e/x",
        "/v1/%2E./x",
        "/v1/..;/x",
        "/v1/./files",
        "/v1/files/..",
        "/v1/a%2fb",
        "/v1/a\\..\\b",
        "/v1/a%5c..",
    ] {
        assert!(leaves_v1(path), "{path}");
    }
    for path in [
        "/v1/files",
        "/v1/files/file-abc.jsonl",
        "/v1/a...b",
        "/v1/.well",
    ] {
        assert!(!leaves_v1(path), "{path}");
    }
}
use super::*;

#[test]
fn peek_finds_model_stream_and_their_spans() {
    let body = br#"{"messages":[{"role":"user","content":"\"model\""}], "model" : "gpt\u0041", "stream":true, "stream_options":{"include_usage":false}}"#;
    let c = peek(Endpoint::Chat, body).unwrap();
    assert_eq!(c.model.as_deref(), Some("gptA"));
    assert_eq!(&body[c.model_span.unwrap()], br#""gpt\u0041""#);
    assert!(c.stream);
    let so = c.stream_options.unwrap();
    assert_eq!(&body[so.span], br#"{"include_usage":false}"#);
    assert_eq!(so.include_usage, Some(false));
}

#[test]
fn bad_bodies_are_named() {
    let msg = |body: &[u8]| peek(Endpoint::Chat, body).unwrap_err().message().to_owned();
    assert!(msg(b"{").starts_with("invalid JSON body"));
    assert_eq!(msg(br#"{"messages":[]}"#), "missing required field `model`");
    assert_eq!(msg(br#"{"model":3}"#), "`model` must be a string");
    assert_eq!(
        msg(br#"{"model":"m","stream":"yes"}"#),
        "`stream` must be true or false"
    );
    assert_eq!(
        msg(br#"{"model":"m","stream_options":[true]}"#),
        "`stream_options` must be an object"
    );
    assert_eq!(
        msg(b"{\"model\":\"m\",\n \"stream\" true}"),
        "invalid JSON body: expected `:` after a key at line 2 column 11"
    );
    // Parsers disagree on which of two keys wins: refused, so that the gateway cannot route
    // by one model while the backend serves the other.
    assert!(
        msg(br#"{"model":"cheap","messages":[],"model":"dear"}"#)
            .contains("duplicate field `model`")
    );
    assert!(msg(br#"{"model":"cheap","mod\u0065l":"dear"}"#).contains("duplicate field `model`"));
}

#[test]
fn json_content_types_are_accepted_with_parameters() {
    let ok = |v: &'static str| json_content_type(Some(&http::HeaderValue::from_static(v)));
    assert!(ok("application/json; charset=utf-8") && ok("application/vnd.api+json"));
    assert!(ok("Application/JSON") && ok("application/VND.API+JSON"));
    assert!(!ok("json") && !ok("+jso"));
    assert!(!ok("text/plain") && !ok("application/x-www-form-urlencoded"));
    assert!(json_content_type(None));
}
