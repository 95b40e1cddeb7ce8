//! The documents a run writes, as types: `config.json` ([`config`]), `summary.json` of a
//! replay or a serve run ([`summary`]), `campaign.json` ([`campaign`]), `verdict.json`
//! ([`verdict`]) and `compare.json` ([`compare`]), and `recovery.json` ([`recovery`]). Each is built once from measurements,
//! written with [`crate::record::rundir::json_bytes`], and read back with the same type
//! (`FinishedRun`), so no reader indexes JSON by string. The field order is the key order
//! of the file; an `Option` is written as `null` unless the file has always left the key
//! out (those say so with `skip_serializing_if`).

pub(crate) mod campaign;
pub(crate) mod compare;
pub(crate) mod config;
pub(crate) mod recovery;
pub(crate) mod summary;
pub(crate) mod verdict;
pub(crate) mod worker;

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::metrics::Percentiles;
use crate::model::Outcome;

/// Failures by kind, in the order of [`Outcome`] (the outcome's column value as key).
pub(crate) type Failures = BTreeMap<Outcome, u64>;

/// Nearest-rank percentiles in seconds (`null` without a sample).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Pct {
    pub(crate) p50: Option<f64>,
    pub(crate) p95: Option<f64>,
    pub(crate) p99: Option<f64>,
}

/// Microseconds as seconds.
pub(crate) fn secs(us: Option<i64>) -> Option<f64> {
    us.map(|v| v as f64 / 1e6)
}

/// Seconds as whole microseconds (the inverse of [`secs`] for a read-back document).
pub(crate) fn us(s: Option<f64>) -> Option<i64> {
    s.map(|v| (v * 1e6).round() as i64)
}

impl Pct {
    pub(crate) fn of(p: &Percentiles) -> Pct {
        Pct {
            p50: secs(p.p50),
            p95: secs(p.p95),
            p99: secs(p.p99),
        }
    }

    /// Back to microseconds.
    pub(crate) fn percentiles(&self) -> Percentiles {
        Percentiles {
            p50: us(self.p50),
            p95: us(self.p95),
            p99: us(self.p99),
        }
    }
}

/// A key that a file has only sometimes: absent (`None`), `null` (`Some(None)`) or a value.
/// Serialize with `skip_serializing_if = "Option::is_none"`, read with
/// `deserialize_with = "present"` and `default`.
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}
