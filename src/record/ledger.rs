//! The writer's ledger, `exchanges/.ledger`: one line `PART ROWS` each time rows are
//! handed to a part. It is appended to before the part is closed, and the page cache
//! outlives a crash of this process, so [`super::recover`] can count what an unfinished
//! part held. A dot-file: no reader globs it.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::Path;

/// Name of the writer's ledger in `exchanges/` (a dot-file: no reader globs it).
pub const LEDGER: &str = ".ledger";

/// The ledger, open for appending. Best effort: a ledger that cannot be written costs
/// only `recover`'s count, never the rows themselves.
pub(crate) struct Ledger(Option<File>);

impl Ledger {
    pub(crate) fn open(exchanges: &Path) -> Ledger {
        Ledger(
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(exchanges.join(LEDGER))
                .ok(),
        )
    }

    /// Part `part` now holds `rows` rows.
    pub(crate) fn note(&mut self, part: u32, rows: usize) {
        if let Some(f) = self.0.as_mut() {
            let _ = writeln!(f, "{part} {rows}");
        }
    }
}

/// Rows handed to each part so far (the last line per part wins).
pub(crate) fn read(exchanges: &Path) -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    if let Ok(text) = fs::read_to_string(exchanges.join(LEDGER)) {
        for line in text.lines() {
            let mut it = line.split_whitespace();
            if let (Some(p), Some(r)) = (it.next(), it.next())
                && let (Ok(p), Ok(r)) = (p.parse(), r.parse())
            {
                m.insert(p, r);
            }
        }
    }
    m
}
