//! Route, the real layer over the real router, with a stand-in for the layers below it.

use tower::{ServiceExt as _, service_fn};

use super::*;
use crate::proxy::testing::{Seen, answer, chat, routed_to, router};

/// Route over a stand-in that answers 200 and records where each request was routed.
fn route(
    router: &Arc<Router>,
) -> (
    impl Service<Request<Bytes>, Response = Response<ProxyBody>, Error = Error>,
    Seen,
) {
    let seen = Seen::default();
    let log = Arc::clone(&seen);
    let inner = service_fn(move |req: Request<Bytes>| {
        log.lock().unwrap().push(routed_to(&req));
        async { Ok::<_, Error>(answer(200)) }
    });
    (RouteLayer::new(Arc::clone(router)).layer(inner), seen)
}

#[tokio::test]
async fn a_request_goes_down_with_its_decision_and_its_slot_is_released_with_a_local_body() {
    let router = router(&["a"], &[]);
    let (svc, seen) = route(&router);
    let resp = svc.oneshot(chat(&router, None)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(*seen.lock().unwrap(), ["a"]);
    // A body the gateway made has nothing to wait for: the slot went with the response head.
    assert_eq!(router.backends()[0].in_flight(), 0);
}

#[tokio::test]
async fn an_attempt_after_a_failure_avoids_the_backends_already_tried() {
    let router = router(&["a", "b"], &[]);
    let (mut svc, seen) = route(&router);
    let tried = Tried::default();
    for _ in 0..2 {
        let mut req = chat(&router, None);
        req.extensions_mut().insert(tried.clone());
        svc.ready().await.unwrap().call(req).await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_ne!(seen[0], seen[1], "the second attempt went elsewhere");
    assert_eq!(tried.backends().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_retry_never_waits_in_line_but_a_first_attempt_does() {
    // The class queues for up to a minute on a miss.
    let router = router(
        &["a"],
        &["{name: batch, on_miss: queue, queue_max_wait_ms: 60000}"],
    );
    let (mut svc, _) = route(&router);
    // A backend never observed takes one request at a time: hold that one.
    let _held = crate::fleet::InFlightGuard::try_admit(&router.backends()[0], Some(0)).unwrap();
    let mut retry = chat(&router, Some(0));
    let tried = Tried::default();
    tried.add(7); // a backend an earlier attempt went to
    retry.extensions_mut().insert(tried);
    let err = svc.ready().await.unwrap().call(retry).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoBackendAvailable);
    let first = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        svc.ready().await.unwrap().call(chat(&router, Some(0))),
    )
    .await;
    assert!(first.is_err(), "a first attempt waits in the class's line");
}

#[tokio::test]
async fn a_request_that_was_never_classified_is_our_bug_not_the_clients() {
    let router = router(&["a"], &[]);
    let (svc, _) = route(&router);
    let err = svc.oneshot(Request::new(Bytes::new())).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert_eq!(err.kind().status(), 500);
}
