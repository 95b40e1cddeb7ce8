//! `recovery.json`: what `recover` did to a crashed run.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Recovery {
    /// The unfinished parts moved to quarantine/.
    pub(crate) quarantined: Vec<String>,
    pub(crate) rows_lost: u64,
    pub(crate) rows_kept: u64,
    pub(crate) definitions: RecoveryDefinitions,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RecoveryDefinitions {
    pub(crate) rows_lost: String,
    pub(crate) rows_kept: String,
}

impl Recovery {
    pub(crate) fn new(
        quarantined: &[std::path::PathBuf],
        rows_lost: u64,
        rows_kept: u64,
    ) -> Recovery {
        Recovery {
            quarantined: quarantined.iter().map(|p| p.display().to_string()).collect(),
            rows_lost,
            rows_kept,
            definitions: RecoveryDefinitions {
                rows_lost: "rows the writer had handed to the unfinished parts, plus rows it held unencoded during a replay round (counted every 64), both from its ledger; rows still queued in memory at the moment of a crash are not on disk anywhere and cannot be counted here".into(),
                rows_kept: "rows in closed parts, all readable".into(),
            },
        }
    }
}
