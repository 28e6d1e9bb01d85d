//! Store time: UTC instants kept as unix milliseconds in both databases (one integer type, no
//! dialect-specific date handling) and shown as RFC 3339 in the admin API.

use serde::{Serialize, Serializer};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A UTC instant in unix milliseconds; serialises as RFC 3339 (`2025-01-02T03:04:05.678Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The current time from the process clock. Leases compare these across processes, so the
    /// hosts sharing a database are assumed to run NTP (skew well below a lease's ttl).
    pub fn now() -> Self {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Timestamp(ms)
    }

    /// Unix milliseconds.
    pub fn millis(self) -> i64 {
        self.0
    }

    /// This instant moved `d` into the future.
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(
            self.0
                .saturating_add(d.as_millis().min(i64::MAX as u128) as i64),
        )
    }

    /// This instant moved `d` into the past.
    pub fn minus(self, d: Duration) -> Self {
        Timestamp(
            self.0
                .saturating_sub(d.as_millis().min(i64::MAX as u128) as i64),
        )
    }

    /// RFC 3339 in UTC with millisecond precision.
    pub fn to_rfc3339(self) -> String {
        let secs = self.0.div_euclid(1000);
        let ms = self.0.rem_euclid(1000);
        let days = secs.div_euclid(86_400);
        let tod = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
            tod / 3600,
            (tod / 60) % 60,
            tod % 60
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's algorithm; avoids a date crate for one conversion).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_epoch_and_a_leap_day() {
        assert_eq!(Timestamp(0).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        // 2024-02-29T12:34:56.789Z
        assert_eq!(
            Timestamp(1_709_210_096_789).to_rfc3339(),
            "2024-02-29T12:34:56.789Z"
        );
    }
}
