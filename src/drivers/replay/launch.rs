//! Servers a campaign starts: an arm's `start` command in its own process group, its
//! stdout and stderr kept in the run directory, `load_ms` (launch to the first 200 from
//! its health endpoint), the resident memory of the whole group sampled off the data path,
//! and a stop that leaves nothing behind (SIGTERM to the group, SIGKILL after the grace).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock;
use crate::config::campaign::Start;
use crate::drivers::shutdown::Shutdown;
use crate::engine::lean::LeanRequest;
use crate::engine::{Capture, Engine};
use crate::model::{ConnectionPolicy, Endpoint};

/// Why a server could not be started or measured, or a sampler or an artifact could not
/// be read. Each says what an arm's `unavailable_reason` says.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LaunchError {
    #[error("cannot start the memory sampler: {0}")]
    Sampler(#[source] std::io::Error),
    #[error("no free loopback port: {0}")]
    NoPort(#[source] std::io::Error),
    /// A log file, its folder, or an artifact.
    #[error("{}: {source}", .path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start {program:?}: its cwd {cwd:?} is not a directory")]
    NoCwd { program: String, cwd: String },
    #[error("cannot start {program:?}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the server exited at once")]
    ExitedAtOnce,
    #[error("pid out of range")]
    PidOutOfRange,
    #[error("the server exited ({0}) before its health endpoint answered")]
    ExitedBeforeHealthy(ExitStatus),
    #[error("not measured: the run was interrupted while the server started")]
    Interrupted,
    /// A 200 came, but the server had exited: another listener answered.
    #[error("the server exited ({0}); something else answered on its port")]
    NotOurs(ExitStatus),
    #[error(
        "{url} did not answer 200 within health_timeout_seconds ({seconds} s): its last answer was {}; a server whose health check is elsewhere (llama.cpp's is not /health) needs the arm's health_endpoint",
        last_answer(.last)
    )]
    NotHealthy {
        url: String,
        seconds: f64,
        last: Option<u16>,
    },
}

/// A health probe's last answer, in words.
fn last_answer(last: &Option<u16>) -> String {
    last.map_or(
        "none (no connection, or no response head)".to_string(),
        |s| format!("HTTP {s}"),
    )
}

/// How often the group's resident memory is sampled.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Process groups of every server started and not yet stopped: a second Ctrl-C exits at
/// once, and must not leave them running ([`kill_all`]).
static LIVE_GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// SIGKILL every started server's group (the CLI's last act on a second Ctrl-C).
pub(crate) fn kill_all() {
    if let Ok(groups) = LIVE_GROUPS.lock() {
        for &g in groups.iter() {
            kill_group(g, rustix::process::Signal::KILL);
        }
    }
}

fn kill_group(pgid: i32, sig: rustix::process::Signal) {
    if let Some(g) = rustix::process::Pid::from_raw(pgid) {
        let _ = rustix::process::kill_process_group(g, sig);
    }
}

/// A started server: its process group, and the memory samples of that group.
pub(crate) struct Server {
    child: tokio::process::Child,
    pgid: i32,
    pub(crate) sampler: Sampler,
}

/// Whose memory is sampled.
#[derive(Clone, Copy)]
pub(crate) enum Who {
    /// Every process of a process group (a server the tool started).
    Group(i32),
    /// A process and all its descendants (`resources.pid`: a server started elsewhere).
    Tree(u32),
}

/// One sample of GPU memory, as `nvidia-smi` lists it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GpuSample {
    /// When, on the monotonic clock.
    pub(crate) at_ns: u64,
    /// Bytes of the sampled processes that `nvidia-smi` lists.
    pub(crate) group_bytes: u64,
    /// Bytes in use on every GPU.
    pub(crate) device_bytes: u64,
}

/// Memory samples of a set of processes, taken by a thread of its own.
pub(crate) struct Sampler {
    who: Who,
    on: Arc<AtomicBool>,
    /// `(monotonic ns, resident bytes of every member)`.
    pub(crate) samples: Arc<Mutex<Vec<(u64, u64)>>>,
    /// GPU memory, every second while `nvidia-smi` answers.
    pub(crate) gpu_samples: Arc<Mutex<Vec<GpuSample>>>,
    /// `nvidia-smi` answered when sampling started.
    pub(crate) gpu_visible: bool,
}

impl Sampler {
    /// Sample `who` every [`SAMPLE_EVERY`] (GPU memory every second) until stopped.
    pub(crate) fn start(who: Who, name: &str) -> Result<Sampler, LaunchError> {
        let on = Arc::new(AtomicBool::new(true));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let gpu_samples = Arc::new(Mutex::new(Vec::new()));
        let gpu_visible = nvidia_smi(&["-L"]).is_some();
        let (run, out, gpu_out) = (on.clone(), samples.clone(), gpu_samples.clone());
        std::thread::Builder::new()
            .name(format!("rss-{name}"))
            .spawn(move || {
                let mut tick = 0u64;
                while run.load(Ordering::Relaxed) {
                    let pids = members(who);
                    let rss = rss_bytes(&pids);
                    // No member left (or none resident): nothing was sampled, which is
                    // not 0 bytes (a level with no sample has null memory).
                    if rss > 0
                        && let Ok(mut v) = out.lock()
                    {
                        v.push((clock::now_ns(), rss));
                    }
                    // nvidia-smi takes tens of milliseconds: once a second.
                    if gpu_visible
                        && tick.is_multiple_of(10)
                        && let Some((mine, device)) = gpu_bytes(&pids)
                        && let Ok(mut v) = gpu_out.lock()
                    {
                        v.push(GpuSample {
                            at_ns: clock::now_ns(),
                            group_bytes: mine,
                            device_bytes: device,
                        });
                    }
                    tick += 1;
                    std::thread::sleep(SAMPLE_EVERY);
                }
            })
            .map_err(LaunchError::Sampler)?;
        Ok(Sampler {
            who,
            on,
            samples,
            gpu_samples,
            gpu_visible,
        })
    }

    /// Take one resident-memory sample now (at a round's edges, so even a round shorter
    /// than the sampling interval has its memory measured; never during a round).
    pub(crate) fn sample_now(&self) {
        let rss = rss_bytes(&members(self.who));
        if rss > 0
            && let Ok(mut v) = self.samples.lock()
        {
            v.push((clock::now_ns(), rss));
        }
    }

    pub(crate) fn stop(&self) {
        self.on.store(false, Ordering::Relaxed);
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `(pid, ppid, pgrp)` of every process, from /proc.
fn processes() -> Vec<(u32, u32, i32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // Fields after the command (which may hold spaces and parentheses): state,
            // ppid, pgrp, ...
            let mut f = stat.rsplit_once(')')?.1.split_whitespace();
            let ppid = f.nth(1)?.parse().ok()?;
            let pgrp = f.next()?.parse().ok()?;
            Some((pid, ppid, pgrp))
        })
        .collect()
}

/// The pids `who` names now.
pub(crate) fn members(who: Who) -> Vec<u32> {
    let all = processes();
    match who {
        Who::Group(g) => all.iter().filter(|p| p.2 == g).map(|p| p.0).collect(),
        Who::Tree(root) => {
            let mut out = vec![root];
            let mut i = 0;
            while i < out.len() {
                let parent = out[i];
                out.extend(all.iter().filter(|p| p.1 == parent).map(|p| p.0));
                i += 1;
            }
            out.retain(|pid| all.iter().any(|p| p.0 == *pid));
            out
        }
    }
}

/// Resident bytes of `pids` (each process's resident set, summed).
pub(crate) fn rss_bytes(pids: &[u32]) -> u64 {
    let page = rustix::param::page_size() as u64;
    pids.iter()
        .filter_map(|pid| {
            let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
            statm.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum::<u64>()
        * page
}

/// Run `nvidia-smi` with `args`; its stdout when it ran and succeeded.
fn nvidia_smi(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("nvidia-smi")
        .args(args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// GPU memory now: (bytes of the processes `pids` that `nvidia-smi` lists, bytes in use
/// on every GPU). `None` when `nvidia-smi` does not answer.
pub(crate) fn gpu_bytes(pids: &[u32]) -> Option<(u64, u64)> {
    const MIB: u64 = 1 << 20;
    let apps = nvidia_smi(&[
        "--query-compute-apps=pid,used_memory",
        "--format=csv,noheader,nounits",
    ])?;
    let mut group = 0;
    for line in apps.lines() {
        let mut f = line.split(',').map(str::trim);
        if let (Some(Ok(pid)), Some(Ok(mib))) = (
            f.next().map(str::parse::<u32>),
            f.next().map(str::parse::<u64>),
        ) && pids.contains(&pid)
        {
            group += mib * MIB;
        }
    }
    let device = nvidia_smi(&["--query-gpu=memory.used", "--format=csv,noheader,nounits"])?
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .sum::<u64>()
        * MIB;
    Some((group, device))
}

/// A free loopback port (bound and released; the server binds it next).
pub(crate) fn free_port() -> Result<u16, LaunchError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(LaunchError::NoPort)
}

/// Start `command` (`{port}` and `{self}` substituted) in its own process group, with
/// stdout and stderr in `logs/<arm>.stdout.log` / `.stderr.log`.
pub(crate) fn spawn(
    start: &Start,
    port: u16,
    self_exe: &Path,
    logs: &Path,
    arm: &str,
) -> Result<Server, LaunchError> {
    let sub = |a: &str| {
        a.replace("{port}", &port.to_string())
            .replace("{self}", &self_exe.to_string_lossy())
    };
    let argv: Vec<String> = start.command.iter().map(|a| sub(a)).collect();
    std::fs::create_dir_all(logs).map_err(|e| file_error(logs, e))?;
    let log = |ext: &str| -> Result<File, LaunchError> {
        let p: PathBuf = logs.join(format!("{arm}.{ext}.log"));
        File::create(&p).map_err(|e| file_error(&p, e))
    };
    let (out, err) = (log("stdout")?, log("stderr")?);
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .envs(start.env.iter().map(|(k, v)| (k, sub(v))));
    if let Some(dir) = &start.cwd {
        cmd.current_dir(dir);
    }
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| match &start.cwd {
            Some(dir) if !Path::new(dir).is_dir() => LaunchError::NoCwd {
                program: argv[0].clone(),
                cwd: dir.clone(),
            },
            _ => LaunchError::Spawn {
                program: argv[0].clone(),
                source,
            },
        })?;
    let pid = child.id().ok_or(LaunchError::ExitedAtOnce)?;
    let pgid = i32::try_from(pid).map_err(|_| LaunchError::PidOutOfRange)?;
    if let Ok(mut g) = LIVE_GROUPS.lock() {
        g.push(pgid);
    }
    let sampler = Sampler::start(Who::Group(pgid), arm)?;
    Ok(Server {
        child,
        pgid,
        sampler,
    })
}

impl Server {
    /// Wait until `health` answers 200: `Ok(load_ms)` from `started_ns`; an error when the
    /// server exits first, `timeout` passes, or the run is interrupted.
    pub(crate) async fn wait_healthy(
        &mut self,
        engine: &Engine,
        health: &Endpoint,
        started_ns: u64,
        timeout: Duration,
        interrupted: &Shutdown,
    ) -> Result<f64, LaunchError> {
        let deadline = started_ns + timeout.as_nanos() as u64;
        let mut last: Option<u16>;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(LaunchError::ExitedBeforeHealthy(status));
            }
            if interrupted.is_requested() {
                return Err(LaunchError::Interrupted);
            }
            last = probe(engine, health).await;
            if last == Some(200) {
                // Our server must still be the one running: a 200 from another listener
                // that took the port would measure the wrong server.
                if let Ok(Some(status)) = self.child.try_wait() {
                    return Err(LaunchError::NotOurs(status));
                }
                return Ok((clock::now_ns() - started_ns) as f64 / 1e6);
            }
            if clock::now_ns() >= deadline {
                return Err(LaunchError::NotHealthy {
                    url: health.url(),
                    seconds: timeout.as_secs_f64(),
                    last,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How the server exited, if it has (`None`: still running).
    pub(crate) fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }

    /// Stop the whole group: SIGTERM, then SIGKILL after `grace` if any member is left,
    /// and wait (a little) until none is.
    pub(crate) async fn stop(mut self, grace: Duration) {
        self.sampler.stop();
        kill_group(self.pgid, rustix::process::Signal::TERM);
        self.wait_gone(grace).await;
        if group_alive(self.pgid) {
            kill_group(self.pgid, rustix::process::Signal::KILL);
            self.wait_gone(Duration::from_secs(2)).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        if let Ok(mut g) = LIVE_GROUPS.lock() {
            g.retain(|&p| p != self.pgid);
        }
    }
}

impl Server {
    /// Until no member of the group runs, at most `within` (reaping the leader).
    async fn wait_gone(&mut self, within: Duration) {
        let deadline = clock::now_ns() + within.as_nanos() as u64;
        while clock::now_ns() < deadline && group_alive(self.pgid) {
            let _ = self.child.try_wait();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Server {
    /// A server dropped without [`Server::stop`] (a panic, a cancelled future) still takes
    /// its whole group with it.
    fn drop(&mut self) {
        self.sampler.stop();
        if let Ok(mut g) = LIVE_GROUPS.lock()
            && let Some(i) = g.iter().position(|&p| p == self.pgid)
        {
            g.swap_remove(i);
            kill_group(self.pgid, rustix::process::Signal::KILL);
        }
    }
}

/// Whether any process of group `pgid` is still running (zombies, which only wait to be
/// reaped, do not count).
pub(crate) fn group_alive(pgid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            return false;
        };
        let mut f = rest.split_whitespace();
        let state = f.next().unwrap_or("Z");
        let pgrp: Option<i32> = f.nth(1).and_then(|s| s.parse().ok());
        pgrp == Some(pgid) && !matches!(state, "Z" | "X")
    })
}

/// One GET of `health` on a fresh connection; its status, if one came.
pub(crate) async fn probe(engine: &Engine, health: &Endpoint) -> Option<u16> {
    let mut headers = http::HeaderMap::new();
    if let Ok(h) = http::HeaderValue::from_str(&health.authority) {
        headers.insert(http::header::HOST, h);
    }
    crate::engine::http1::close_after(&mut headers);
    let req = LeanRequest::new(http::Method::GET, &health.path_and_query, &headers, &[]);
    let mut cap = Capture::start(64 << 10, None);
    let mut slot = None;
    let r = tokio::time::timeout(
        Duration::from_secs(2),
        engine.exchange_lean(&mut slot, health, ConnectionPolicy::Fresh, &req, &mut cap),
    )
    .await;
    match r {
        Ok(Ok(())) => cap
            .into_captured()
            .status
            .and_then(|s| u16::try_from(s).ok()),
        _ => None,
    }
}

/// Bytes of a file, or of every file under a directory.
pub(crate) fn artifact_bytes(path: &Path) -> Result<u64, LaunchError> {
    let meta = std::fs::metadata(path).map_err(|e| file_error(path, e))?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let mut total = 0;
    let entries = std::fs::read_dir(path).map_err(|e| file_error(path, e))?;
    for e in entries.flatten() {
        total += artifact_bytes(&e.path())?;
    }
    Ok(total)
}

/// `path` could not be created or read.
fn file_error(path: &Path, source: std::io::Error) -> LaunchError {
    LaunchError::File {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::LaunchError;

    #[test]
    fn launch_errors_say_what_the_strings_said() {
        let not_healthy = LaunchError::NotHealthy {
            url: "http://127.0.0.1:9/health".into(),
            seconds: 1.5,
            last: None,
        };
        assert_eq!(
            not_healthy.to_string(),
            "http://127.0.0.1:9/health did not answer 200 within health_timeout_seconds (1.5 s): its last answer was none (no connection, or no response head); a server whose health check is elsewhere (llama.cpp's is not /health) needs the arm's health_endpoint"
        );
        let cwd = LaunchError::NoCwd {
            program: "vllm".into(),
            cwd: "/nowhere".into(),
        };
        assert_eq!(
            cwd.to_string(),
            "cannot start \"vllm\": its cwd \"/nowhere\" is not a directory"
        );
        let missing = super::artifact_bytes(std::path::Path::new("/nonexistent/model.gguf"));
        assert!(
            matches!(&missing, Err(LaunchError::File { path, .. }) if path.ends_with("model.gguf")),
            "{missing:?}"
        );
        let said = missing.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(said.starts_with("/nonexistent/model.gguf: "), "{said}");
    }
}
