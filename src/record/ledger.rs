//! The writer's ledger, `exchanges.ledger` beside `exchanges/`: one line `PART ROWS` each
//! time rows are handed to a part, and `held ROWS` while rows wait unencoded (a measured
//! round of replay, every 64 rows; `held 0` once they are encoded). It is appended to before the part is closed, and the
//! page cache outlives a crash of this process, so [`super::recover`] can count what an
//! unfinished part held. It sits outside `exchanges/` so that the folder holds Parquet
//! only and every reader (polars included) can read it as a dataset. Runs made before
//! kept it as `exchanges/.ledger`; `read` still finds it there.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Name of the writer's ledger in the run directory, beside `exchanges/`.
pub const LEDGER: &str = super::rundir::LEDGER;
/// Where runs made before kept it, inside `exchanges/`.
const OLD_LEDGER: &str = ".ledger";

/// The ledger of the parts in the folder `exchanges`: a sibling file named after it with
/// `.ledger` (`RUN/exchanges` -> `RUN/exchanges.ledger`, which is [`LEDGER`] in a run
/// directory; a library user's folder `data/parts` gets `data/parts.ledger`).
pub(crate) fn path_of(exchanges: &Path) -> PathBuf {
    exchanges.with_extension("ledger")
}

/// The ledger, open for appending. Best effort: a ledger that cannot be written costs
/// only `recover`'s count, never the rows themselves.
pub(crate) struct Ledger(Option<File>);

impl Ledger {
    pub(crate) fn open(exchanges: &Path) -> Ledger {
        Ledger::open_at(&path_of(exchanges))
    }

    /// The ledger at `path` (a sharded run keeps each shard's in its report folder, so
    /// that `exchanges/` holds partition folders only).
    pub(crate) fn open_at(path: &Path) -> Ledger {
        Ledger(
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .ok(),
        )
    }

    /// Part `part` now holds `rows` rows; with `held`, that many rows are (still) held in
    /// memory, not yet in any part. One write, so a crash sees both lines or neither.
    pub(crate) fn note(&mut self, part: u32, rows: usize, held: Option<usize>) {
        let line = match held {
            Some(h) => format!("{part} {rows}\nheld {h}\n"),
            None => format!("{part} {rows}\n"),
        };
        self.write(&line);
    }

    /// `rows` rows are held in memory, not yet in any part.
    pub(crate) fn note_held(&mut self, rows: usize) {
        self.write(&format!("held {rows}\n"));
    }

    fn write(&mut self, line: &str) {
        if let Some(f) = self.0.as_mut() {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// What the ledger says.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Noted {
    /// Rows handed to each part so far (the last line per part wins).
    pub(crate) parts: BTreeMap<u32, u64>,
    /// Rows held unencoded at the last `held` line.
    pub(crate) held: u64,
}

#[cfg(test)]
pub(crate) fn read(exchanges: &Path) -> Noted {
    read_at(&path_of(exchanges), exchanges)
}

/// `read` of the ledger at `path` (or, for runs made before it moved, the one inside
/// `exchanges`).
pub(crate) fn read_at(path: &Path, exchanges: &Path) -> Noted {
    let mut n = Noted::default();
    let text = fs::read_to_string(path).or_else(|_| fs::read_to_string(exchanges.join(OLD_LEDGER)));
    if let Ok(text) = text {
        for line in text.lines() {
            let mut it = line.split_whitespace();
            match (it.next(), it.next().map(str::parse::<u64>)) {
                (Some("held"), Some(Ok(r))) => n.held = r,
                (Some(p), Some(Ok(r))) => {
                    if let Ok(p) = p.parse() {
                        n.parts.insert(p, r);
                    }
                }
                _ => {}
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_sits_beside_exchanges_and_an_old_run_is_still_read() {
        let (run, ex) = crate::record::tests_support::run_dir();
        let mut l = Ledger::open(&ex);
        l.note(0, 50, None);
        l.note(0, 100, None);
        l.note_held(1024);
        l.note(1, 7, Some(1000));
        drop(l);
        assert!(run.path().join(LEDGER).is_file());
        assert_eq!(
            fs::read_dir(&ex).unwrap().count(),
            0,
            "exchanges/ holds parts only"
        );
        let noted = read(&ex);
        assert_eq!(noted.parts, BTreeMap::from([(0, 100), (1, 7)]));
        assert_eq!(noted.held, 1000);
        // A run made before kept it inside exchanges/.
        let (_old, ex) = crate::record::tests_support::run_dir();
        fs::write(ex.join(OLD_LEDGER), "0 10\n0 20\n").unwrap();
        assert_eq!(read(&ex).parts, BTreeMap::from([(0, 20)]));
    }
}
