//! The writer's ledger, `exchanges.ledger` beside `exchanges/`: one line `PART ROWS` each
//! time rows are handed to a part. It is appended to before the part is closed, and the
//! page cache outlives a crash of this process, so [`super::recover`] can count what an
//! unfinished part held. It sits outside `exchanges/` so that the folder holds Parquet
//! only and every reader (polars included) can read it as a dataset. Runs made before
//! kept it as `exchanges/.ledger`; `read` still finds it there.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Name of the writer's ledger in the run directory, beside `exchanges/`.
pub const LEDGER: &str = "exchanges.ledger";
/// Where runs made before kept it, inside `exchanges/`.
const OLD_LEDGER: &str = ".ledger";

/// The ledger of the parts in the folder `exchanges`: a sibling file named after it with
/// `.ledger` (`RUN/exchanges` -> `RUN/exchanges.ledger`, which is [`LEDGER`] in a run
/// directory; a library user's folder `data/parts` gets `data/parts.ledger`).
fn path_of(exchanges: &Path) -> PathBuf {
    exchanges.with_extension("ledger")
}

/// The ledger, open for appending. Best effort: a ledger that cannot be written costs
/// only `recover`'s count, never the rows themselves.
pub(crate) struct Ledger(Option<File>);

impl Ledger {
    pub(crate) fn open(exchanges: &Path) -> Ledger {
        Ledger(
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path_of(exchanges))
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
    let text = fs::read_to_string(path_of(exchanges))
        .or_else(|_| fs::read_to_string(exchanges.join(OLD_LEDGER)));
    if let Ok(text) = text {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_sits_beside_exchanges_and_an_old_run_is_still_read() {
        let run = tempfile::tempdir().unwrap();
        let ex = run.path().join("exchanges");
        fs::create_dir(&ex).unwrap();
        let mut l = Ledger::open(&ex);
        l.note(0, 50);
        l.note(0, 100);
        l.note(1, 7);
        drop(l);
        assert!(run.path().join(LEDGER).is_file());
        assert_eq!(
            fs::read_dir(&ex).unwrap().count(),
            0,
            "exchanges/ holds parts only"
        );
        assert_eq!(read(&ex), BTreeMap::from([(0, 100), (1, 7)]));
        // A run made before kept it inside exchanges/.
        let old = tempfile::tempdir().unwrap();
        let ex = old.path().join("exchanges");
        fs::create_dir(&ex).unwrap();
        fs::write(ex.join(OLD_LEDGER), "0 10\n0 20\n").unwrap();
        assert_eq!(read(&ex), BTreeMap::from([(0, 20)]));
    }
}
