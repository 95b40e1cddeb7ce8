//! A plan's arms and their order. A plain plan is one arm with no name. A campaign's arms
//! are brought up (artifact counted, server started with `{port}` and `{self}`, health
//! waited for: `load_ms`), warmed up, measured in the plan's schedule — `interleaved`:
//! never overlapping, repetition r in rotation r; `sequential`: each arm start to stop —
//! and always shut down, whatever happened. An arm that cannot be brought up is kept with
//! its reason, never dropped.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::ctx::{Base, Ctx, Slot};
use super::launch::{self, GpuSample, LaunchError, Sampler, Server, Who};
use super::open::OpenPool;
use super::phases::{At, Senders, feasibility, measured_round, prelude};
use super::search::{ArmSearch, probe};
use super::trace::trace_round;
use crate::clock;
use crate::config::campaign::{Arm, Lane, Schedule};
use crate::config::plan::Plan;
use crate::drivers::scrape::{ScrapeError, ScrapeTarget, Scraper};
use crate::metrics::PhaseCounts;
use crate::metrics::RoundMetrics;
use crate::model::{Level, Phase};
use crate::report::campaign::{ArmMeasures, Level as CampaignLevel};

/// Where started servers run from: the running binary (`{self}`) and the directory for
/// their stdout and stderr.
pub(crate) struct ArmEnv {
    pub(crate) self_exe: PathBuf,
    pub(crate) logs: PathBuf,
    /// How an arm with `worker_metrics` is scraped (`None` when no arm is).
    pub(crate) scrape: Option<crate::drivers::scrape::Settings>,
}

/// Why an arm could not be brought up (its `unavailable_reason`), or why its worker's
/// metrics are not scraped.
#[derive(Debug, thiserror::Error)]
pub(super) enum ArmError {
    /// Its artifact could not be measured.
    #[error("artifact {0}")]
    Artifact(#[source] LaunchError),
    /// Its server could not be started, or did not become healthy.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// Its endpoint, health endpoint or worker-metrics URL is not a URL (`{port}`
    /// substituted).
    #[error("{0}")]
    Endpoint(#[source] crate::model::EndpointError),
    /// A server the tool did not start did not answer its health check.
    #[error(
        "its health endpoint {url} did not answer 200 (it answered {}); a server whose health check is elsewhere needs the arm's health_endpoint",
        answered(.answer)
    )]
    NotHealthy { url: String, answer: Option<u16> },
    /// Its worker's scraper could not be built.
    #[error(transparent)]
    Scraper(#[from] ScrapeError),
}

/// A health probe's answer, in words.
fn answered(answer: &Option<u16>) -> String {
    answer.map_or("nothing".to_string(), |s| format!("HTTP {s}"))
}

/// An arm's worker scraped every interval while the arm is up, and how to stop it.
struct ArmScraping {
    scraper: Arc<Scraper>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// When a measured round of a level ran (for the level's peak memory).
struct Window {
    concurrency: usize,
    from_ns: u64,
    to_ns: u64,
}

impl Window {
    /// Whether a sample at `t_ns` falls within this window, `slack_ns` either side.
    fn holds(&self, t_ns: u64, slack_ns: u64) -> bool {
        t_ns + slack_ns >= self.from_ns && t_ns <= self.to_ns + slack_ns
    }
}

/// One arm's run.
pub(super) struct ArmRun {
    /// `None` for a plain plan.
    spec: Option<Arm>,
    ctx: Option<Arc<Ctx>>,
    slots: Vec<Slot>,
    /// The open loop's connections.
    pool: Arc<OpenPool>,
    pub(super) excluded: BTreeMap<Phase, PhaseCounts>,
    /// Why the arm could not be measured.
    pub(super) unavailable: Option<String>,
    server: Option<Server>,
    /// The sampler of a `resources.pid` server (one the tool did not start).
    watcher: Option<Sampler>,
    load_ms: Option<f64>,
    artifact_bytes: Option<u64>,
    /// Per concurrency: the measured samples, their rounds' elapsed time, their windows.
    levels: BTreeMap<usize, CampaignLevel>,
    windows: Vec<Window>,
    /// The arm's worker's `/metrics`, scraped while it is up.
    scraping: Option<ArmScraping>,
}

impl ArmRun {
    /// One run per arm of `plan` (one, unnamed, for a plain plan).
    pub(super) fn for_plan(plan: &Plan) -> Vec<ArmRun> {
        let specs: Vec<Option<Arm>> = match &plan.campaign {
            None => vec![None],
            Some(c) => c.arms.iter().cloned().map(Some).collect(),
        };
        specs
            .into_iter()
            .map(|spec| ArmRun {
                spec,
                ctx: None,
                slots: Vec::new(),
                pool: Arc::default(),
                excluded: BTreeMap::new(),
                unavailable: None,
                server: None,
                watcher: None,
                load_ms: None,
                artifact_bytes: None,
                levels: BTreeMap::new(),
                windows: Vec::new(),
                scraping: None,
            })
            .collect()
    }

    fn live(&self) -> Option<&Arc<Ctx>> {
        self.ctx.as_ref().filter(|c| !c.stopped())
    }

    /// Count the artifact, start the server and wait for its health, and build the arm's
    /// context; on any failure the arm is unavailable, with the reason.
    async fn bring_up(&mut self, base: &Arc<Base>, plan: &Plan, env: &ArmEnv) {
        let max_c = plan.concurrency.iter().copied().max().unwrap_or(1);
        self.slots = (0..max_c).map(|_| None).collect();
        let Some(arm) = self.spec.clone() else {
            self.ctx = Some(base.ctx(plan.clone(), None, None));
            return;
        };
        if let Err(why) = self.start(base, plan, env, &arm).await {
            // On stderr even under --quiet (a hidden bar prints nothing): an arm that was
            // not measured is never silent.
            let line = format!("matrix-proxy: arm {} unavailable: {why}", arm.name);
            base.progress.suspend(|| eprintln!("{line}"));
            self.unavailable = Some(why.to_string());
        }
    }

    async fn start(
        &mut self,
        base: &Arc<Base>,
        plan: &Plan,
        env: &ArmEnv,
        arm: &Arm,
    ) -> Result<(), ArmError> {
        if let Some(path) = &arm.artifact {
            self.artifact_bytes = Some(
                launch::artifact_bytes(std::path::Path::new(path)).map_err(ArmError::Artifact)?,
            );
        }
        let port = match &arm.start {
            Some(_) => launch::free_port()?,
            None => 0,
        };
        let (endpoint, health) = arm.endpoints(port.max(1)).map_err(ArmError::Endpoint)?;
        if let Some(start) = &arm.start {
            let launch = |logs_as: String| launch_healthy(base, start, port, env, logs_as, &health);
            if start.warm_start {
                // Started once and stopped, so the measured start finds the page cache
                // warm (its model files read once already), as every later arm would.
                let warm = launch(format!("{}.warm", arm.name)).await?;
                warm.server.stop(start.stop_grace).await;
            }
            let up = launch(arm.name.clone()).await?;
            self.load_ms = Some(up.load_ms);
            self.server = Some(up.server);
        }
        if arm.start.is_none() {
            let answer = launch::probe(&base.engine, &health).await;
            if answer != Some(200) {
                return Err(ArmError::NotHealthy {
                    url: health.url(),
                    answer,
                });
            }
        }
        if let Some(pid) = arm.resources_pid {
            self.watcher = Some(Sampler::start(Who::Tree(pid), &arm.name)?);
        }
        let fit = arm.lane == Lane::PerformanceFit;
        let scraper = self.scrape_worker(base, env, arm, port);
        self.ctx = Some(base.ctx(
            plan.for_arm(&endpoint, &health),
            Some((&arm.name, fit)),
            scraper,
        ));
        Ok(())
    }

    /// Scrape the arm's worker's `/metrics` from now until it shuts down, when the arm
    /// asks for it; a scraper that cannot be built is said, never fatal.
    fn scrape_worker(
        &mut self,
        base: &Arc<Base>,
        env: &ArmEnv,
        arm: &Arm,
        port: u16,
    ) -> Option<Arc<Scraper>> {
        let settings = env.scrape.as_ref()?;
        let built = arm
            .worker_metrics_url(port.max(1))?
            .map_err(ArmError::Endpoint)
            .and_then(|url| {
                let engine = Scraper::engine_for(&url, &settings.tls)?;
                Ok::<_, ArmError>(Scraper::new(
                    ScrapeTarget { url, engine },
                    base.run.run_t0_ns,
                    settings.timeout,
                    Some(settings.sink.clone()),
                ))
            });
        let scraper = match built {
            Ok(s) => Arc::new(s.with_arm(&arm.name)),
            Err(why) => {
                let line = format!(
                    "matrix-proxy: arm {}: its worker's metrics are not scraped: {why}",
                    arm.name
                );
                base.progress.suspend(|| eprintln!("{line}"));
                return None;
            }
        };
        let (stop, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(scraper.clone().every(settings.every, rx));
        self.scraping = Some(ArmScraping {
            scraper: scraper.clone(),
            stop,
            task,
        });
        Some(scraper)
    }

    /// A server the tool started must be the one answering: once it has exited (its port
    /// free for another listener, or held by one before it ever bound it), its arm is
    /// unavailable from then on and nothing it measured is kept, said on stderr. Checked
    /// after its prelude, each feasibility wave and each round (so a server that exits
    /// after its last round loses nothing). `true` when it has just become unavailable.
    fn check_server(&mut self) -> bool {
        let Some(exit) = self.server.as_mut().and_then(Server::exited) else {
            return false;
        };
        let name = self.spec.as_ref().map_or("", |s| s.name.as_str());
        let why = format!(
            "its server exited ({exit}) before its measurement ended, so what answered on its port may have been another process; nothing it measured is kept (the server's output: servers/{name}.stderr.log)"
        );
        if let Some(ctx) = &self.ctx {
            let line = format!("matrix-proxy: arm {name} unavailable: {why}");
            ctx.base.progress.suspend(|| eprintln!("{line}"));
            ctx.stop();
        }
        self.unavailable = Some(why);
        self.levels.clear();
        self.windows.clear();
        true
    }

    /// The run was interrupted before this arm was brought up.
    fn not_started(&mut self) {
        if self.spec.is_some() {
            self.unavailable =
                Some("not measured: the run was interrupted before it started".into());
        }
    }

    async fn prelude(&mut self) {
        if let Some(ctx) = self.ctx.clone() {
            prelude(&ctx, &mut self.slots, &mut self.excluded).await;
        }
        let _ = self.check_server();
    }

    /// Stop the arm's server (if the tool started one) and close its connections; then
    /// each level's peak memory from the samples taken while its rounds ran.
    async fn shut_down(&mut self, sequential: bool) {
        self.slots.clear();
        self.pool.clear();
        if let Some(ArmScraping {
            scraper,
            stop,
            task,
        }) = self.scraping.take()
        {
            let _ = stop.send(true);
            let _ = task.await;
            if let Some(ctx) = &self.ctx {
                ctx.base.run.add_arm_scrapes(scraper.take());
            }
        }
        let grace = self
            .spec
            .as_ref()
            .and_then(|a| a.start.as_ref())
            .map_or(std::time::Duration::from_secs(10), |s| s.stop_grace);
        // What was sampled: a started server's group, or a `resources.pid` tree.
        let (samples, gpu, gpu_visible) = match (self.server.take(), self.watcher.take()) {
            (Some(server), _) => {
                let s = &server.sampler;
                let taken = (s.samples.clone(), s.gpu_samples.clone(), s.gpu_visible);
                server.stop(grace).await;
                taken
            }
            (None, Some(w)) => {
                w.stop();
                (w.samples.clone(), w.gpu_samples.clone(), w.gpu_visible)
            }
            (None, None) => return,
        };
        let gpu = gpu.lock().map(|v| v.clone()).unwrap_or_default();
        if gpu_visible {
            self.gpu_peaks(&gpu, sequential);
        } else {
            for level in self.levels.values_mut() {
                level.vram_scope =
                    Some("not sampled: nvidia-smi did not answer on this machine".into());
            }
        }
        let samples = samples.lock().map(|v| v.clone()).unwrap_or_default();
        for w in &self.windows {
            // The edge samples are taken just outside the round's own clock reads.
            let slack = 50_000_000;
            let peak = samples
                .iter()
                .filter(|(t, _)| w.holds(*t, slack))
                .map(|(_, b)| *b)
                .max();
            if let Some(level) = self.levels.get_mut(&w.concurrency) {
                level.peak_rss_bytes = level.peak_rss_bytes.max(peak);
            }
        }
    }

    /// The sampler of this arm's memory, if any.
    fn sampler(&self) -> Option<&Sampler> {
        self.server
            .as_ref()
            .map(|s| &s.sampler)
            .or(self.watcher.as_ref())
    }
}

impl ArmRun {
    /// Each level's peak GPU memory from `gpu` samples taken within a second of its
    /// rounds: the group's own when nvidia-smi lists any of its processes; the whole
    /// device's only under `sequential` (one server up at a time); else null with the
    /// reason.
    fn gpu_peaks(&mut self, gpu: &[GpuSample], sequential: bool) {
        let slack = 1_000_000_000;
        for (&c, level) in self.levels.iter_mut() {
            let within: Vec<&GpuSample> = gpu
                .iter()
                .filter(|s| {
                    self.windows
                        .iter()
                        .any(|w| w.concurrency == c && w.holds(s.at_ns, slack))
                })
                .collect();
            let group = within
                .iter()
                .map(|s| s.group_bytes)
                .max()
                .filter(|&b| b > 0);
            let device = within.iter().map(|s| s.device_bytes).max();
            (level.peak_vram_bytes, level.vram_scope) = match (group, device) {
                (Some(b), _) => (
                    Some(b),
                    Some("GPU memory of the arm's process group as nvidia-smi --query-compute-apps lists it, every 1 s".into()),
                ),
                (None, Some(b)) if sequential => (
                    Some(b),
                    Some("device-level GPU memory in use on every GPU (nvidia-smi --query-gpu), every 1 s: nvidia-smi lists no process of this arm's group; valid because under the sequential schedule one arm's server is up at a time (other users of the GPU count too)".into()),
                ),
                (None, Some(_)) => (
                    None,
                    Some("nvidia-smi lists no process of this arm's group (a container may hide its pids), and under the interleaved schedule device-level memory would mix the arms' servers".into()),
                ),
                (None, None) => (
                    None,
                    Some("no GPU sample fell within this level's rounds".into()),
                ),
            };
        }
    }
}

/// A started server whose health endpoint answered 200, and its load time.
struct Healthy {
    server: Server,
    load_ms: f64,
}

/// Start an arm's server (its logs named `logs_as`) and wait for its health endpoint:
/// the server and its load time, or why not (a server that failed is stopped).
async fn launch_healthy(
    base: &Arc<Base>,
    start: &crate::config::campaign::Start,
    port: u16,
    env: &ArmEnv,
    logs_as: String,
    health: &crate::model::Endpoint,
) -> Result<Healthy, LaunchError> {
    let started_ns = clock::now_ns();
    let mut server = launch::spawn(start, port, &env.self_exe, &env.logs, &logs_as)?;
    base.progress
        .set_message(format!("[{logs_as}] starting: {}", start.command.join(" ")));
    let healthy = server
        .wait_healthy(
            &base.engine,
            health,
            started_ns,
            start.health_timeout,
            &base.interrupted,
        )
        .await;
    match healthy {
        Ok(load_ms) => Ok(Healthy { server, load_ms }),
        Err(why) => {
            server.stop(start.stop_grace).await;
            Err(why)
        }
    }
}

/// Run every arm in the plan's schedule; measured rounds go to `rounds`.
pub(super) async fn run_arms(
    base: &Arc<Base>,
    plan: &Plan,
    env: &ArmEnv,
    runs: &mut [ArmRun],
    rounds: &mut Vec<RoundMetrics>,
) {
    let schedule = plan
        .campaign
        .as_ref()
        .map_or(Schedule::Interleaved, |c| c.schedule);
    let interrupted = || base.interrupted.is_requested();
    match schedule {
        Schedule::Interleaved => {
            for a in runs.iter_mut() {
                if interrupted() {
                    a.not_started();
                } else {
                    a.bring_up(base, plan, env).await;
                    a.prelude().await;
                }
            }
            measure(base, plan, runs, rounds).await;
            for a in runs.iter_mut() {
                a.shut_down(false).await;
            }
        }
        Schedule::Sequential => {
            for i in 0..runs.len() {
                if interrupted() {
                    runs[i].not_started();
                } else {
                    runs[i].bring_up(base, plan, env).await;
                    runs[i].prelude().await;
                    measure(base, plan, &mut runs[i..=i], rounds).await;
                }
                runs[i].shut_down(true).await;
            }
        }
    }
}

/// For each case: each level of the plan (or, with `--sweep`, the sweep's levels), each
/// in turn: each live arm's feasibility wave, then each repetition r with the arms in
/// rotation r (A B C, then B C A, then C A B).
async fn measure(
    base: &Arc<Base>,
    plan: &Plan,
    runs: &mut [ArmRun],
    rounds: &mut Vec<RoundMetrics>,
) {
    if plan.load.trace.is_some() {
        return measure_trace(plan, runs, rounds).await;
    }
    for ci in 0..plan.cases.len() {
        if base.search.is_some() {
            search_case(base, runs, rounds, ci).await;
            continue;
        }
        match base.shape.sweep_rates() {
            Some(n) => sweep(base, plan, runs, rounds, ci, n).await,
            None => {
                for (li, level) in plan.levels().into_iter().enumerate() {
                    let at = At {
                        ci,
                        level,
                        li,
                        requests: None,
                    };
                    measure_level(plan, runs, rounds, at, plan.repetitions).await;
                }
            }
        }
    }
}

/// A trace plan's rounds: each repetition sends the whole window once, every case in the
/// trace's order; its rounds are reported per case, case by case (the order `summarize`
/// rebuilds them in). Trace plans have no arms (validation refuses them in a campaign).
async fn measure_trace(plan: &Plan, runs: &mut [ArmRun], rounds: &mut Vec<RoundMetrics>) {
    let mut got: Vec<(usize, usize, RoundMetrics)> = Vec::new();
    for rep in 0..plan.repetitions {
        for a in runs.iter_mut() {
            let Some(ctx) = a.live().cloned() else {
                continue;
            };
            let case_rounds = trace_round(&ctx, &a.pool, rep, &mut a.excluded).await;
            got.extend(case_rounds.into_iter().map(|(ci, r)| (ci, rep, r)));
        }
    }
    got.sort_by_key(|(ci, rep, _)| (*ci, *rep));
    rounds.extend(got.into_iter().map(|(_, _, r)| r));
}

/// `--search` for case `ci`: each live arm's search, one probe per arm in turn (arm k of
/// step r in rotation r, as repetitions are interleaved), until every search has
/// stopped. A probe's round is kept as any measured round; a campaign's cells (paired
/// comparisons at equal concurrency) are not filled by probes, whose loads differ by arm.
async fn search_case(
    base: &Arc<Base>,
    runs: &mut [ArmRun],
    rounds: &mut Vec<RoundMetrics>,
    ci: usize,
) {
    let mut searches: Vec<Option<ArmSearch>> = runs
        .iter()
        .map(|a| a.live().and_then(|ctx| ArmSearch::new(base, ctx, ci)))
        .collect();
    let n = runs.len();
    for step in 0.. {
        let mut asked = false;
        for k in 0..n {
            let i = crate::config::campaign::interleaved_arm(n, step, k);
            let (a, Some(s)) = (&mut runs[i], searches[i].as_mut()) else {
                continue;
            };
            let Some(ctx) = a.live().cloned() else {
                s.arm_stopped();
                continue;
            };
            let Some(next) = s.next() else { continue };
            asked = true;
            if let Level::Concurrency(c) = next.1.level
                && a.slots.len() < c
            {
                a.slots.resize_with(c, || None);
            }
            let senders = Senders {
                slots: &mut a.slots,
                pool: &a.pool,
            };
            let m = probe(&ctx, senders, s, next, &mut a.excluded).await;
            if a.check_server() {
                drop_rounds_of(a, rounds);
                continue;
            }
            rounds.extend(m.map(|m| m.round));
        }
        if !asked {
            break;
        }
    }
    let done = searches.into_iter().flatten().map(ArmSearch::finish);
    if let Ok(mut all) = base.searches.lock() {
        all.extend(done);
    }
}

/// GuideLLM's sweep for case `ci`: one closed round at c = 1 (the synchronous rate), one
/// at the plan's highest concurrency (the throughput probe), then `n` open-loop rates
/// spaced evenly between the two, each with the plan's repetitions. What it placed, or
/// why it placed nothing, is noted for summary.json.
async fn sweep(
    base: &Arc<Base>,
    plan: &Plan,
    runs: &mut [ArmRun],
    rounds: &mut Vec<RoundMetrics>,
    ci: usize,
    n: usize,
) {
    let max_c = plan.concurrency.iter().copied().max().unwrap_or(1);
    let case = &plan.cases[ci].name;
    // The throughput of the round just measured, if it had a success.
    let measured = |rounds: &[RoundMetrics], before: usize| {
        rounds
            .get(before)
            .filter(|r| r.successful_requests > 0)
            .and_then(|r| r.successful_requests_per_second)
    };
    let before = rounds.len();
    let sync_at = At {
        ci,
        level: Level::Concurrency(1),
        li: 0,
        requests: None,
    };
    measure_level(plan, runs, rounds, sync_at, 1).await;
    let sync = measured(rounds, before);
    let before = rounds.len();
    let probe_at = At {
        ci,
        level: Level::Concurrency(max_c),
        li: 1,
        requests: None,
    };
    measure_level(plan, runs, rounds, probe_at, 1).await;
    let probe = measured(rounds, before);
    let note = |m: String| {
        base.progress.println(format!("sweep: {m}"));
        if let Ok(mut notes) = base.notes.lock() {
            notes.push(m);
        }
    };
    let (Some(lo), Some(hi)) = (sync, probe) else {
        note(format!(
            "case '{case}': the synchronous round or the throughput probe did not run or had no successful request, so no rate can be placed between them; its {n} open-loop rates were not run"
        ));
        return;
    };
    let rates = sweep_rates(lo, hi, n);
    if rates.is_empty() {
        note(format!(
            "case '{case}': no rate fits strictly between the synchronous rate ({lo:.4}/s) and the throughput probe ({hi:.4}/s at c={max_c}); its {n} open-loop rates were not run"
        ));
        return;
    }
    let fewer = if rates.len() < n {
        format!(
            " ({} of {n}: the others round to the same rate)",
            rates.len()
        )
    } else {
        String::new()
    };
    note(format!(
        "case '{case}': synchronous {lo:.4}/s, throughput {hi:.4}/s at c={max_c}; open-loop rates {}{fewer}",
        rates
            .iter()
            .map(|r| format!("{r}/s"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for (k, r) in rates.into_iter().enumerate() {
        let at = At {
            ci,
            level: Level::Rate(r),
            li: k,
            requests: None,
        };
        measure_level(plan, runs, rounds, at, plan.repetitions).await;
    }
}

/// Up to `n` rates spaced evenly strictly between `lo` and `hi`, each rounded to four
/// significant digits; rates that round to the same value are kept once.
pub(super) fn sweep_rates(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let mut out: Vec<f64> = Vec::new();
    for k in 1..=n {
        let exact = lo + (hi - lo) * k as f64 / (n + 1) as f64;
        if !(exact.is_finite() && exact > 0.0) {
            continue;
        }
        let r = crate::model::four_digits(exact);
        if r > lo && r < hi && !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

/// One level of case `at.ci` for every live arm: feasibility, then `reps` rounds.
async fn measure_level(
    plan: &Plan,
    runs: &mut [ArmRun],
    rounds: &mut Vec<RoundMetrics>,
    at: At,
    reps: usize,
) {
    let n = runs.len();
    for a in runs.iter_mut() {
        if let Some(ctx) = a.live().cloned() {
            let senders = Senders {
                slots: &mut a.slots,
                pool: &a.pool,
            };
            let _ = feasibility(&ctx, senders, at, &mut a.excluded).await;
            if a.check_server() {
                drop_rounds_of(a, rounds);
            }
        }
    }
    for rep in 0..reps {
        for k in 0..n {
            let a = &mut runs[crate::config::campaign::interleaved_arm(n, rep, k)];
            let Some(ctx) = a.live().cloned() else {
                continue;
            };
            if let Some(s) = a.sampler() {
                s.sample_now();
            }
            let senders = Senders {
                slots: &mut a.slots,
                pool: &a.pool,
            };
            let m = measured_round(&ctx, senders, at, rep).await;
            if let Some(s) = a.sampler() {
                s.sample_now();
            }
            if a.check_server() {
                drop_rounds_of(a, rounds);
                continue;
            }
            // Only a campaign keeps its samples (campaign.json pools them per level); a
            // plain plan's are dropped with the round, as ever. Campaigns run closed loops.
            if let (Some(_), Level::Concurrency(c)) = (&a.spec, at.level) {
                let level = a.levels.entry(c).or_default();
                level.planned_rounds = plan.cases.len() * plan.repetitions;
                level.attempted_rounds += usize::from(m.round.fully_attempted());
                level.elapsed_seconds += m.round.elapsed_seconds;
                level.samples.extend(m.samples);
                a.windows.push(Window {
                    concurrency: c,
                    from_ns: m.window_ns.0,
                    to_ns: m.window_ns.1,
                });
            }
            rounds.push(m.round);
        }
    }
}

/// An arm that became unavailable keeps no measured round: its rounds leave summary.json,
/// rounds.parquet and the table as its cells leave campaign.json.
fn drop_rounds_of(a: &ArmRun, rounds: &mut Vec<RoundMetrics>) {
    let name = a.spec.as_ref().map(|s| s.name.as_str());
    rounds.retain(|r| r.arm.as_deref() != name);
}

/// What campaign.json says of each arm.
pub(super) fn measures(runs: Vec<ArmRun>) -> Vec<ArmMeasures> {
    runs.into_iter()
        .filter_map(|a| {
            let spec = a.spec?;
            let rss_scope = if spec.start.is_some() {
                Some("resident memory of the arm's whole started process group (grandchildren included), from /proc every 100 ms and at the edges of each measured round at this level")
            } else if spec.resources_pid.is_some() {
                Some("resident memory of resources.pid and all its descendants, from /proc every 100 ms and at the edges of each measured round at this level")
            } else {
                None
            };
            Some(ArmMeasures {
                unavailable_reason: a.unavailable,
                artifact_bytes: a.artifact_bytes,
                load_ms: a.load_ms,
                rss_scope,
                endpoint: a
                    .ctx
                    .as_ref()
                    .map(|c| crate::report::config_json::redacted(&c.plan.endpoint.url())),
                levels: a.levels,
                arm: spec,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::sweep_rates;

    #[test]
    fn sweep_rates_sit_strictly_between_and_keep_four_digits() {
        assert_eq!(sweep_rates(100.0, 400.0, 2), vec![200.0, 300.0]);
        assert_eq!(sweep_rates(1.0, 2.0, 3), vec![1.25, 1.5, 1.75]);
        // Slow endpoints keep their resolution: 0.2/s to 0.9/s in 100 steps.
        let slow = sweep_rates(0.2, 0.9, 100);
        assert_eq!(slow.len(), 100);
        assert!(slow.windows(2).all(|w| w[0] < w[1]) && slow[0] > 0.2 && slow[99] < 0.9);
        assert_eq!(slow[0], 0.2069);
        // Rates that round alike are kept once; no room, no rate.
        assert_eq!(sweep_rates(1000.0, 1000.2, 5), Vec::<f64>::new());
        assert_eq!(sweep_rates(5.0, 5.0, 3), Vec::<f64>::new());
        assert_eq!(sweep_rates(9.0, 3.0, 3), Vec::<f64>::new());
    }
}
