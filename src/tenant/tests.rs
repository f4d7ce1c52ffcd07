use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::config::{ApiKey, Budget, KeyGrant, KeyLimits, Secret};

fn limits() -> KeyLimits {
    KeyLimits::default()
}

fn key(name: &str, limits: KeyLimits) -> ApiKey {
    ApiKey {
        key: Secret::new(format!("sk-{name}")),
        name: name.into(),
        class: None,
        grant: Arc::new(KeyGrant::default()),
        limits,
        weight: 1.0,
    }
}

/// A key named `a` with `limits`, and the time it was made.
fn tenant(limits: KeyLimits) -> (Instant, Arc<Tenant>) {
    let now = Instant::now();
    (now, Tenant::new("a".into(), limits, now))
}

/// 2026-11-25 12:00:00 UTC.
const NOON: i64 = 1_795_608_000;

#[test]
fn requests_per_minute_admits_a_burst_up_to_the_limit_then_refills_at_its_rate() {
    let (now, tenant) = tenant(KeyLimits {
        requests_per_minute: Some(3),
        ..limits()
    });
    let mut held = Vec::new();
    for remaining in [2, 1, 0] {
        let (charge, quota) = tenant.admit(10, 10, now, NOON).unwrap();
        assert_eq!(quota.requests.unwrap().remaining, remaining);
        held.push(charge);
    }
    let refusal = tenant.admit(10, 10, now, NOON).unwrap_err();
    assert_eq!(refusal.limit, Limit::Requests);
    // One request comes back every 20 s.
    assert_eq!(refusal.retry_after, Duration::from_secs(20));
    assert!(
        tenant
            .admit(10, 10, now + Duration::from_secs(20), NOON)
            .is_ok()
    );
    assert_eq!(tenant.usage(now, NOON).limited_total, 1);
}

#[test]
fn tokens_per_minute_draws_the_estimate_and_the_end_settles_what_was_used() {
    let (now, tenant) = tenant(KeyLimits {
        tokens_per_minute: Some(1_000),
        ..limits()
    });
    let (charge, quota) = tenant.admit(100, 500, now, NOON).unwrap();
    assert_eq!(quota.tokens.unwrap().remaining, 400);
    // 500 more would not fit while the estimate is drawn.
    assert_eq!(
        tenant.admit(100, 400, now, NOON).unwrap_err().limit,
        Limit::Tokens
    );
    // The stream used 100 + 50: the unused 450 come back.
    charge.settle(Some(100), Some(50), Bill::default(), NOON);
    let usage = tenant.usage(now, NOON);
    assert_eq!(usage.tokens_per_minute.unwrap().remaining, 850);
    assert_eq!(
        (usage.input_tokens_total, usage.output_tokens_total),
        (100, 50)
    );
    assert!(tenant.admit(100, 400, now, NOON).is_ok());
}

#[test]
fn a_request_that_used_more_than_its_estimate_leaves_a_debt_refilled_before_the_next() {
    let (now, tenant) = tenant(KeyLimits {
        tokens_per_minute: Some(600),
        ..limits()
    });
    let (charge, _) = tenant.admit(100, 100, now, NOON).unwrap();
    charge.settle(Some(100), Some(800), Bill::default(), NOON);
    // 900 used of 600: 300 in debt, and the next 60-token request waits for 360 to refill.
    let refusal = tenant.admit(30, 30, now, NOON).unwrap_err();
    assert_eq!(refusal.limit, Limit::Tokens);
    // (The settling read the clock a moment after `now`.)
    assert!((refusal.retry_after.as_secs_f64() - 36.0).abs() < 0.5);
    assert_eq!(refusal.quota.tokens.unwrap().remaining, 0);
}

#[test]
fn a_request_larger_than_the_whole_limit_waits_for_a_full_bucket_not_for_ever() {
    let (now, tenant) = tenant(KeyLimits {
        tokens_per_minute: Some(1_000),
        ..limits()
    });
    assert!(tenant.admit(4_000, 1_000, now, NOON).is_ok());
}

#[test]
fn a_charge_dropped_unsettled_gives_its_estimate_back_and_its_slot() {
    let (now, tenant) = tenant(KeyLimits {
        tokens_per_minute: Some(1_000),
        max_concurrency: Some(1),
        ..limits()
    });
    let (charge, _) = tenant.admit(300, 300, now, NOON).unwrap();
    let refusal = tenant.admit(1, 1, now, NOON).unwrap_err();
    assert_eq!(refusal.limit, Limit::Concurrency);
    drop(charge);
    let usage = tenant.usage(now, NOON);
    assert_eq!(usage.in_flight, 0);
    assert_eq!(usage.tokens_per_minute.unwrap().remaining, 1_000);
    assert!(tenant.admit(1, 1, now, NOON).is_ok());
}

#[test]
fn a_budget_refuses_once_spent_until_its_period_renews() {
    let (now, tenant) = tenant(KeyLimits {
        budget: Some(Budget {
            usd: 1.0,
            period: BudgetPeriod::Day,
        }),
        ..limits()
    });
    let (charge, _) = tenant.admit(1_000, 1_000, now, NOON).unwrap();
    // A million input tokens at $1 per million: the whole budget.
    let bill = Bill {
        tokens: Price {
            input_per_1m: 1.0,
            output_per_1m: 2.0,
        },
        engine_usd: 0.0,
    };
    charge.settle(Some(1_000_000), Some(0), bill, NOON);
    let refusal = tenant.admit(1, 1, now, NOON).unwrap_err();
    assert_eq!(refusal.limit, Limit::Budget);
    assert_eq!(refusal.retry_after, Duration::from_secs(12 * 3_600));
    // Midnight: a new day, a new budget.
    assert!(tenant.admit(1, 1, now, NOON + 12 * 3_600).is_ok());
    assert_eq!(tenant.usage(now, NOON + 12 * 3_600).spent_usd, 0.0);
}

#[test]
fn budget_periods_are_utc_hours_days_and_calendar_months() {
    // 2026-11-25 12:00 UTC.
    assert_eq!(period::of(BudgetPeriod::Hour, NOON).1, NOON + 3_600);
    assert_eq!(period::of(BudgetPeriod::Day, NOON).1, NOON + 12 * 3_600);
    // December 1st, 00:00 UTC.
    assert_eq!(period::of(BudgetPeriod::Month, NOON).1, 1_796_083_200);
    // A December ends in the next year's January.
    let (december, end) = period::of(BudgetPeriod::Month, 1_796_083_200);
    assert_eq!(end, 1_798_761_600);
    assert_eq!(period::of(BudgetPeriod::Month, end).0, december + 1);
}

#[test]
fn a_reload_keeps_each_keys_usage_by_name_and_applies_its_new_limits() {
    let now = Instant::now();
    let rpm = |n| KeyLimits {
        requests_per_minute: Some(n),
        ..limits()
    };
    let accounts = |keys: &[ApiKey]| -> Vec<(Arc<str>, KeyLimits, f64)> {
        keys.iter()
            .map(|k| (Arc::clone(&k.name), k.limits, k.weight))
            .collect()
    };
    let first = accounts(&[key("a", rpm(10)), key("b", rpm(10))]);
    let before = Tenants::build(first.iter().map(|(n, l, w)| (n, *l, *w)), None, now, 1000);
    for _ in 0..4 {
        drop(before.get(0).unwrap().admit(1, 1, now, NOON).unwrap());
    }
    let second = accounts(&[key("c", rpm(10)), key("a", rpm(5))]);
    let after = Tenants::build(
        second.iter().map(|(n, l, w)| (n, *l, *w)),
        Some(&before),
        now,
        1000,
    );
    let a = after.get(1).unwrap();
    assert!(Arc::ptr_eq(a, before.get(0).unwrap()));
    // 4 used of a limit now 5: 1 left.
    assert_eq!(a.usage(now, NOON).requests_per_minute.unwrap().remaining, 1);
    assert_eq!(a.usage(now, NOON).requests_total, 4);
    assert_eq!(after.get(0).unwrap().usage(now, NOON).requests_total, 0);
    assert!(after.usage(now, NOON).iter().all(|u| &*u.name != "b"));
}
