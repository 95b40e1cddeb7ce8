//! What every exchange of a replay reads: the arm's context ([`Ctx`]: its plan, its
//! requests made once ([`Frozen`], by [`freeze`]), names, routes and stop flag), what every
//! arm shares ([`Base`]: the engine, the run, the progress bar, the failure count, the
//! shard's timetable), a worker's connection slot and one request to dispatch. Imports
//! nothing else from `replay/`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, header};
use indicatif::ProgressBar;

use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::config::trace::{Send, Trace};
use crate::config::trace_text::{self, BlockCache, SyntheticSpec};
use crate::drivers::RunContext;
use crate::engine::lean::{LeanConn, LeanRequest};
use crate::engine::{Engine, http1};
use crate::model::{ConnectionPolicy, Endpoint, Phase};

/// A worker's connection between its exchanges.
pub(super) type Slot = Option<LeanConn>;

/// One request to dispatch.
#[derive(Clone, Copy)]
pub(super) struct Dispatch {
    pub(super) phase: Phase,
    pub(super) case: Option<usize>,
    pub(super) variant: usize,
    pub(super) concurrency: Option<i32>,
    pub(super) repetition: Option<i32>,
    pub(super) dispatch_index: i64,
    pub(super) worker: i32,
    /// Open loop: the round's rate and this arrival's intended send time (run clock).
    pub(super) rate: Option<f64>,
    pub(super) scheduled_offset_us: Option<i64>,
    /// A trace's synthetic entry (its index): the request is made at send time from the
    /// case's template and the entry's blocks, not taken from `Ctx::frozen`.
    pub(super) synthetic: Option<u32>,
    /// A session's turn: its request is made at send time with the history so far.
    pub(super) turn: Option<TurnAt>,
}

/// Where a dispatch sits in a case's sessions.
#[derive(Clone, Copy, Debug)]
pub(super) struct TurnAt {
    /// The session's place in its case's `sessions`.
    pub(super) session: u32,
    /// The turn's place in its session, from 0 (rows say `turn` from 1).
    pub(super) turn: u16,
    /// A trace's session: how much later than its own entry's offset the turn was due
    /// (the end of the turn before it and its think time came later), µs; `None` when no
    /// entry gives the turn an offset.
    pub(super) lag_us: Option<i64>,
}

/// One arm's context (or a plain plan's): what every arm shares, and this arm's plan,
/// requests, names and stop flag.
pub(super) struct Ctx {
    pub(super) base: Arc<Base>,
    pub(super) plan: Plan,
    /// The health endpoint's URL, then each case's (index `case + 1`).
    pub(super) urls: Vec<Arc<str>>,
    /// Their routes in the live metrics (empty without them).
    pub(super) routes: Vec<usize>,
    /// The requests, made once: the health GET (`[0][0]`), then each case's variants
    /// (`[case + 1][variant]`).
    pub(super) frozen: Vec<Vec<Frozen>>,
    /// This arm's dispatch stops (its failure under `on_failure: stop`, or a recorder
    /// error); the other arms go on.
    pub(super) stop: AtomicBool,
    pub(super) case_names: Vec<Arc<str>>,
    pub(super) variant_names: Vec<Vec<Option<Arc<str>>>>,
    /// The campaign arm (`None` for a plain plan).
    pub(super) arm: Option<Arc<str>>,
    /// A performance-fit arm: its answers are never `correctness` failures.
    pub(super) performance_fit: bool,
    /// A campaign arm's worker's `/metrics` (a plain plan's is the run's).
    pub(super) scraper: Option<Arc<crate::drivers::scrape::Scraper>>,
    /// A trace plan with synthetic entries: what their requests are made from.
    pub(super) synthetic: Option<Synthetic>,
}

/// What a trace's synthetic entries' requests are made from at send time: the spec
/// (`config::trace_text`), the template case's request as a JSON object, the entries, and
/// the block texts made so far (bounded: `trace_text::BLOCK_CACHE_BYTES`; its mutex is
/// held for one lookup or one insert, never while a text is made or copied, never across
/// an await).
pub(super) struct Synthetic {
    spec: Arc<SyntheticSpec>,
    template: serde_json::Map<String, serde_json::Value>,
    trace: Arc<Trace>,
    cache: std::sync::Mutex<BlockCache>,
}

impl Synthetic {
    fn of(plan: &Plan) -> Option<Synthetic> {
        let t = plan.load.trace.as_ref()?;
        let case = t.synthetic_rules?.case as usize;
        let body = &plan.cases.get(case)?.variants.first()?.body;
        Some(Synthetic {
            spec: t.synthetic_spec.clone()?,
            template: serde_json::from_slice(body).ok()?,
            trace: t.entries.clone()?,
            cache: std::sync::Mutex::new(BlockCache::default()),
        })
    }

    /// Synthetic entry `entry`'s input tokens (its rows' `prompt_tokens_planned`).
    pub(super) fn input_tokens(&self, entry: u32) -> Option<u64> {
        match self.trace.entries.get(entry as usize)?.send {
            Send::Synthetic { input_tokens, .. } => Some(u64::from(input_tokens)),
            Send::Variant { .. } => None,
        }
    }

    /// Synthetic entry `entry`'s request body, made now.
    fn body(&self, entry: u32) -> Option<Bytes> {
        let e = self.trace.entries.get(entry as usize)?;
        let Send::Synthetic {
            input_tokens,
            output_tokens,
            ..
        } = e.send
        else {
            return None;
        };
        let blocks = self.trace.blocks_of(e.send);
        let counts =
            trace_text::word_counts(&self.spec, u64::from(input_tokens), blocks.len()).ok()?;
        // The lock is held for one lookup or one insert, never while a text is made or
        // copied into the prompt.
        let mut prompt = String::with_capacity(counts.iter().sum::<usize>() * 8);
        for (&id, n) in blocks.iter().zip(counts) {
            let cached = self.cache.lock().ok()?.get(id, n);
            let text = match cached {
                Some(t) => t,
                None => {
                    let t: Arc<str> = trace_text::block_text(&self.spec, id, n).into();
                    self.cache.lock().ok()?.put(id, n, t.clone());
                    t
                }
            };
            prompt.push_str(&text);
        }
        let body = trace_text::body(&self.template, prompt, u64::from(output_tokens));
        Some(Bytes::from(body))
    }
}

impl Ctx {
    /// The request of a trace's synthetic entry `entry` of case `case`, made now from the
    /// case's template (`None` when the dispatch is not a synthetic entry's).
    pub(super) fn synthetic_request(&self, case: usize, entry: u32) -> Option<Frozen> {
        let body = self.synthetic.as_ref()?.body(entry)?;
        Some(freeze_with(
            &self.plan,
            self.base.token.as_ref(),
            Some(case),
            0,
            Some(body),
        ))
    }

    /// The request of turn `at` of a session of case `case`, made now: `body` (a chat
    /// turn's, its conversation so far and its messages) or its variant's (a whole
    /// request), and the session's affinity header when the case names one.
    pub(super) fn turn_request(
        &self,
        case: usize,
        at: TurnAt,
        body: Option<Bytes>,
    ) -> Option<Frozen> {
        let sessions = self.plan.cases.get(case)?.sessions.as_ref()?;
        let session = sessions.list.get(at.session as usize)?;
        let affinity = sessions.header.as_ref().zip(session.header_value.as_ref());
        Some(freeze_full(
            &self.plan,
            self.base.token.as_ref(),
            Some(case),
            session.first_variant + usize::from(at.turn),
            (body, affinity),
        ))
    }

    /// The live metrics' route of `case`'s requests (`None`: the health GET).
    pub(super) fn route(&self, case: Option<usize>) -> usize {
        let i = case.map_or(0, |c| c + 1);
        self.routes.get(i).copied().unwrap_or(0)
    }

    /// One awaited scrape of this arm's worker (or the run's), when it is scraped.
    pub(super) async fn scrape(&self, cause: crate::drivers::scrape::Cause) {
        match &self.scraper {
            Some(s) => s.scrape(cause).await,
            None => self.base.run.scrape(cause).await,
        }
    }

    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self.base.interrupted.is_requested()
            || self.base.halted.load(Ordering::Relaxed)
    }

    /// Stop every arm: nothing more can be recorded.
    pub(super) fn halt(&self) {
        self.base.halted.store(true, Ordering::Relaxed);
    }

    /// Whether `phase` is a `--search` probe's (its feasibility wave or its round), where
    /// `on_failure: stop` does not apply: overload failing requests is what a probe
    /// measures.
    pub(super) fn probing(&self, phase: Phase) -> bool {
        self.base.search.is_some() && matches!(phase, Phase::Measured | Phase::Feasibility)
    }

    /// Stop new dispatch (a failure under `on_failure: stop`, or a recorder error).
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What every arm's context shares.
pub(super) struct Base {
    pub(super) engine: Engine,
    pub(super) run: Arc<RunContext>,
    pub(super) token: Option<HeaderValue>,
    pub(super) max_record_body: usize,
    pub(super) record_exchanges: bool,
    /// Set by the CLI's signal watcher on Ctrl-C / SIGTERM.
    pub(super) interrupted: Arc<crate::drivers::shutdown::Shutdown>,
    /// Turns true `grace` after the interrupt: in-flight exchanges are cut.
    pub(super) cut: tokio::sync::watch::Receiver<bool>,
    pub(super) grace: std::time::Duration,
    /// Failures of every arm, and the first one's line.
    pub(super) failures: AtomicU64,
    pub(super) first_failure: std::sync::OnceLock<String>,
    pub(super) progress: ProgressBar,
    /// Every arm stops (the recorder failed, or a worker panicked).
    pub(super) halted: AtomicBool,
    /// What the command's flags made of the plan (`--sweep`, `--shard`).
    pub(super) shape: Shape,
    /// `--shard`: the shared timetable of open waves.
    pub(super) timetable: Option<Timetable>,
    /// What a `--sweep` placed per case, or why it placed nothing (summary.json's
    /// `load.notes`).
    pub(super) notes: std::sync::Mutex<Vec<String>>,
    /// Sessions stopped before their last turn, and the turns they left unattempted
    /// (`session.rs`).
    pub(super) sessions_stopped: AtomicU64,
    pub(super) turns_not_attempted: AtomicU64,
    /// `--search`, and the time every search of the run has spent in its probes, which
    /// its `--budget-seconds` caps.
    pub(super) search: Option<crate::config::search::SearchSpec>,
    pub(super) search_spent_ns: AtomicU64,
    /// Each finished search (search.json).
    pub(super) searches: std::sync::Mutex<Vec<crate::search::doc::SearchRun>>,
}

impl Base {
    /// Every finished search, in run order (search.json).
    pub(super) fn take_searches(&self) -> Vec<crate::search::doc::SearchRun> {
        self.searches
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }

    /// The context of one arm (or of a plain plan: `arm` `None`) running `plan`.
    pub(super) fn ctx(
        self: &Arc<Self>,
        plan: Plan,
        arm: Option<(&str, bool)>,
        scraper: Option<Arc<crate::drivers::scrape::Scraper>>,
    ) -> Arc<Ctx> {
        let case_names = plan
            .cases
            .iter()
            .map(|c| Arc::from(c.name.as_str()))
            .collect();
        let variant_names = plan
            .cases
            .iter()
            .map(|c| {
                c.variants
                    .iter()
                    .map(|v| v.name.as_deref().map(Arc::from))
                    .collect()
            })
            .collect();
        let token = self.token.as_ref();
        let frozen: Vec<Vec<Frozen>> = std::iter::once(vec![freeze(&plan, token, None, 0)])
            .chain(plan.cases.iter().enumerate().map(|(ci, c)| {
                (0..c.variants.len())
                    .map(|v| freeze(&plan, token, Some(ci), v))
                    .collect()
            }))
            .collect();
        let urls: Vec<Arc<str>> = std::iter::once(&plan.health_endpoint)
            .chain(plan.cases.iter().map(|c| &c.endpoint))
            .map(|e| Arc::from(e.url()))
            .collect();
        // Each request's route in the live metrics, looked up once here, not per exchange.
        let routes = match self.run.telemetry() {
            Some(t) => urls
                .iter()
                .zip(&frozen)
                .map(|(url, f)| {
                    f.first()
                        .map_or(0, |f| t.route_id(f.lean.method.as_str(), url))
                })
                .collect(),
            None => Vec::new(),
        };
        let synthetic = Synthetic::of(&plan);
        Arc::new(Ctx {
            base: self.clone(),
            plan,
            urls,
            routes,
            frozen,
            stop: AtomicBool::new(false),
            case_names,
            variant_names,
            arm: arm.map(|(name, _)| Arc::from(name)),
            performance_fit: arm.is_some_and(|(_, fit)| fit),
            scraper,
            synthetic,
        })
    }
}

/// Where a shard's open waves start: every shard runs the same waves in the same order,
/// so each computes the same starts: the first at `--start-at`, each next one after the
/// previous wave's schedule and then `timeout_seconds` + 1 s for its last exchanges to
/// end and its rows to be handed over.
pub(super) struct Timetable {
    pub(super) next_ns: AtomicU64,
    pub(super) settle_ns: u64,
}

impl Timetable {
    /// The start of the next wave, whose schedule spans `span_us`.
    pub(super) fn next_start(&self, span_us: u64) -> u64 {
        let step = span_us.saturating_mul(1000).saturating_add(self.settle_ns);
        self.next_ns.fetch_add(step, Ordering::Relaxed)
    }
}

/// One request of the plan, made once per arm: its bytes for the lean client, and the
/// method, headers and body its rows record.
pub(super) struct Frozen {
    pub(super) lean: LeanRequest,
    /// Shared by every row of this request (no per-row copy).
    pub(super) headers: Arc<HeaderMap>,
    pub(super) body: Bytes,
}

/// The request for `case` (`None`: the health GET) and `variant`, built from the
/// validated plan: `Host`, `Content-Type`, `Content-Length`, the case's headers, the
/// bearer token, and `Connection: close` under `fresh`.
pub(super) fn freeze(
    plan: &Plan,
    token: Option<&HeaderValue>,
    case: Option<usize>,
    variant: usize,
) -> Frozen {
    freeze_with(plan, token, case, variant, None)
}

/// [`freeze`] with `body` in place of the variant's (a synthetic entry's, made at send
/// time).
fn freeze_with(
    plan: &Plan,
    token: Option<&HeaderValue>,
    case: Option<usize>,
    variant: usize,
    body: Option<Bytes>,
) -> Frozen {
    freeze_full(plan, token, case, variant, (body, None))
}

/// [`freeze_with`], and one more header (a session's affinity header).
fn freeze_full(
    plan: &Plan,
    token: Option<&HeaderValue>,
    case: Option<usize>,
    variant: usize,
    (body, affinity): (Option<Bytes>, Option<(&http::HeaderName, &HeaderValue)>),
) -> Frozen {
    let (method, ep, planned, ctype, extra): (
        Method,
        &Endpoint,
        Bytes,
        Option<&HeaderValue>,
        &[_],
    ) = match case {
        None => (Method::GET, &plan.health_endpoint, Bytes::new(), None, &[]),
        Some(ci) => {
            let case = &plan.cases[ci];
            let v = &case.variants[variant];
            (
                case.method.clone(),
                &case.endpoint,
                v.body.clone(),
                v.content_type.as_ref(),
                &case.headers[..],
            )
        }
    };
    let body = body.unwrap_or(planned);
    let mut headers = HeaderMap::with_capacity(5 + extra.len());
    if let Ok(h) = HeaderValue::from_str(&ep.authority) {
        headers.insert(header::HOST, h);
    }
    if let Some(ct) = ctype {
        headers.insert(header::CONTENT_TYPE, ct.clone());
    }
    if !body.is_empty()
        || method == Method::POST
        || method == Method::PUT
        || method == Method::PATCH
    {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    for (k, v) in extra {
        headers.append(k.clone(), v.clone());
    }
    if let Some((k, v)) = affinity {
        headers.insert(k.clone(), v.clone());
    }
    if let Some(t) = token {
        headers.insert(header::AUTHORIZATION, t.clone());
    }
    if plan.connection == ConnectionPolicy::Fresh {
        http1::close_after(&mut headers);
    }
    let target = if ep.path_and_query.starts_with('/') {
        ep.path_and_query.as_str()
    } else {
        "/"
    };
    Frozen {
        lean: LeanRequest::new(method, target, &headers, &body),
        headers: Arc::new(headers),
        body,
    }
}

/// Wait (on the runtime's timer, in slices that see a stop) until `ns` on the monotonic
/// clock.
pub(super) async fn wait_until(ctx: &Ctx, ns: u64) {
    while !ctx.stopped() {
        let now = crate::clock::now_ns();
        if now >= ns {
            return;
        }
        let left = (ns - now).min(50_000_000);
        tokio::time::sleep(std::time::Duration::from_nanos(left)).await;
    }
}
