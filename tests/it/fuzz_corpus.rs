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
    let targets: [(&str, Target); 7] = [
        ("plan", matrix_proxy::fuzzing::plan),
        ("pointer", matrix_proxy::fuzzing::pointer),
        ("oracle", matrix_proxy::fuzzing::oracle),
        ("sse", matrix_proxy::fuzzing::sse),
        ("http1_response", matrix_proxy::fuzzing::http1_response),
        ("http1_request", matrix_proxy::fuzzing::http1_request),
        ("prom_text", matrix_proxy::fuzzing::prom_text),
    ];
    for (name, f) in targets {
        let seeds = replay_dir(&Path::new("fuzz/seeds").join(name), f);
        let corpus = replay_dir(&Path::new("fuzz/corpus").join(name), f);
        assert!(seeds > 0, "{name}: no seeds");
        eprintln!("fuzz corpus {name}: {seeds} seeds, {corpus} kept inputs");
    }
}

/// Every seed of `dir` mutated `per_seed` times (byte flips, framing bytes inserted,
/// bytes deleted), each mutation run through `f`; the number of runs and of those for
/// which each of `f`'s two answers was yes.
fn mutations(dir: &str, per_seed: usize, f: fn(&[u8]) -> [bool; 2]) -> (usize, [usize; 2]) {
    let mut seeds = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        seeds.push(std::fs::read(e.unwrap().path()).unwrap());
    }
    seeds.sort();
    // xorshift64*: the same mutations on every run.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    const SPECIAL: &[u8] = b"\r\n :;0123456789abcdefABCDEF\t,-+xz";
    let (mut runs, mut yes) = (0, [0, 0]);
    for seed in &seeds {
        for _ in 0..per_seed {
            let mut m = seed.clone();
            for _ in 0..1 + next() % 3 {
                if m.is_empty() {
                    m.push(b'H');
                }
                let at = (next() % m.len() as u64) as usize;
                let b = SPECIAL[(next() % SPECIAL.len() as u64) as usize];
                match next() % 3 {
                    0 => m[at] = b,
                    1 => m.insert(at, b),
                    _ => {
                        m.remove(at);
                    }
                }
            }
            let r = std::panic::catch_unwind(|| f(&m));
            assert!(
                r.is_ok(),
                "{dir}: a view differs on {:?}",
                String::from_utf8_lossy(&m)
            );
            runs += 1;
            let r = r.unwrap_or_default();
            yes[0] += usize::from(r[0]);
            yes[1] += usize::from(r[1]);
        }
    }
    (runs, yes)
}

/// The lean client's response codec against hyper's client, and serve's relay of the same
/// answers read back by hyper, a lenient and a strict client, on thousands of
/// deterministic mutations of the seed responses: a bounded, repeatable complement to
/// `bash fuzz/run.sh`.
#[test]
fn mutated_responses_frame_as_hyper_frames_them() {
    let respond = |d: &[u8]| [matrix_proxy::fuzzing::http1_response_relayed(d), false];
    let (runs, [relayed, _]) = mutations("fuzz/seeds/http1_response", 300, respond);
    eprintln!("{runs} mutated responses framed alike, {relayed} relayed by serve");
    // Most comparisons must be of relayed responses, not of serve's own 502s.
    assert!(
        relayed * 5 >= runs,
        "only {relayed} of {runs} mutations were relayed"
    );
}

/// Our request reader against hyper's server, and what serve forwards for the same bytes
/// read back by hyper, a lenient and a strict server, the same way.
#[test]
fn mutated_requests_frame_as_hyper_frames_them() {
    let take = |d: &[u8]| {
        let (accepted, forwarded) = matrix_proxy::fuzzing::http1_request_accepted(d);
        [accepted, forwarded > 0]
    };
    let (runs, [accepted, forwarded]) = mutations("fuzz/seeds/http1_request", 1000, take);
    eprintln!(
        "{runs} mutated requests framed alike, {accepted} of them taken by both, {forwarded} forwarded by serve"
    );
    // Most comparisons must be of whole requests, not of two refusals.
    assert!(
        accepted * 4 >= runs,
        "only {accepted} of {runs} mutations were requests"
    );
    assert!(
        forwarded * 6 >= runs,
        "only {forwarded} of {runs} mutations were forwarded by serve"
    );
}
