//! Models: `GET /v1/models` answered by the gateway itself, from the backends it routes to: the
//! union of their client model names in OpenAI's list format (the first backend in config order
//! that serves a name is its `owned_by`).

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::{Either, Ready, ready};
use http::{HeaderValue, Request, Response, header};
use serde_json::json;
use tower::{Layer, Service};

use super::body::ProxyBody;
use super::endpoint::Endpoint;
use crate::error::Error;
use crate::router::Router;

/// Answers `GET /v1/models`; passes everything else on.
#[derive(Debug, Clone)]
pub(crate) struct ModelsLayer {
    router: Arc<Router>,
}

impl ModelsLayer {
    /// The layer listing `router`'s models.
    pub(crate) const fn new(router: Arc<Router>) -> Self {
        Self { router }
    }
}

impl<S> Layer<S> for ModelsLayer {
    type Service = Models<S>;

    fn layer(&self, inner: S) -> Models<S> {
        Models {
            inner,
            router: Arc::clone(&self.router),
        }
    }
}

/// See [`ModelsLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Models<S> {
    inner: S,
    router: Arc<Router>,
}

impl<S, B> Service<Request<B>> for Models<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = Error>,
{
    type Response = Response<ProxyBody>;
    type Error = Error;
    type Future = Either<Ready<Result<Response<ProxyBody>, Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // Classify has vetted the method: the path alone tells (cheaper than the extensions).
        let listing = Endpoint::from_path(req.uri().path()) == Some(Endpoint::Models);
        if listing {
            Either::Left(ready(Ok(list(&self.router))))
        } else {
            Either::Right(self.inner.call(req))
        }
    }
}

/// The model list, in OpenAI's format.
fn list(router: &Router) -> Response<ProxyBody> {
    let data: Vec<_> = router
        .models()
        .iter()
        .map(|(id, owner)| json!({"id": id, "object": "model", "created": 0, "owned_by": owner}))
        .collect();
    let body = json!({"object": "list", "data": data}).to_string();
    let mut resp = Response::new(ProxyBody::full(Bytes::from(body)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;
    use tower::{ServiceExt as _, service_fn};

    use super::*;
    use crate::proxy::testing::{answer, chat, router};

    #[tokio::test]
    async fn the_model_list_is_the_gateways_own_answer_and_other_requests_pass() {
        let router = router(&["a", "b"], &[]);
        let inner = service_fn(|_: Request<Bytes>| async { Ok::<_, Error>(answer(204)) });
        let svc = ModelsLayer::new(Arc::clone(&router)).layer(inner);
        let list = Request::get("/v1/models").body(Bytes::new()).unwrap();
        let resp = svc.clone().oneshot(list).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            json!({"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "a"}]})
        );
        let passed = svc.oneshot(chat(&router, None)).await.unwrap();
        assert_eq!(passed.status(), 204);
    }
}
