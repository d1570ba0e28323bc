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
pub mod holdback;
pub mod inputs;
pub mod intervals;
pub mod kineto;
pub mod output;
pub mod safe_fs;
pub mod session;
pub mod spool;
#[cfg(test)]
mod testing;
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

    /// The modules of a stage that one of its modules names: `super::x`
    /// (or `super::{x, …}`) from its own depth, or `crate::<stage>::x`.
    fn siblings_named(stage: &str, file: &Path, siblings: &[String]) -> Vec<String> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src")
            .join(stage);
        let depth = file.strip_prefix(&src).unwrap().components().count();
        let is_mod = file.file_name().is_some_and(|n| n == "mod.rs");
        let up = match (depth, is_mod) {
            (1, _) | (2, true) => "super::".to_string(),
            (2, false) | (3, true) => "super::super::".to_string(),
            _ => String::new(),
        };
        let text = std::fs::read_to_string(file).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap();
        let mut named = Vec::new();
        let mut prefixes = vec![format!("crate::{stage}::")];
        if !up.is_empty() {
            prefixes.push(up);
        }
        for prefix in &prefixes {
            for (i, _) in text.match_indices(prefix.as_str()) {
                // `super::super::x` seen from the shorter prefix is not ours.
                if text[..i].ends_with("super::") {
                    continue;
                }
                let rest = &text[i + prefix.len()..];
                let heads: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                    // The group's items at its top level.
                    let mut depth = 0;
                    let end = group
                        .char_indices()
                        .find(|&(_, c)| {
                            depth += (c == '{') as i32 - (c == '}') as i32;
                            depth < 0
                        })
                        .map_or(group.len(), |(j, _)| j);
                    let mut items = Vec::new();
                    let mut depth = 0;
                    let mut start = 0;
                    for (j, c) in group[..end].char_indices() {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            ',' if depth == 0 => {
                                items.push(&group[start..j]);
                                start = j + 1;
                            }
                            _ => {}
                        }
                    }
                    items.push(&group[start..end]);
                    items
                } else {
                    vec![rest]
                };
                for h in heads {
                    let name: String = h
                        .trim_start()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if siblings.contains(&name) {
                        named.push(name);
                    }
                }
            }
        }
        named
    }

    /// Within each stage, no module names another that names it back, by
    /// any path: a stage's modules are layered too.
    #[test]
    fn no_module_of_a_stage_imports_in_a_circle() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut circles = Vec::new();
        for stage in [
            "session", "collect", "kineto", "timeline", "analyze", "export", "agent",
        ] {
            let dir = root.join(stage);
            let mut modules: Vec<(String, Vec<std::path::PathBuf>)> = Vec::new();
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                let p = e.path();
                let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                if p.is_dir() {
                    let mut files = Vec::new();
                    let mut stack = vec![p.clone()];
                    while let Some(d) = stack.pop() {
                        for e in std::fs::read_dir(&d).unwrap().flatten() {
                            if e.path().is_dir() {
                                stack.push(e.path());
                            } else if e.path().extension().is_some_and(|x| x == "rs") {
                                files.push(e.path());
                            }
                        }
                    }
                    modules.push((name, files));
                } else if p.extension().is_some_and(|x| x == "rs") && name != "mod" {
                    modules.push((name, vec![p]));
                }
            }
            let names: Vec<String> = modules.iter().map(|m| m.0.clone()).collect();
            let edges: std::collections::HashMap<&str, std::collections::BTreeSet<String>> =
                modules
                    .iter()
                    .map(|(m, files)| {
                        let named = files
                            .iter()
                            .flat_map(|f| siblings_named(stage, f, &names))
                            .filter(|n| n != m)
                            .collect();
                        (m.as_str(), named)
                    })
                    .collect();
            // A module reaches itself again: a circle.
            for start in &names {
                let mut seen = std::collections::HashSet::new();
                let mut todo: Vec<Vec<String>> = vec![vec![start.clone()]];
                while let Some(path) = todo.pop() {
                    for next in &edges[path.last().unwrap().as_str()] {
                        if next == start {
                            circles.push(format!("{stage}: {} -> {start}", path.join(" -> ")));
                        } else if seen.insert(next.clone()) {
                            let mut p = path.clone();
                            p.push(next.clone());
                            todo.push(p);
                        }
                    }
                }
            }
        }
        assert!(
            circles.is_empty(),
            "imports in a circle:\n{}",
            circles.join("\n")
        );
    }
}
