//! Budget periods: calendar hours, days and months in UTC, numbered so that a change of number
//! is a new period.

use time::{Date, Month, OffsetDateTime, Time};

use crate::config::BudgetPeriod;

/// The period holding `unix_s`: its number, and the second it ends (the next one starts).
pub(super) fn of(period: BudgetPeriod, unix_s: i64) -> (i64, i64) {
    let every = |seconds: i64| {
        let n = unix_s.div_euclid(seconds);
        (n, (n + 1) * seconds)
    };
    match period {
        BudgetPeriod::Hour => every(3_600),
        BudgetPeriod::Day => every(86_400),
        BudgetPeriod::Month => {
            let Ok(at) = OffsetDateTime::from_unix_timestamp(unix_s) else {
                // Out of the calendar's range: one period, never ending.
                return (0, i64::MAX);
            };
            let (year, month) = (at.year(), at.month());
            let n = i64::from(year) * 12 + i64::from(u8::from(month)) - 1;
            let next_year = if month == Month::December {
                year + 1
            } else {
                year
            };
            let end = Date::from_calendar_date(next_year, month.next(), 1).map_or(i64::MAX, |d| {
                d.with_time(Time::MIDNIGHT).assume_utc().unix_timestamp()
            });
            (n, end)
        }
    }
}
