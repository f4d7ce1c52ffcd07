//! Which API a request path belongs to.

use crate::config::BackendDialect;
use crate::sse::events::StreamDialect;

/// The client-facing endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// `POST /v1/messages/count_tokens` (Anthropic): an Anthropic backend counts, an OpenAI
    /// engine is asked its `/tokenize`.
    CountTokens,
    /// `GET /v1/models`: answered by the gateway.
    Models,
    /// Any other `/v1/*` path: passed through to a backend serving the body's model, or to the
    /// default backend. Under `/v1/messages/` it is Anthropic's, else OpenAI's.
    Other {
        /// Anthropic path (`/v1/messages/...`).
        anthropic: bool,
    },
}

impl Endpoint {
    /// The endpoint of `path`, or `None` outside `/v1/`.
    pub(crate) fn from_path(path: &str) -> Option<Self> {
        Some(match path {
            "/v1/chat/completions" => Self::Chat,
            "/v1/completions" => Self::Completions,
            "/v1/responses" => Self::Responses,
            "/v1/messages" => Self::Messages,
            "/v1/messages/count_tokens" => Self::CountTokens,
            "/v1/models" => Self::Models,
            p if p.starts_with("/v1/messages/") => Self::Other { anthropic: true },
            p if p.starts_with("/v1/") => Self::Other { anthropic: false },
            _ => return None,
        })
    }

    /// Whether errors for this path take Anthropic's shape.
    pub(crate) fn is_anthropic(path: &str) -> bool {
        path == "/v1/messages" || path.starts_with("/v1/messages/")
    }

    /// The backend dialect that can serve it.
    pub(crate) fn dialect(self) -> BackendDialect {
        match self {
            Self::Messages | Self::CountTokens | Self::Other { anthropic: true } => {
                BackendDialect::Anthropic
            }
            _ => BackendDialect::Openai,
        }
    }

    /// Generation endpoints need a JSON body naming a model and are POST only.
    pub(crate) fn generates(self) -> bool {
        matches!(
            self,
            Self::Chat | Self::Completions | Self::Responses | Self::Messages
        )
    }

    /// How its streams are read.
    pub(crate) fn stream_dialect(self) -> StreamDialect {
        match self {
            Self::Messages | Self::CountTokens | Self::Other { anthropic: true } => {
                StreamDialect::Anthropic
            }
            Self::Responses => StreamDialect::Responses,
            _ => StreamDialect::OpenAi,
        }
    }

    /// Whether `include_usage` can be injected (OpenAI chat and completions streams).
    pub(crate) fn takes_include_usage(self) -> bool {
        matches!(self, Self::Chat | Self::Completions)
    }
}
