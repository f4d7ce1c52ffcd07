//! Retry over the real Route and router, with a stand-in upstream that fails on some backends.

use tower::{ServiceExt as _, service_fn};

use super::*;
use crate::proxy::route::RouteLayer;
use crate::proxy::testing::{Seen, answer, chat, routed_to, router};

/// Retry over Route over a stand-in that answers `status_of(backend)` and records each attempt.
fn retry(
    router: &Arc<Router>,
    max_attempts: u32,
    budget: RetryBudget,
    status_of: fn(&str) -> u16,
) -> (
    impl Service<Request<Bytes>, Response = Response<ProxyBody>, Error = Error>,
    Seen,
) {
    let seen = Seen::default();
    let log = Arc::clone(&seen);
    let upstream = service_fn(move |req: Request<Bytes>| {
        let backend = routed_to(&req);
        log.lock().unwrap().push(backend.clone());
        let status = status_of(&backend);
        async move {
            if status == 0 {
                Err(Error::new(ErrorKind::UpstreamUnreachable, "cannot connect"))
            } else {
                Ok(answer(status))
            }
        }
    });
    let stack = tower::ServiceBuilder::new()
        .layer(RetryLayer::new(Arc::clone(router), max_attempts, budget))
        .layer(RouteLayer::new(Arc::clone(router)))
        .service(upstream);
    (stack, seen)
}

fn budget() -> RetryBudget {
    RetryBudget::new(0.2)
}

/// `a` cannot be reached, `b` answers 200.
fn a_down(backend: &str) -> u16 {
    if backend == "a" { 0 } else { 200 }
}

#[tokio::test(start_paused = true)]
async fn a_request_that_fails_before_content_is_answered_by_another_backend() {
    let router = router(&["a", "b"], &[]);
    for _ in 0..4 {
        let (svc, seen) = retry(&router, 2, budget(), a_down);
        let resp = svc.oneshot(chat(&router, None)).await.unwrap();
        assert_eq!(resp.status(), 200);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.last().map(String::as_str), Some("b"), "{seen:?}");
        assert!(seen.len() <= 2);
    }
}

#[tokio::test(start_paused = true)]
async fn a_5xx_or_429_head_is_retried_too_but_a_4xx_is_an_answer() {
    let router = router(&["a", "b"], &[]);
    for (status, attempts) in [(503, 2), (429, 2), (400, 1)] {
        let (svc, seen) = retry(&router, 2, budget(), |_| 0);
        let _ = svc.oneshot(chat(&router, None)).await;
        assert_eq!(seen.lock().unwrap().len(), 2, "unreachable: retried");
        let status_of: fn(&str) -> u16 = match status {
            503 => |_| 503,
            429 => |_| 429,
            _ => |_| 400,
        };
        let (svc, seen) = retry(&router, 2, budget(), status_of);
        let resp = svc.oneshot(chat(&router, None)).await.unwrap();
        assert_eq!(resp.status(), status);
        assert_eq!(seen.lock().unwrap().len(), attempts, "{status}");
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_stop_at_max_attempts() {
    let router = router(&["a", "b", "c"], &[]);
    let (svc, seen) = retry(&router, 2, budget(), |_| 502);
    let resp = svc.oneshot(chat(&router, None)).await.unwrap();
    assert_eq!(resp.status(), 502);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn one_backend_serving_the_model_means_one_attempt() {
    let router = router(&["a"], &[]);
    let (svc, seen) = retry(&router, 3, budget(), |_| 502);
    let resp = svc.oneshot(chat(&router, None)).await.unwrap();
    assert_eq!(resp.status(), 502);
    assert_eq!(*seen.lock().unwrap(), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn an_empty_budget_allows_no_retry() {
    let router = router(&["a", "b"], &[]);
    let empty = RetryBudget::new(0.0);
    while empty.withdraw() {}
    let (svc, seen) = retry(&router, 2, empty, |_| 502);
    let resp = svc.oneshot(chat(&router, None)).await.unwrap();
    assert_eq!(resp.status(), 502);
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn when_no_other_backend_can_take_it_the_first_answer_stands() {
    // A class that sheds rather than squeeze in where the SLO is not predicted to hold.
    let router = router(
        &["a", "b"],
        &["{name: interactive, min_tps: 10, on_miss: shed}"],
    );
    let (svc, seen) = retry(&router, 2, budget(), |_| 503);
    // Both are cold, taking one request at a time: `b` has its one.
    let _held = crate::fleet::InFlightGuard::try_admit(&router.backends()[1], Some(0)).unwrap();
    let resp = svc.oneshot(chat(&router, Some(0))).await.unwrap();
    assert_eq!(resp.status(), 503, "the first attempt's answer");
    assert_eq!(*seen.lock().unwrap(), ["a"], "no second attempt was made");
}

#[test]
fn the_budget_starts_with_a_reserve_and_refills_by_its_ratio() {
    let budget = RetryBudget::new(0.5);
    let spent = std::iter::from_fn(|| budget.withdraw().then_some(())).count();
    assert_eq!(spent, RetryBudget::RESERVE as usize);
    budget.deposit();
    assert!(!budget.withdraw(), "half a retry is not a retry");
    budget.deposit();
    assert!(budget.withdraw());
}
