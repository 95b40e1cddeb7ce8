//! The one clock module.
//!
//! Every duration in matrix-proxy is measured on one monotonic clock, read here and only
//! here: [`now_ns`] returns nanoseconds since a process-wide base instant. The wall clock
//! is read only by [`wall_now_us`], which gives the `started_at` column of each exchange and
//! the UTC times in `config.json`. `clippy.toml` bans `Instant::now` and `SystemTime::now`
//! elsewhere, so a second clock cannot creep into the data path.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

static BASE: OnceLock<Instant> = OnceLock::new();

#[allow(clippy::disallowed_methods)]
fn base() -> Instant {
    *BASE.get_or_init(Instant::now)
}

/// Monotonic nanoseconds since the process's clock base. Never 0 (0 is used as "unset"
/// by the lock-free stamps in the engine).
#[allow(clippy::disallowed_methods)]
pub fn now_ns() -> u64 {
    let base = base();
    let ns = Instant::now().saturating_duration_since(base).as_nanos();
    u64::try_from(ns).unwrap_or(u64::MAX).max(1)
}

/// Microseconds from `t0_ns` to `t_ns`, both from [`now_ns`], saturating at 0.
pub(crate) fn us_between(t0_ns: u64, t_ns: u64) -> i64 {
    i64::try_from(t_ns.saturating_sub(t0_ns) / 1_000).unwrap_or(i64::MAX)
}

/// CPU time used by this process so far (user + system, all threads), in nanoseconds:
/// the accounting of getrusage(RUSAGE_SELF), read through CLOCK_PROCESS_CPUTIME_ID for
/// nanosecond resolution.
pub(crate) fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// CPU time used by the calling thread so far, in nanoseconds (CLOCK_THREAD_CPUTIME_ID):
/// what the recorder measures its slices of work in.
pub(crate) fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// Wall-clock microseconds since the Unix epoch (UTC). The only wall-clock read.
#[allow(clippy::disallowed_methods)]
pub(crate) fn wall_now_us() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// ISO 8601 UTC rendering of a wall-clock microsecond timestamp, e.g.
/// `2026-11-29T22:54:26.123456Z`.
pub(crate) fn iso_utc(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string())
        .unwrap_or_else(|| "1970-01-01T00:00:00.000000Z".to_string())
}

/// Microseconds since the Unix epoch of an RFC 3339 time with a zone (what
/// [`iso_utc`] writes); the parser's reason when it is not one.
pub(crate) fn parse_rfc3339_us(s: &str) -> Result<i64, chrono::ParseError> {
    chrono::DateTime::parse_from_rfc3339(s).map(|t| t.timestamp_micros())
}

/// Compact UTC stamp for directory names: `20261129T225426Z`.
pub(crate) fn compact_utc(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .map(|t| t.format("%Y%m%dT%H%M%SZ").to_string())
        .unwrap_or_else(|| "19700101T000000Z".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_and_nonzero() {
        let a = now_ns();
        let b = now_ns();
        assert!(a >= 1);
        assert!(b >= a);
        assert_eq!(us_between(b, a), 0, "saturates instead of going negative");
        assert_eq!(us_between(1_000, 3_500_000), 3_499);
    }

    #[test]
    fn utc_rendering() {
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(compact_utc(1_000_000), "19700101T000001Z");
    }
}
