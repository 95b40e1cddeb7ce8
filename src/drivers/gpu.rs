//! Device-wide GPU telemetry on the run's clock (`--gpu-metrics`): `nvidia-smi
//! --query-gpu ... -lms N` as a child process whose every line is stamped as it arrives,
//! or a DCGM exporter's `/metrics` scraped like the worker's. A machine without
//! `nvidia-smi` (or without a GPU) is said once, never an error. The campaign's per-process
//! VRAM sampling (`--query-compute-apps`, `drivers::replay::launch`) is separate and stays.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncBufReadExt;

use crate::clock;
use crate::record::gpu::GpuRow;
use crate::record::scrapes::ScrapeRow;

/// nvidia-smi's query fields after `index,uuid`, each with its unit under `nounits`.
pub(crate) const FIELDS: &[(&str, &str)] = &[
    ("utilization.gpu", "%"),
    ("utilization.memory", "%"),
    ("memory.used", "MiB"),
    ("memory.total", "MiB"),
    ("power.draw", "W"),
    ("temperature.gpu", "C"),
    ("clocks.sm", "MHz"),
];

/// What sampling gathered, and why it stopped early (said once).
#[derive(Debug, Default)]
pub(crate) struct GpuGathered {
    pub(crate) rows: Vec<GpuRow>,
    pub(crate) samples: u64,
    pub(crate) unreadable_lines: u64,
    /// No telemetry, or the end of it: `nvidia-smi` not on PATH, it exited, ...
    pub(crate) said: Option<String>,
}

/// One line of `nvidia-smi --query-gpu=index,uuid,<FIELDS> --format=csv,noheader,nounits`
/// as rows; `None` when it is not such a line. A field nvidia-smi cannot read
/// (`[N/A]`, `[Not Supported]`) is left out.
pub(crate) fn parse_line(line: &str, offset_us: i64, wall_time_us: i64) -> Option<Vec<GpuRow>> {
    let cells: Vec<&str> = line.split(',').map(str::trim).collect();
    if cells.len() != FIELDS.len() + 2 {
        return None;
    }
    let gpu = cells[0].parse::<i32>().ok()?;
    let uuid = cells[1].to_string();
    Some(
        FIELDS
            .iter()
            .zip(&cells[2..])
            .filter_map(|((metric, unit), v)| {
                let value = v.parse::<f64>().ok().filter(|v| v.is_finite())?;
                Some(GpuRow {
                    offset_us,
                    wall_time_us,
                    source: "nvidia-smi",
                    gpu: Some(gpu),
                    uuid: Some(uuid.clone()),
                    metric: (*metric).to_string(),
                    value,
                    unit: Some(unit),
                })
            })
            .collect(),
    )
}

/// Run `nvidia-smi` every `every` until `stop` fires, its lines stamped on the run's clock.
pub(crate) async fn nvidia_smi(
    run_t0_ns: u64,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    out: Arc<Mutex<GpuGathered>>,
) {
    let fields: Vec<&str> = FIELDS.iter().map(|(f, _)| *f).collect();
    let query = format!("--query-gpu=index,uuid,{}", fields.join(","));
    let ms = every.as_millis().max(1).to_string();
    let spawned = tokio::process::Command::new("nvidia-smi")
        .args([&query, "--format=csv,noheader,nounits", "-lms", &ms])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let say = |why: String| {
        if let Ok(mut g) = out.lock() {
            g.said.get_or_insert(why);
        }
    };
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return say("nvidia-smi is not on PATH (no GPU here?)".into());
        }
        Err(e) => return say(format!("nvidia-smi could not start: {e}")),
    };
    let Some(stdout) = child.stdout.take() else {
        return say("nvidia-smi's output could not be read".into());
    };
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut first_unreadable: Option<String> = None;
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => {
                    let at = clock::now_ns();
                    let rows = parse_line(&line, clock::us_between(run_t0_ns, at), clock::wall_now_us());
                    let Ok(mut g) = out.lock() else { break };
                    match rows {
                        Some(rows) => {
                            g.samples += 1;
                            g.rows.extend(rows);
                        }
                        None if !line.trim().is_empty() => {
                            g.unreadable_lines += 1;
                            first_unreadable.get_or_insert(line);
                        }
                        None => {}
                    }
                }
                // It ended by itself: no GPU, no driver, or it was killed.
                Ok(None) | Err(_) => {
                    let status = child.wait().await.map(|s| s.to_string()).unwrap_or_default();
                    let seen = first_unreadable.map(|l| format!(": {l}")).unwrap_or_default();
                    return say(format!("nvidia-smi stopped by itself ({status}){seen}"));
                }
            },
            _ = stop.changed() => break,
        }
    }
    let _ = child.kill().await;
}

/// A DCGM exporter's samples (scraped like the worker's) as GPU rows: its `gpu` and
/// `UUID` labels name the device.
pub(crate) fn from_dcgm(rows: Vec<ScrapeRow>) -> Vec<GpuRow> {
    rows.into_iter()
        .map(|r| {
            let label = |k: &str| {
                r.labels
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.clone())
            };
            GpuRow {
                offset_us: r.offset_us,
                wall_time_us: r.wall_time_us,
                source: "dcgm",
                gpu: label("gpu").and_then(|g| g.parse().ok()),
                uuid: label("UUID"),
                metric: r.metric,
                value: r.value,
                unit: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_line_is_one_row_per_readable_field() {
        let rows = parse_line("1, GPU-5e1a, 87, 40, 70000, 81559, [N/A], 61, 1980", 5, 6)
            .unwrap_or_default();
        let got: Vec<(&str, f64, Option<&str>)> = rows
            .iter()
            .map(|r| (r.metric.as_str(), r.value, r.unit))
            .collect();
        assert_eq!(got.len(), 6, "power.draw [N/A] left out: {got:?}");
        assert_eq!(got[0], ("utilization.gpu", 87.0, Some("%")));
        assert_eq!(got[2], ("memory.used", 70000.0, Some("MiB")));
        assert!(rows.iter().all(|r| r.gpu == Some(1) && r.offset_us == 5));
        assert_eq!(rows[0].uuid.as_deref(), Some("GPU-5e1a"));
        assert!(parse_line("No devices were found", 0, 0).is_none());
        assert!(parse_line("x, y, 1, 2, 3, 4, 5, 6, 7", 0, 0).is_none());
    }
}
