//! The admin plane called over HTTP, for the commands that work on a running gateway:
//! `tpsgate curves --url` and `tpsgate keys`.

use http::{Method, StatusCode};
use http_body_util::BodyExt as _;
use serde_json::Value;

/// Where the admin plane is and how to speak to it.
#[derive(Debug, Clone)]
pub(crate) struct Remote {
    /// Its base URL, e.g. `http://127.0.0.1:9090`.
    pub url: String,
    /// The admin token, if one is to be sent.
    pub token: Option<String>,
    /// Extra PEM roots for an `https://` URL.
    pub ca_file: Option<std::path::PathBuf>,
}

impl Remote {
    /// The admin plane at `url`, with the token in the environment variable `token_env`
    /// (unset: none is sent; `required`: an error instead).
    pub(crate) fn new(
        url: &str,
        token_env: Option<&str>,
        required: bool,
        ca_file: Option<std::path::PathBuf>,
    ) -> Result<Self, String> {
        let token = match token_env {
            Some(var) => match std::env::var(var).ok().filter(|t| !t.is_empty()) {
                Some(token) => Some(token),
                None if required => {
                    return Err(format!(
                        "--token-env: environment variable {var} is not set (or empty)"
                    ));
                }
                None => None,
            },
            None => None,
        };
        Ok(Self {
            url: url.trim_end_matches('/').to_owned(),
            token,
            ca_file,
        })
    }

    /// `method path` with `body` (JSON): the answer's JSON, or an error with the status and
    /// what the gateway said.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, String> {
        let uri: http::Uri = format!("{}{path}", self.url)
            .parse()
            .map_err(|e| format!("--url: `{}` is not a URL: {e}", self.url))?;
        let mut request = http::Request::builder().method(method).uri(uri);
        if let Some(token) = &self.token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let payload = body.map(Value::to_string).unwrap_or_default();
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(http_body_util::Full::new(bytes::Bytes::from(payload)))
            .map_err(|e| format!("--url: {e}"))?;
        let client = crate::tls::http_client(self.ca_file.as_deref())?;
        let base = &self.url;
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("{base}: {e}"))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{base}: the answer broke: {e}"))?
            .to_bytes();
        if !status.is_success() {
            let hint = if status == StatusCode::UNAUTHORIZED && self.token.is_none() {
                " (the admin plane wants its token: --token-env VAR)"
            } else {
                ""
            };
            let said = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_owned());
            return Err(format!("{base}{path} answered {status}{hint}: {said}"));
        }
        serde_json::from_slice(&body)
            .map_err(|e| format!("{base}{path} is not a tpsgate admin plane ({e})"))
    }
}
