//! The wall clock and its two text forms: [`now_ms`] for stored timestamps, [`rfc3339`] for probe
//! records, [`today`] for matrix rows.
//!
//! Every date callid writes is UTC in the proleptic Gregorian calendar, computed here by one
//! algorithm ([`civil_from_days`]), so a probe record's date and a matrix row's date of the same
//! instant always agree. A clock before 1970 reads as the epoch rather than failing: a timestamp
//! is never a reason to refuse a call.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    since_epoch().as_millis() as i64
}

/// Current time as RFC 3339 UTC with milliseconds (`2026-11-29T23:12:35.123Z`).
pub fn now_rfc3339() -> String {
    let now = since_epoch();
    rfc3339(now.as_secs() as i64, now.subsec_millis())
}

/// Today's date in UTC, `YYYY-MM-DD`.
pub fn today() -> String {
    let (y, m, d) = civil_from_days(since_epoch().as_secs() as i64 / 86_400);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Formats seconds since the Unix epoch (UTC) plus milliseconds as RFC 3339.
pub fn rfc3339(secs: i64, millis: u32) -> String {
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The `(year, month, day)` of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn since_epoch() -> std::time::Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        for (days, want) in [
            (0, (1970, 1, 1)),
            (-1, (1969, 12, 31)),
            (11_016, (2000, 2, 29)),
            (11_017, (2000, 3, 1)),
            (20_786, (2026, 11, 29)),
            (47_541, (2100, 3, 1)),
        ] {
            assert_eq!(civil_from_days(days), want, "day {days}");
        }
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_796_000_000, 999), "2026-11-30T00:53:20.999Z");
        assert_eq!(rfc3339(-1, 0), "1969-12-31T23:59:59.000Z");
    }

    #[test]
    fn today_is_the_date_of_now() {
        let (before, day, after) = (now_rfc3339(), today(), now_rfc3339());
        assert!(
            before.starts_with(&day) || after.starts_with(&day),
            "{before} {day} {after}"
        );
        assert!(now_ms() > 1_700_000_000_000);
    }
}
