//! A plan's `load` (closed or open loop; for an open loop the arrival process, its seed,
//! the rates, how long each round runs and the bound on requests in flight; for a trace,
//! where its entries are, its speed-up, window and warm-up) and its `slo` (per-request
//! bounds that goodput counts against). Validated here, with every problem and its path;
//! the schedules themselves come from `arrival`; a trace load is `trace_load.rs`'s, its
//! entries `trace.rs`'s.

use serde_json::{Map, Value};

use super::json::Validator;
use super::trace::Trace;
pub(crate) use super::trace_load::{Pick, TraceLoad, TraceSource};
use crate::arrival::{self, Arrival, Extent};
use crate::model::Slo;
use crate::oracle::json_kind;

/// The most requests a round may plan: its samples are kept in memory for exact nearest
/// rank (about 100 bytes each, plus 8 per streamed token), so 10 million is about 1 GB.
/// The same bound as an open round's arrivals.
pub(crate) const MAX_REQUESTS_PER_CASE: usize = crate::arrival::MAX_ARRIVALS;

/// Closed loop (c workers, each sends its next request when the last ends) or open loop
/// (requests sent at scheduled instants, whatever the worker does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Closed,
    Open,
    /// An open loop whose arrivals are a trace's entries, at their recorded offsets.
    Trace,
}

impl Mode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mode::Closed => "closed",
            Mode::Open => "open",
            Mode::Trace => "trace",
        }
    }

    /// Sends at scheduled instants (an open loop or a trace), not from `c` workers.
    pub(crate) fn is_open(self) -> bool {
        self != Mode::Closed
    }
}

/// The plan's `load` section, resolved with its defaults.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Load {
    pub(crate) mode: Mode,
    /// Default Poisson (also the arrival of `--sweep`'s open rates in a closed plan).
    pub(crate) arrival: Arrival,
    /// Default 0.
    pub(crate) seed: u64,
    /// Open mode: the levels, in plan order (empty in closed mode).
    pub(crate) rates_per_second: Vec<f64>,
    /// Open mode: how long each round runs (`duration_seconds`) or how many arrivals it
    /// has (`requests`). Closed mode: `requests_per_case` arrivals (for `--sweep`).
    pub(crate) extent: Extent,
    /// Requests in flight at most; the next send waits (default [`DEFAULT_MAX_IN_FLIGHT`]).
    pub(crate) max_in_flight: usize,
    /// Trace mode: the trace and how it is replayed.
    pub(crate) trace: Option<Box<TraceLoad>>,
}

/// `max_in_flight` when the plan does not say.
pub(crate) const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// The longest an open-loop round may be scheduled for (with `requests`: on average).
const MAX_DURATION_SECONDS: f64 = 86_400.0;

/// The lowest rate a plan may ask for: one request every ~17 minutes.
const MIN_RATE: f64 = 0.001;

/// The lowest gamma shape: below it almost every gap is 0 and the rest are enormous.
const MIN_BURSTINESS: f64 = 0.01;

/// A feasibility wave of an open level is the level's own arrivals for this long (or its
/// first `ceil(rate)` arrivals when the rounds are counted in requests), excluded.
pub(crate) const FEASIBILITY_US: u64 = 1_000_000;

impl Load {
    /// A closed loop with the defaults (a plan without `load`).
    pub(crate) fn closed(requests_per_case: usize) -> Load {
        Load {
            mode: Mode::Closed,
            arrival: Arrival::Poisson,
            seed: 0,
            rates_per_second: Vec::new(),
            extent: Extent::Requests(requests_per_case as u64),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            trace: None,
        }
    }

    /// A trace load's entries, read from its file (a plan whose trace is inline has them
    /// already).
    pub(crate) fn attach_trace(&mut self, trace: Trace, cases: usize) {
        if let Some(t) = self.trace.as_mut() {
            t.set_entries(trace, cases);
        }
    }

    /// The arrival offsets (µs from the round's start) of one round of case `case` at
    /// `rate`, the level's `level`-th rate: repetition `rep`, or (`None`) the level's
    /// feasibility wave. Each (case, level, round) has its own stream of the seed.
    pub(crate) fn schedule(
        &self,
        rate: f64,
        case: usize,
        level: usize,
        rep: Option<usize>,
    ) -> Vec<u64> {
        let extent = match (rep, self.extent) {
            (Some(_), e) => e,
            (None, Extent::DurationUs(d)) => Extent::DurationUs(d.min(FEASIBILITY_US)),
            (None, Extent::Requests(n)) => Extent::Requests(n.min(rate.ceil().max(1.0) as u64)),
        };
        let stream = Self::stream(case, level, rep);
        arrival::schedule(self.arrival, rate, self.seed, stream, extent)
    }

    /// `replay --search`'s measured round at `rate`: `requests` arrivals of the plan's
    /// process, on the stream of (case, the probe's level index, repetition).
    pub(crate) fn schedule_requests(
        &self,
        rate: f64,
        (case, level, rep): (usize, usize, usize),
        requests: u64,
    ) -> Vec<u64> {
        let stream = Self::stream(case, level, Some(rep));
        arrival::schedule(
            self.arrival,
            rate,
            self.seed,
            stream,
            Extent::Requests(requests),
        )
    }

    /// The seeded stream of (case, level index, repetition; `None`: feasibility).
    fn stream(case: usize, level: usize, rep: Option<usize>) -> u64 {
        let slot = rep.map_or(0xF_FFFF, |r| (r as u64).min(0xF_FFFE));
        ((case as u64) << 40) | ((level as u64 & 0xF_FFFF) << 20) | slot
    }

    /// The plan's `load` as config.json and the workload record it.
    pub(crate) fn to_json(&self) -> Value {
        let arrival = match self.arrival {
            Arrival::Constant => Value::from("constant"),
            Arrival::Poisson => Value::from("poisson"),
            Arrival::Gamma { burstiness } => {
                serde_json::json!({"gamma": {"burstiness": burstiness}})
            }
        };
        let mut m = Map::new();
        m.insert("mode".into(), self.mode.as_str().into());
        m.insert("arrival".into(), arrival);
        m.insert("seed".into(), self.seed.into());
        m.insert("max_in_flight".into(), self.max_in_flight.into());
        if let Some(t) = &self.trace {
            m.shift_remove("arrival");
            m.shift_remove("seed");
            m.insert("trace".into(), t.to_json());
            m.insert("speedup".into(), t.speedup.into());
            m.insert(
                "start_offset_seconds".into(),
                (t.start_us as f64 / 1e6).into(),
            );
            if let Some(end) = t.end_us {
                m.insert("end_offset_seconds".into(), (end as f64 / 1e6).into());
            }
            m.insert("warmup_seconds".into(), (t.warmup_us as f64 / 1e6).into());
        }
        if self.mode == Mode::Open {
            m.insert(
                "rates_per_second".into(),
                self.rates_per_second.clone().into(),
            );
            match self.extent {
                Extent::DurationUs(d) => {
                    m.insert("duration_seconds".into(), (d as f64 / 1e6).into());
                }
                Extent::Requests(n) => {
                    m.insert("requests".into(), n.into());
                }
            }
        }
        Value::Object(m)
    }
}

/// How many of a schedule's `len` arrivals a process sends: all of them, or, as shard
/// `(i, n)`, those whose index is `i` modulo `n`.
pub(crate) fn shard_share(len: usize, shard: Option<(usize, usize)>) -> u64 {
    match shard {
        None => len as u64,
        Some((i, n)) => (len + (n - 1 - i)) as u64 / n as u64,
    }
}

/// `slo` as config.json and the workload record it (milliseconds, as the plan writes it).
pub(crate) fn slo_json(slo: &Slo) -> Value {
    let ms = |v: Option<i64>| v.map_or(Value::Null, |us| Value::from(us as f64 / 1000.0));
    serde_json::json!({"ttft_ms": ms(slo.ttft_us), "tpot_ms": ms(slo.tpot_us), "e2e_ms": ms(slo.e2e_us)})
}

const LOAD_FIELDS: &[&str] = &[
    "mode",
    "arrival",
    "seed",
    "rates_per_second",
    "duration_seconds",
    "requests",
    "max_in_flight",
];
const OPEN_ONLY: &[&str] = &["rates_per_second", "duration_seconds", "requests"];
const TRACE_FIELDS: &[&str] = &[
    "trace",
    "speedup",
    "start_offset_seconds",
    "end_offset_seconds",
    "warmup_seconds",
];

impl Validator {
    /// `load`, without `requests_per_case` (filled in by the caller for a closed loop).
    pub(super) fn load(&mut self, v: Option<&Value>) -> Option<Load> {
        let Some(v) = v else {
            return Some(Load::closed(0));
        };
        let m = self.object(v, "load")?;
        self.unknown_fields(m, "load", &[LOAD_FIELDS, TRACE_FIELDS]);
        let mode = self.mode(m);
        if mode != Some(Mode::Trace) {
            for key in TRACE_FIELDS.iter().filter(|k| m.contains_key(**k)) {
                self.err(format!("load.{key}"), "goes with load.mode \"trace\"");
            }
        }
        let arrival = match m.get("arrival") {
            None => Some(Arrival::Poisson),
            Some(v) => self.arrival(v),
        };
        let seed = match m.get("seed") {
            None => Some(0),
            Some(v) => self.integer(v, "load.seed", 0).map(|s| s as u64),
        };
        let max_in_flight = match m.get("max_in_flight") {
            None => Some(DEFAULT_MAX_IN_FLIGHT),
            Some(v) => self.integer(v, "load.max_in_flight", 1),
        };
        let (rates, extent) = match mode? {
            Mode::Trace => return self.trace_load(m, max_in_flight?),
            Mode::Open => (self.rates(m.get("rates_per_second")), self.extent(m)),
            Mode::Closed => {
                for key in OPEN_ONLY {
                    if m.contains_key(*key) {
                        self.err(
                            format!("load.{key}"),
                            "goes with load.mode \"open\"; a closed loop is sized by concurrency and requests_per_case",
                        );
                    }
                }
                (Some(Vec::new()), Some(Extent::Requests(0)))
            }
        };
        let (rates, extent) = (rates?, extent?);
        for &r in &rates {
            let expected = match extent {
                Extent::DurationUs(d) => r * d as f64 / 1e6,
                Extent::Requests(n) => n as f64,
            };
            if let Extent::Requests(n) = extent
                && n as f64 / r > MAX_DURATION_SECONDS
            {
                self.err(
                    "load.requests",
                    format!(
                        "{n} requests at {r}/s would take about {:.0} s a round, more than a day; use fewer requests or a higher rate",
                        n as f64 / r
                    ),
                );
                return None;
            }
            if expected > MAX_REQUESTS_PER_CASE as f64 {
                self.err(
                    "load.duration_seconds",
                    format!(
                        "at {r}/s a round would hold about {expected:.0} requests, above {MAX_REQUESTS_PER_CASE}: a round's samples are kept in memory for exact nearest-rank percentiles; shorten the rounds or add repetitions"
                    ),
                );
                return None;
            }
        }
        Some(Load {
            mode: mode?,
            arrival: arrival?,
            seed: seed?,
            rates_per_second: rates,
            extent,
            max_in_flight: max_in_flight?,
            trace: None,
        })
    }

    /// A trace load (`load.mode "trace"`): `load.trace` (a file and its SHA-256, or
    /// inline `entries`, resolved against the cases by the walk), `speedup`, the window
    /// and `warmup_seconds`.
    fn trace_load(&mut self, m: &Map<String, Value>, max_in_flight: usize) -> Option<Load> {
        for key in OPEN_ONLY.iter().chain(&["arrival", "seed"]) {
            if m.contains_key(*key) {
                self.err(
                    format!("load.{key}"),
                    "does not go with load.mode \"trace\": a trace's arrivals are its entries",
                );
            }
        }
        let source = self.trace_source(m.get("trace"));
        let seconds = |v: &mut Validator, key: &str| -> Option<Option<u64>> {
            match m.get(key) {
                None => Some(None),
                Some(x) if x.as_f64() == Some(0.0) => Some(Some(0)),
                Some(x) => v
                    .positive(x, &format!("load.{key}"), 1e9, None)
                    .map(|s| Some((s * 1e6).round() as u64)),
            }
        };
        let speedup = match m.get("speedup") {
            None => Some(1.0),
            Some(v) => self.positive(
                v,
                "load.speedup",
                1e6,
                Some((1e-3, "the slowest replay, a thousandth of the trace's pace")),
            ),
        };
        let start = seconds(self, "start_offset_seconds");
        let end = seconds(self, "end_offset_seconds");
        let warmup = seconds(self, "warmup_seconds");
        let (start, end) = (start?.unwrap_or(0), end?);
        if let Some(e) = end.filter(|&e| e <= start) {
            self.err(
                "load.end_offset_seconds",
                format!(
                    "{} is not after load.start_offset_seconds ({}): the window would be empty",
                    e as f64 / 1e6,
                    start as f64 / 1e6
                ),
            );
            return None;
        }
        let (source, synthetic) = source?;
        Some(Load {
            mode: Mode::Trace,
            arrival: Arrival::Poisson,
            seed: 0,
            rates_per_second: Vec::new(),
            extent: Extent::Requests(0),
            max_in_flight,
            trace: Some(Box::new(TraceLoad::new(
                source,
                speedup?,
                (start, end),
                warmup?.unwrap_or(0),
                synthetic,
            ))),
        })
    }

    /// `load.mode`: closed (the default), open or trace.
    fn mode(&mut self, m: &Map<String, Value>) -> Option<Mode> {
        match m.get("mode") {
            None => Some(Mode::Closed),
            Some(v) => match self.string(v, "load.mode") {
                Some("closed") => Some(Mode::Closed),
                Some("open") => Some(Mode::Open),
                Some("trace") => Some(Mode::Trace),
                Some(other) => {
                    self.err(
                        "load.mode",
                        format!(
                            "'{other}' is not a load mode; use \"closed\", \"open\" or \"trace\""
                        ),
                    );
                    None
                }
                None => None,
            },
        }
    }

    fn arrival(&mut self, v: &Value) -> Option<Arrival> {
        let path = "load.arrival";
        let usage = "use \"constant\", \"poisson\" or {\"gamma\": {\"burstiness\": k}}";
        match v {
            Value::String(s) if s == "constant" => Some(Arrival::Constant),
            Value::String(s) if s == "poisson" => Some(Arrival::Poisson),
            Value::Object(m) if m.len() == 1 && m.contains_key("gamma") => {
                let g = self.object(&m["gamma"], "load.arrival.gamma")?;
                self.unknown_fields(g, "load.arrival.gamma", &[&["burstiness"]]);
                let Some(k) = g.get("burstiness") else {
                    self.err(
                        "load.arrival.gamma.burstiness",
                        "is required: the gamma shape k (1 is Poisson, below 1 burstier)",
                    );
                    return None;
                };
                let why =
                    "almost every gap would be 0 and the rest enormous (the gaps' CV is 1/sqrt(k))";
                self.positive(
                    k,
                    "load.arrival.gamma.burstiness",
                    1e6,
                    Some((MIN_BURSTINESS, why)),
                )
                .map(|burstiness| Arrival::Gamma { burstiness })
            }
            Value::String(s) => {
                self.err(path, format!("'{s}' is not an arrival process; {usage}"));
                None
            }
            other => {
                self.err(path, format!("found {}; {usage}", json_kind(other)));
                None
            }
        }
    }

    fn rates(&mut self, v: Option<&Value>) -> Option<Vec<f64>> {
        let path = "load.rates_per_second";
        let Some(v) = v else {
            self.err(
                path,
                "is required with load.mode \"open\": a non-empty list of request rates (requests per second)",
            );
            return None;
        };
        let Value::Array(items) = v else {
            self.err(
                path,
                format!(
                    "must be a non-empty list of numbers, found {}",
                    json_kind(v)
                ),
            );
            return None;
        };
        if items.is_empty() {
            self.err(path, "must not be empty");
            return None;
        }
        let mut out: Vec<f64> = Vec::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let p = format!("{path}[{i}]");
            let why = "the lowest rate, in requests per second (one request every ~17 minutes)";
            match self.positive(item, &p, 1e6, Some((MIN_RATE, why))) {
                Some(r) if out.contains(&r) => {
                    self.err(p, format!("{r} appears more than once"));
                    ok = false;
                }
                Some(r) => out.push(r),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// Exactly one of `duration_seconds` and `requests`.
    fn extent(&mut self, m: &Map<String, Value>) -> Option<Extent> {
        match (m.get("duration_seconds"), m.get("requests")) {
            (Some(_), Some(_)) => {
                self.err(
                    "load.requests",
                    "give either load.duration_seconds or load.requests, not both",
                );
                None
            }
            (None, None) => {
                self.err(
                    "load.duration_seconds",
                    "is required with load.mode \"open\" (or load.requests): how long each round's schedule runs",
                );
                None
            }
            (Some(d), None) => self
                .positive(d, "load.duration_seconds", MAX_DURATION_SECONDS, None)
                .map(|s| Extent::DurationUs((s * 1e6).round().max(1.0) as u64)),
            (None, Some(n)) => {
                let n = self.integer(n, "load.requests", 1)?;
                if n > MAX_REQUESTS_PER_CASE {
                    self.err(
                        "load.requests",
                        format!("{n} is above {MAX_REQUESTS_PER_CASE}: a round's samples are kept in memory for exact nearest-rank percentiles"),
                    );
                    return None;
                }
                Some(Extent::Requests(n as u64))
            }
        }
    }

    /// A finite number above 0 and at most `max`.
    /// A finite number in `(0, max]`, and at least `floor.0` when given (`floor.1` says
    /// why, after "X is below MIN: ").
    fn positive(
        &mut self,
        v: &Value,
        path: &str,
        max: f64,
        floor: Option<(f64, &str)>,
    ) -> Option<f64> {
        let Some(x) = v.as_f64().filter(|_| v.is_number()) else {
            self.err(
                path,
                format!("must be a number > 0, found {}", json_kind(v)),
            );
            return None;
        };
        if !x.is_finite() || x <= 0.0 || x > max {
            self.err(
                path,
                format!("must be a finite number > 0 and <= {max}, found {x}"),
            );
            return None;
        }
        if let Some((min, why)) = floor
            && x < min
        {
            self.err(path, format!("{x} is below {min}: {why}"));
            return None;
        }
        Some(x)
    }

    /// `slo`: `{"ttft_ms", "tpot_ms", "e2e_ms"}`, each optional, each > 0.
    pub(super) fn slo(&mut self, v: Option<&Value>) -> Option<Option<Slo>> {
        let Some(v) = v else {
            return Some(None);
        };
        let m = self.object(v, "slo")?;
        self.unknown_fields(m, "slo", &[&["ttft_ms", "tpot_ms", "e2e_ms"]]);
        if m.is_empty() {
            self.err(
                "slo",
                "is empty: give at least one of ttft_ms, tpot_ms, e2e_ms",
            );
            return None;
        }
        let mut ok = true;
        let mut bound = |key: &str| match m.get(key) {
            None => None,
            Some(v) => {
                let ms = self.positive(v, &format!("slo.{key}"), 86_400_000.0, None);
                ok &= ms.is_some();
                ms.map(|ms| ((ms * 1000.0).round() as i64).max(1))
            }
        };
        let slo = Slo {
            ttft_us: bound("ttft_ms"),
            tpot_us: bound("tpot_ms"),
            e2e_us: bound("e2e_ms"),
        };
        ok.then_some(Some(slo))
    }
}
