//! One run as the report reads it ([`RunInput`]: its config, summary, campaign, verdict and
//! row facts), and the one HTML escape every part of the page goes through. Imports
//! nothing else from `html/`.

use serde_json::Value;

use crate::record::read::RowFacts;
use crate::report::doc::campaign::CampaignDoc;
use crate::report::doc::config::{Command, Config};
use crate::report::doc::summary::{AnySummary, ServeSummary, Summary};
use crate::report::doc::verdict::VerdictDoc;

/// One run as the report reads it.
pub(crate) struct RunInput {
    /// How the run is named in legends (its folder's name, made unique).
    pub(crate) label: String,
    pub(crate) dir: String,
    pub(crate) config: Config,
    pub(crate) summary: AnySummary,
    /// The plan's `metadata` (replay).
    pub(crate) plan_metadata: Option<serde_json::Map<String, Value>>,
    pub(crate) campaign: Option<CampaignDoc>,
    pub(crate) verdict: Option<VerdictDoc>,
    /// search.json (`replay --search`).
    pub(crate) search: Option<crate::search::doc::SearchDoc>,
    pub(crate) facts: Vec<RowFacts>,
    /// The worker's scraped metrics and the GPU's telemetry (empty without them).
    pub(crate) worker: Vec<crate::record::scrapes::ScrapeRow>,
    pub(crate) gpu: Vec<crate::record::gpu::GpuRow>,
}

impl RunInput {
    pub(super) fn is_serve(&self) -> bool {
        self.config.command == Command::Serve
    }

    pub(super) fn replay_summary(&self) -> Option<&Summary> {
        match &self.summary {
            AnySummary::Replay(s) => Some(s),
            AnySummary::Serve(_) => None,
        }
    }

    pub(super) fn serve_summary(&self) -> Option<&ServeSummary> {
        match &self.summary {
            AnySummary::Serve(s) => Some(s),
            AnySummary::Replay(_) => None,
        }
    }
}

/// HTML text escaping (element content and double-quoted attributes).
pub(crate) fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}
