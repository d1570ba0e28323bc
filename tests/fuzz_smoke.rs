//! A bounded smoke run of the fuzz targets (fuzz/, run for real with
//! `cargo xtask fuzz`) on stable Rust: each target's seeds, then a few
//! thousand deterministic mutations of them — bit flips, overwritten
//! lengths, cuts, splices. A panic anywhere fails the test; errors are the
//! expected answer to most of these inputs.

use gapscope::fuzzing;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut d = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        if d.is_empty() {
            d.push(rng.next() as u8);
            continue;
        }
        let i = rng.below(d.len());
        match rng.below(6) {
            0 => d[i] ^= 1 << rng.below(8),
            1 => d[i] = rng.next() as u8,
            2 => {
                // A length or count field claiming something huge.
                let v = [0u32, u32::MAX, 0x7fff_ffff, 0x0100_0000][rng.below(4)];
                for (k, b) in v.to_le_bytes().iter().enumerate() {
                    if let Some(x) = d.get_mut(i + k) {
                        *x = *b;
                    }
                }
            }
            3 => d.truncate(i),
            4 => {
                let j = rng.below(d.len());
                let (a, b) = (i.min(j), i.max(j));
                let piece = d[a..b].to_vec();
                d.splice(i..i, piece);
            }
            _ => {
                let j = (i + rng.below(16)).min(d.len());
                d.drain(i..j);
            }
        }
    }
    d
}

fn smoke(target: &str, iterations: usize) {
    let seeds = fuzzing::seeds(target);
    assert!(!seeds.is_empty(), "{target} has seeds");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ target.len() as u64);
    for s in &seeds {
        fuzzing::run(target, s);
    }
    for i in 0..iterations {
        let input = mutate(&seeds[i % seeds.len()], &mut rng);
        fuzzing::run(target, &input);
    }
}

#[test]
fn the_seeds_are_real_inputs() {
    // The mutations start from inputs that read back with content, or they
    // would test only the first error path.
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("s.gsz");
    std::fs::write(&session, &fuzzing::seeds("session_file")[0]).unwrap();
    let s = gapscope::session::read_session(&session).unwrap();
    assert_eq!(s.events.len(), 3);
    assert_eq!(s.gpu.len(), 2);
    assert!(s.truncated.is_none());
    assert_eq!(s.gpu_lost.len(), 1);
    assert_eq!(s.gpu_blind.len(), 1);
    assert_eq!(s.gpu_skipped.get(&10), Some(&(1, 2)));
    let trace = dir.path().join("t.json");
    std::fs::write(&trace, &fuzzing::seeds("kineto_trace")[0]).unwrap();
    let s = gapscope::kineto::import(&trace).unwrap();
    assert_eq!(
        s.gpu
            .iter()
            .filter(|(_, r)| matches!(r, gapscope_wire::GpuRecord::Kernel { .. }))
            .count(),
        1
    );
    let frames = gapscope_tests::frames_of(&fuzzing::seeds("wire_protocol")[0]);
    // Hello, kernels, Lost, an NVTX range, Blind, Sighted, Skipped, Info,
    // Goodbye: every frame type.
    assert_eq!(frames.len(), 9);
}

#[test]
fn session_file_smoke() {
    smoke("session_file", 1500);
}

#[test]
fn session_records_smoke() {
    smoke("session_records", 3000);
}

#[test]
fn wire_protocol_smoke() {
    smoke("wire_protocol", 20000);
}

#[test]
fn kineto_trace_smoke() {
    smoke("kineto_trace", 1500);
}

#[test]
fn past_fuzzer_findings_stay_fixed() {
    // fuzz/regressions/<target>/: inputs that once crashed a target, kept
    // (named after what they broke) so that the bug stays fixed.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
    let mut replayed = 0;
    for target in fuzzing::TARGETS {
        let Ok(dir) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in dir {
            let path = entry.unwrap().path();
            let input = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| fuzzing::run(target, &input));
            assert!(outcome.is_ok(), "{} panics again", path.display());
            replayed += 1;
        }
    }
    assert!(
        replayed > 0,
        "no regression inputs found under {}",
        root.display()
    );
}

#[test]
fn the_committed_seed_corpora_are_the_seeds() {
    // fuzz/seeds/<target>/ is what `cargo xtask fuzz` starts from;
    // GAPSCOPE_BLESS=1 rewrites it from the library's seeds.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    for target in fuzzing::TARGETS {
        let dir = root.join(target);
        for (i, seed) in fuzzing::seeds(target).iter().enumerate() {
            let path = dir.join(format!("seed-{i}"));
            if std::env::var("GAPSCOPE_BLESS").as_deref() == Ok("1") {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, seed).unwrap();
            }
            assert_eq!(
                &std::fs::read(&path).unwrap_or_default(),
                seed,
                "{}: stale; GAPSCOPE_BLESS=1 cargo test -p gapscope-tests --test fuzz_smoke",
                path.display()
            );
        }
    }
}
