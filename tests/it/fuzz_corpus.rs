//! Every input the fuzzers keep (fuzz/seeds and fuzz/corpus) replayed through the same entry
//! points on stable, so what fuzzing found stays fixed. `bash fuzz/run.sh` grows the corpus.

use std::path::Path;

type Target = fn(&[u8]);

fn replay_dir(dir: &Path, f: Target) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in entries {
        let p = e.unwrap().path();
        let data = std::fs::read(&p).unwrap();
        let r = std::panic::catch_unwind(|| f(&data));
        assert!(r.is_ok(), "{} panicked", p.display());
        n += 1;
    }
    n
}

#[test]
fn every_kept_fuzz_input_passes() {
    let targets: [(&str, Target); 4] = [
        ("plan", matrix_proxy::fuzzing::plan),
        ("pointer", matrix_proxy::fuzzing::pointer),
        ("oracle", matrix_proxy::fuzzing::oracle),
        ("sse", matrix_proxy::fuzzing::sse),
    ];
    for (name, f) in targets {
        let seeds = replay_dir(&Path::new("fuzz/seeds").join(name), f);
        let corpus = replay_dir(&Path::new("fuzz/corpus").join(name), f);
        assert!(seeds > 0, "{name}: no seeds");
        eprintln!("fuzz corpus {name}: {seeds} seeds, {corpus} kept inputs");
    }
}
