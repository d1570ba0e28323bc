//! gapscope: measures whether GPUs did useful work and, when they sat idle,
//! names the cause. This crate is the library behind the `gapscope` binary.
//! Its stages, in the order data flows through them:
//!
//! 1. `collect` records a process tree with eBPF (and the GPU through the
//!    CUPTI shim) into a `session`; `kineto` imports PyTorch profiler traces
//!    into the same session model; `inputs` tells the two apart;
//! 2. `timeline` replays a session into per-thread accounts and, per GPU,
//!    its work with the calls that launched it;
//! 3. `analyze` — one entry point, `analyze::analyze` — attributes every
//!    idle GPU nanosecond to a cause and draws the advice, into an
//!    `Analysis`;
//! 4. `export` renders an `Analysis`: reports, pictures and the timeline.
//!
//! Each stage imports only the ones before it (the `layers` test below
//! keeps it so). `agent`, the node daemon, drives them all and no stage
//! names it.

pub mod agent;
pub mod analyze;
pub mod clock;
pub mod collect;
pub mod export;
#[doc(hidden)]
pub mod fuzzing;
pub mod inputs;
pub mod intervals;
pub mod kineto;
pub mod output;
pub mod safe_fs;
pub mod session;
pub mod spool;
pub mod timeline;
pub mod units;

#[cfg(test)]
mod layers {
    use std::path::Path;

    /// Every `crate::<module>` a folder's sources name.
    fn imports_of(folder: &str) -> Vec<(String, String)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src")
            .join(folder);
        let mut out = Vec::new();
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for (i, _) in text.match_indices("crate::") {
                        let module: String = text[i + 7..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        out.push((p.display().to_string(), module));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn each_stage_imports_only_the_stages_before_it() {
        // Folder → the crate modules it must never name.
        let rules: [(&str, &[&str]); 6] = [
            (
                "session",
                &[
                    "collect", "timeline", "analyze", "export", "kineto", "inputs", "agent",
                ],
            ),
            (
                "collect",
                &["timeline", "analyze", "export", "kineto", "inputs", "agent"],
            ),
            (
                "kineto",
                &[
                    "collect", "timeline", "analyze", "export", "inputs", "agent",
                ],
            ),
            (
                "timeline",
                &["collect", "analyze", "export", "kineto", "inputs", "agent"],
            ),
            (
                "analyze",
                &["collect", "export", "kineto", "inputs", "agent"],
            ),
            ("export", &["collect", "kineto", "inputs", "agent"]),
        ];
        let mut wrong = Vec::new();
        for (folder, banned) in rules {
            for (file, module) in imports_of(folder) {
                if banned.contains(&module.as_str()) {
                    wrong.push(format!("{file} names crate::{module}"));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "edges running backwards:\n{}",
            wrong.join("\n")
        );
    }

    /// Renderers read the analysis, never the recording itself.
    #[test]
    fn export_never_reads_a_session() {
        let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src/export")];
        let mut files = Vec::new();
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                if e.path().is_dir() {
                    dirs.push(e.path());
                } else {
                    files.push(e.path());
                }
            }
        }
        assert!(files.iter().any(|f| f.ends_with("export/diff.rs")));
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            // Tests may build a session to analyse.
            let text = text.split("#[cfg(test)]").next().unwrap();
            let named = text.match_indices("Session").any(|(i, _)| {
                let before = text[..i].chars().next_back();
                let after = text[i + 7..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            });
            assert!(!named, "{} names Session", path.display());
        }
    }
}
