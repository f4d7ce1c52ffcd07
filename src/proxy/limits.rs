//! Limits on what a client sends before its body: the request head (its line and its header
//! fields) is at most `limits.max_header_bytes`, answered with a 431 in the client's dialect
//! otherwise, on HTTP/1.1 and HTTP/2 alike. (The listener lets heads of up to twice the limit
//! through its HTTP layers, so that this layer, not a dropped connection, answers them; the body
//! is bounded where it is read, in classify.)

use std::task::{Context, Poll};

use futures_util::future::{Either, Ready, ready};
use http::Request;
use tower::{Layer, Service};

use crate::error::{Error, ErrorKind};

/// Refuses heads over a size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadLimitLayer {
    max_bytes: usize,
}

impl HeadLimitLayer {
    /// Heads over `max_bytes` are refused.
    pub(crate) const fn new(max_bytes: usize) -> Self {
        Self { max_bytes }
    }
}

impl<S> Layer<S> for HeadLimitLayer {
    type Service = HeadLimit<S>;

    fn layer(&self, inner: S) -> HeadLimit<S> {
        HeadLimit {
            inner,
            max_bytes: self.max_bytes,
        }
    }
}

/// See [`HeadLimitLayer`].
#[derive(Debug, Clone)]
pub(crate) struct HeadLimit<S> {
    inner: S,
    max_bytes: usize,
}

/// The size of a request head as HTTP/1.1 writes it: the request line and each field with its
/// `: ` and line end (HTTP/2 counts a field's name and value plus 32; close enough for a limit).
pub(crate) fn head_bytes<B>(req: &Request<B>) -> usize {
    let line = req.method().as_str().len()
        + req.uri().path_and_query().map_or(1, |p| p.as_str().len())
        + 12;
    req.headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + line
}

impl<S, B> Service<Request<B>> for HeadLimit<S>
where
    S: Service<Request<B>, Error = Error>,
{
    type Response = S::Response;
    type Error = Error;
    type Future = Either<Ready<Result<S::Response, Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let size = head_bytes(&req);
        if size > self.max_bytes {
            return Either::Left(ready(Err(Error::new(
                ErrorKind::HeadersTooLarge,
                format!(
                    "the request head is {size} bytes, over the gateway's limit of {} (limits.max_header_bytes)",
                    self.max_bytes
                ),
            ))));
        }
        Either::Right(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use tower::{ServiceExt as _, service_fn};

    use super::*;

    #[tokio::test]
    async fn a_head_over_the_limit_is_refused_and_one_within_it_passes() {
        let svc = HeadLimitLayer::new(200)
            .layer(service_fn(|_: Request<()>| async { Ok::<_, Error>(()) }));
        let request = |pad: usize| {
            Request::post("/v1/chat/completions")
                .header("x-pad", "a".repeat(pad))
                .body(())
                .unwrap()
        };
        // POST /v1/chat/completions HTTP/1.1: 36 bytes; x-pad: N bytes + 9.
        assert_eq!(head_bytes(&request(100)), 36 + 109);
        assert!(svc.clone().oneshot(request(155)).await.is_ok());
        let err = svc.oneshot(request(156)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::HeadersTooLarge);
        assert_eq!(err.kind().status(), 431);
    }
}
