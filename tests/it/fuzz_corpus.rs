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
    let targets: [(&str, Target); 6] = [
        ("plan", matrix_proxy::fuzzing::plan),
        ("pointer", matrix_proxy::fuzzing::pointer),
        ("oracle", matrix_proxy::fuzzing::oracle),
        ("sse", matrix_proxy::fuzzing::sse),
        ("http1_response", matrix_proxy::fuzzing::http1_response),
        ("prom_text", matrix_proxy::fuzzing::prom_text),
    ];
    for (name, f) in targets {
        let seeds = replay_dir(&Path::new("fuzz/seeds").join(name), f);
        let corpus = replay_dir(&Path::new("fuzz/corpus").join(name), f);
        assert!(seeds > 0, "{name}: no seeds");
        eprintln!("fuzz corpus {name}: {seeds} seeds, {corpus} kept inputs");
    }
}

/// The lean client's response codec against hyper's client on thousands of deterministic
/// mutations of the seed responses (byte flips, framing bytes inserted, bytes deleted):
/// a bounded, repeatable complement to `bash fuzz/run.sh`.
#[test]
fn mutated_responses_frame_as_hyper_frames_them() {
    let mut seeds = Vec::new();
    for e in std::fs::read_dir("fuzz/seeds/http1_response").unwrap() {
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
    let mut runs = 0;
    for seed in &seeds {
        for _ in 0..300 {
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
            let r = std::panic::catch_unwind(|| matrix_proxy::fuzzing::http1_response(&m));
            assert!(
                r.is_ok(),
                "differs from hyper on {:?}",
                String::from_utf8_lossy(&m)
            );
            runs += 1;
        }
    }
    eprintln!("{runs} mutated responses framed alike");
}
