//! The `recover` command: a run whose process died is made readable again (its parts
//! closed or quarantined, `recovery.json` written by `record::recover`).

use std::path::Path;

use super::io::{CliError, Exit, tool, usage};
use crate::record::rundir::{self, RunDir};

/// The `recover` command: quarantine unfinished parts and count the rows they held.
pub fn recover_cmd(dir: &Path) -> Result<Exit, CliError> {
    // A live run's open part is not a crashed one's: moving it away would destroy it.
    rundir::refuse_locked(dir).map_err(|e| usage(e.to_string()))?;
    // A shard's report folder (OUT/shards/I) keeps its ledger; its parts are in
    // OUT/exchanges/shard=I.
    let shard = crate::run::open::shard_parts(dir);
    let exchanges = shard.clone().unwrap_or_else(|| dir.join(rundir::EXCHANGES));
    if !exchanges.is_dir() {
        return Err(usage(format!(
            "{}: no exchanges/ directory; is this a run directory?",
            dir.display()
        )));
    }
    let r = match &shard {
        Some(ex) => {
            crate::record::recover::recover_parts(dir, ex, &dir.join(crate::record::LEDGER))
        }
        None => crate::record::recover::recover(dir),
    }
    .map_err(|e| tool(e.to_string()))?;
    let report =
        crate::report::doc::recovery::Recovery::new(&r.quarantined, r.rows_lost, r.rows_kept);
    RunDir::existing(dir)
        .write_json(rundir::RECOVERY, &report)
        .map_err(|e| tool(e.to_string()))?;
    eprintln!(
        "matrix-proxy: {} unfinished part(s) moved to quarantine/; {} rows lost of those the ledger had seen, {} rows kept in closed parts (recovery.json); exchanges that finished after the last ledger entry are not counted; run `matrix-proxy summarize {}` next",
        r.quarantined.len(),
        r.rows_lost,
        r.rows_kept,
        dir.display()
    );
    Ok(if r.rows_lost > 0 {
        Exit::Failure
    } else {
        Exit::Ok
    })
}
