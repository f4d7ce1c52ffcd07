//! OpenTelemetry traces (`tracing:`): one span per request, named and attributed after the
//! GenAI semantic conventions (`chat MODEL`, `gen_ai.request.model`, `gen_ai.usage.*`) with the
//! gateway's own facts beside them (backend, route reason, TTFT, class), continued from the
//! client's W3C `traceparent` and passed on to the backend, exported over OTLP/HTTP by the SDK's
//! batch processor. Off unless configured, and then free: no layer in the stack, no header read.
//!
//! The request path holds a [`RequestSpan`] in the request's `Received` entry: the request-id
//! layer starts it, `forward` tells the backend its context, and whoever ends the request (its
//! `RequestEnd`, or the request-id layer for an answer of the gateway's own) ends it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt as _, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};

use crate::config::TracingConfig;

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The gateway's tracer: spans in, OTLP out. Cheap to share.
#[derive(Debug, Clone)]
pub(crate) struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: Arc<TraceContextPropagator>,
}

impl Tracing {
    /// Starts the exporter for `config`, sending on `runtime` (the gateway's).
    pub(crate) fn start(
        config: &TracingConfig,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, String> {
        let client = OnRuntime {
            client: crate::tls::http_client(None)?,
            runtime,
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(config.otlp_endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("tracing.otlp_endpoint: {e}"))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("tpsgate");
        Ok(Self {
            provider,
            tracer,
            propagator: Arc::new(TraceContextPropagator::new()),
        })
    }

    /// A span for a request that arrived with `headers` at `start`: a child of the client's
    /// trace when it sent a `traceparent`, else the root of a new one.
    pub(crate) fn start_request(
        &self,
        headers: &http::HeaderMap,
        method: &str,
        path: &str,
    ) -> RequestSpan {
        use opentelemetry::propagation::TextMapPropagator as _;
        let parent = self
            .propagator
            .extract(&opentelemetry_http::HeaderExtractor(headers));
        let span = self
            .tracer
            .span_builder(format!("{method} {path}"))
            .with_kind(SpanKind::Server)
            .with_start_time(SystemTime::now())
            .with_attributes([
                KeyValue::new("http.request.method", method.to_owned()),
                KeyValue::new("url.path", path.to_owned()),
            ])
            .start_with_context(&self.tracer, &parent);
        let context = span.span_context().clone();
        RequestSpan {
            context,
            propagator: Arc::clone(&self.propagator),
            span: Arc::new(Mutex::new(Some(span))),
        }
    }

    /// Exports what is buffered and stops the exporter (blocks: call off the runtime).
    pub(crate) fn shutdown(&self) {
        if let Err(err) = self.provider.shutdown() {
            tracing::warn!(%err, "traces not all exported at shutdown");
        }
    }
}

/// One request's span, shared by the layers that add to it; the first to end it wins.
#[derive(Debug, Clone)]
pub(crate) struct RequestSpan {
    context: SpanContext,
    propagator: Arc<TraceContextPropagator>,
    span: Arc<Mutex<Option<opentelemetry_sdk::trace::Span>>>,
}

impl RequestSpan {
    /// Tells the backend this span is its request's parent (`traceparent`, `tracestate`).
    pub(crate) fn inject(&self, headers: &mut http::HeaderMap) {
        use opentelemetry::propagation::TextMapPropagator as _;
        let cx = Context::new().with_remote_span_context(self.context.clone());
        self.propagator
            .inject_context(&cx, &mut opentelemetry_http::HeaderInjector(headers));
    }

    /// Adds attributes while the span is open.
    pub(crate) fn set(&self, attributes: impl IntoIterator<Item = KeyValue>) {
        if let Some(span) = self.lock().as_mut() {
            span.set_attributes(attributes);
        }
    }

    /// Ends the span now, named `name` (when given), with `attributes`, as an error when
    /// `error` names its type; later calls do nothing.
    pub(crate) fn end(
        &self,
        name: Option<String>,
        attributes: impl IntoIterator<Item = KeyValue>,
        error: Option<&'static str>,
    ) {
        let Some(mut span) = self.lock().take() else {
            return;
        };
        if let Some(name) = name {
            span.update_name(name);
        }
        span.set_attributes(attributes);
        if let Some(kind) = error {
            span.set_attribute(KeyValue::new("error.type", kind));
            span.set_status(Status::error(kind));
        }
        span.end_with_timestamp(SystemTime::now());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<opentelemetry_sdk::trace::Span>> {
        self.span.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The exporter's HTTP client: the batch processor exports from a thread of its own, off any
/// runtime, so each export is sent on the gateway's runtime (hyper needs one) and awaited from
/// there.
#[derive(Debug)]
struct OnRuntime {
    client: crate::tls::HttpClient,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, opentelemetry_http::HttpError> {
        use http_body_util::BodyExt as _;
        let client = self.client.clone();
        let (parts, body) = request.into_parts();
        let request = http::Request::from_parts(parts, http_body_util::Full::new(body));
        let sent = self.runtime.spawn(async move {
            let response = client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, opentelemetry_http::HttpError>(http::Response::from_parts(parts, body))
        });
        sent.await?
    }
}
