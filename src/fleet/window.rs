//! A backend's context windows at runtime ([`Windows`]): those its config gives
//! (`max_context_tokens`), and those its `/v1/models` reports as `max_model_len` (vLLM's and
//! SGLang's), asked at start and again every [`ASK_EVERY`] ([`ask_models`]). A decision reads
//! them to send a prompt only where it fits ([`Windows::holds`]), and the request's output
//! budget is cut to what is left of the window there ([`room`]).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde::Deserialize;

use super::Backend;
use crate::config::{BackendConfig, BackendDialect, ContextWindows};

/// How often a backend's `/v1/models` is asked again (an engine restarted with another
/// `--max-model-len` is seen within this).
pub(crate) const ASK_EVERY: Duration = Duration::from_secs(30);

/// How long one ask may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// Reported windows by the model name the backend knows.
type Reported = HashMap<Box<str>, NonZeroU32, foldhash::fast::RandomState>;

/// One backend's context windows by model.
#[derive(Debug, Default)]
pub struct Windows {
    /// From its config, by client model name.
    configured: ContextWindows,
    /// From its `/v1/models`, by the model name it knows; `None` until it reported one.
    reported: ArcSwapOption<Reported>,
    /// The smallest window known, configured or reported (`u32::MAX` where none is): a prompt
    /// under it fits whatever its model, and a decision looks nothing up.
    smallest: AtomicU32,
}

impl Windows {
    /// The windows `configured` gives; none reported yet.
    pub(crate) fn new(configured: ContextWindows) -> Self {
        let smallest = smallest(configured.by_model.values().chain(&configured.others));
        Self {
            configured,
            reported: ArcSwapOption::empty(),
            smallest: AtomicU32::new(smallest),
        }
    }

    /// The window of the client's `model` on the backend of `config`, if one is known: the
    /// configured one, else the one the backend reported for the name it knows the model by.
    pub(crate) fn of(&self, config: &BackendConfig, model: &str) -> Option<NonZeroU32> {
        self.configured.of(model).or_else(|| {
            let upstream = config.models.upstream(model).unwrap_or(model);
            self.reported.load().as_ref()?.get(upstream).copied()
        })
    }

    /// Whether a prompt of `prompt_tokens` leaves room for output in `model`'s window (it
    /// does where no window is known).
    pub(crate) fn holds(&self, config: &BackendConfig, model: &str, prompt_tokens: u64) -> bool {
        prompt_tokens < u64::from(self.smallest.load(Ordering::Relaxed))
            || self
                .of(config, model)
                .is_none_or(|w| prompt_tokens < u64::from(w.get()))
    }

    /// Whether the backend has windows to report: it speaks OpenAI's dialect and its config
    /// does not give every model's.
    pub(crate) fn asks(&self, config: &BackendConfig) -> bool {
        config.dialect == BackendDialect::Openai && !self.configured.covers_all()
    }

    /// Takes the windows the backend reported (none: it answered without any).
    fn learn(&self, reported: Reported) {
        let configured = &self.configured;
        let all = configured.by_model.values().chain(&configured.others);
        self.smallest
            .store(smallest(all.chain(reported.values())), Ordering::Relaxed);
        self.reported
            .store((!reported.is_empty()).then(|| std::sync::Arc::new(reported)));
    }

    /// Takes the windows `old` had reported (a reload built this backend anew).
    pub(crate) fn adopt(&self, old: &Self) {
        if let Some(reported) = old.reported.load_full() {
            self.learn((*reported).clone());
        }
    }

    /// What `/admin/backends` shows: the windows known, by the model name each is kept under.
    pub(crate) fn view(&self) -> serde_json::Value {
        let mut view = serde_json::Map::new();
        if let Some(reported) = &*self.reported.load() {
            for (model, n) in reported.iter() {
                view.insert(
                    model.to_string(),
                    serde_json::json!({"tokens": n, "from": "/v1/models"}),
                );
            }
        }
        for (model, n) in &self.configured.by_model {
            view.insert(
                model.clone(),
                serde_json::json!({"tokens": n, "from": "config"}),
            );
        }
        if let Some(n) = self.configured.others {
            view.insert(
                "*".to_owned(),
                serde_json::json!({"tokens": n, "from": "config"}),
            );
        }
        serde_json::Value::Object(view)
    }
}

fn smallest<'a>(windows: impl Iterator<Item = &'a NonZeroU32>) -> u32 {
    windows.map(|w| w.get()).min().unwrap_or(u32::MAX)
}

/// The output tokens that fit in `window` beside a prompt estimated at `prompt_tokens`: the
/// window less the estimate and an eighth of it, for the estimate's error (a prompt's bytes
/// over four; docs/gateway.md, "Context windows"); at least one token where the estimate
/// itself fits.
pub(crate) fn room(window: NonZeroU32, prompt_tokens: u64) -> u32 {
    let window = u64::from(window.get());
    let with_margin = prompt_tokens.saturating_add(prompt_tokens / 8);
    let room = window.saturating_sub(with_margin.min(window - 1));
    u32::try_from(room).unwrap_or(u32::MAX)
}

/// `/v1/models` as vLLM and SGLang answer it: each model with its `max_model_len`.
#[derive(Deserialize)]
struct ModelList {
    data: Vec<Listed>,
}

#[derive(Deserialize)]
struct Listed {
    id: String,
    #[serde(default)]
    max_model_len: Option<u64>,
}

/// Asks `backend`'s `/v1/models` for its windows and keeps what it reports. A backend that
/// does not answer keeps what it reported before (an engine restarting); one that answers
/// without windows has none reported.
pub(crate) async fn ask_models(backend: &Backend) {
    let config = &backend.config;
    let base = config.url.to_string();
    let v1 = config.path_prefix.as_deref().unwrap_or("/v1");
    let query = config
        .query
        .as_deref()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let url = format!("{}{v1}/models{query}", base.trim_end_matches('/'));
    let mut req = Request::get(url).header(http::header::HOST, config.host.clone());
    if let Some((name, value)) = &config.api_key {
        req = req.header(name, value);
    }
    let Ok(req) = req.body(Full::new(Bytes::new())) else {
        return;
    };
    let asked = async {
        let resp = std::sync::Arc::clone(&backend.pool).send(req).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        serde_json::from_slice::<ModelList>(&body).ok()
    };
    let Ok(Some(list)) = tokio::time::timeout(ASK_TIMEOUT, asked).await else {
        tracing::debug!(backend = %config.name, "no model list from /v1/models; its context windows stay as they were");
        return;
    };
    let reported = list
        .data
        .into_iter()
        .filter_map(|m| {
            let n = u32::try_from(m.max_model_len?)
                .ok()
                .and_then(NonZeroU32::new)?;
            Some((m.id.into_boxed_str(), n))
        })
        .collect();
    backend.windows.learn(reported);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(v: u32) -> NonZeroU32 {
        NonZeroU32::new(v).unwrap()
    }

    #[test]
    fn the_output_budget_is_what_the_window_leaves_beside_the_prompt_and_its_margin() {
        assert_eq!(room(n(32_768), 16_000), 32_768 - 18_000);
        // An estimate past the window leaves nothing: the router sent it nowhere.
        assert_eq!(room(n(32_768), 40_000), 1);
        // Within the margin of the window: one token, for the engine to judge.
        assert_eq!(room(n(32_768), 30_000), 1);
        assert_eq!(room(n(8), 0), 8);
    }
}
