//! The input pipeline by stage: where the job's input code spent its CPU
//! time, over every thread that ran some — DataLoader workers, the pin
//! thread, and the trainer loading batches itself (num_workers=0) alike —
//! read from the samples' stacks by the code regions ([`super::code`]),
//! with the functions that took most of each stage; and the time those
//! threads spent blocked reading files, the read stage. The report's table
//! and the input recommendations' "fix this stage first" come from here.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::code::{Region, Rules};
use super::Names;
use crate::session::Frame;
use crate::timeline::{OffKind, Timeline};

/// Functions listed per stage.
const TOP_FUNCTIONS: usize = 3;

/// One stage: CPU time from samples (or, for `read`, time blocked on
/// files).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Stage {
    /// `read`, or an input region's name (`input.decode`, ...).
    pub stage: String,
    pub ns: u64,
    /// Its share of all the stages' time, percent.
    pub pct: f64,
    /// The functions that took most of it: the innermost Python function
    /// of each sample (its native one where the stack has none).
    pub functions: Vec<StageFunction>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StageFunction {
    pub function: String,
    pub ns: u64,
}

/// The stages, slowest first.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct InputStages {
    /// Threads that ran input code.
    pub threads: usize,
    pub stages: Vec<Stage>,
}

impl Stage {
    /// Its top functions, each with its time, as the text formats say them.
    pub fn functions_said(&self) -> Vec<String> {
        self.functions
            .iter()
            .map(|f| format!("{} {}", f.function, crate::units::duration(f.ns)))
            .collect()
    }
}

impl InputStages {
    /// The slowest stage, when there is one.
    pub fn slowest(&self) -> Option<&Stage> {
        self.stages.first()
    }
}

/// The input pipeline by stage, or None where no sample was in input code.
pub fn of(tl: &Timeline, names: &Names, rules: &Rules, sample_hz: u64) -> Option<InputStages> {
    let period_ns = 1_000_000_000 / sample_hz.max(1);
    let mut by_stage: BTreeMap<String, (u64, HashMap<String, u64>)> = BTreeMap::new();
    let mut threads = 0;
    let mut read_ns = 0;
    for t in tl.all_threads() {
        let mut ran_input = false;
        for (&(u, _), &n) in &t.samples {
            let Some(frames) = names.frames(u) else {
                continue;
            };
            let Some(region) = rules.stack(frames).filter(|r| r.is_input()) else {
                continue;
            };
            ran_input = true;
            let ns = n * period_ns;
            let entry = by_stage.entry(region.name().to_string()).or_default();
            entry.0 += ns;
            if let Some(f) = function(frames) {
                *entry.1.entry(f).or_default() += ns;
            }
        }
        if ran_input {
            threads += 1;
            read_ns += t.off.get(&OffKind::File).copied().unwrap_or(0);
        }
    }
    if threads == 0 {
        return None;
    }
    if read_ns > 0 {
        by_stage.insert("read".into(), (read_ns, HashMap::new()));
    }
    let total: u64 = by_stage.values().map(|x| x.0).sum::<u64>().max(1);
    let mut stages: Vec<Stage> = by_stage
        .into_iter()
        .map(|(stage, (ns, functions))| {
            let mut functions: Vec<StageFunction> = functions
                .into_iter()
                .map(|(function, ns)| StageFunction { function, ns })
                .collect();
            functions.sort_by(|a, b| b.ns.cmp(&a.ns).then_with(|| a.function.cmp(&b.function)));
            functions.truncate(TOP_FUNCTIONS);
            Stage {
                stage,
                ns,
                pct: (ns as f64 * 1000.0 / total as f64).round() / 10.0,
                functions,
            }
        })
        .collect();
    stages.sort_by(|a, b| b.ns.cmp(&a.ns).then_with(|| a.stage.cmp(&b.stage)));
    Some(InputStages { threads, stages })
}

/// A sample's function as a reader knows it: its innermost Python frame,
/// `qualname (file)`, else its innermost named native frame, `symbol (lib)`.
fn function(frames: &[Frame]) -> Option<String> {
    let base = |path: &str| path.rsplit('/').next().unwrap_or(path).to_string();
    if let Some((qualname, file)) = frames.iter().find_map(super::code::python) {
        return Some(format!("{qualname} ({})", base(file)));
    }
    frames
        .iter()
        .find(|f| {
            !f.function.is_empty() && !f.function.starts_with("0x") && !f.function.starts_with('[')
        })
        .map(|f| format!("{} ({})", f.function, base(&f.module)))
}

/// What usually fixes a stage, for the recommendation that names it.
pub fn fixes(stage: &str) -> &'static str {
    match Region::parse(stage) {
        None => "cache the data on local NVMe or in page cache, read fewer larger files (shards: WebDataset, TFRecord), and prefetch more (prefetch_factor)",
        Some(Region::Decode) => "decode on the GPU (torchvision.io.decode_jpeg on cuda, DALI, nvImageCodec), store images pre-decoded or at the training resolution, or use a faster decoder (pillow-simd, libjpeg-turbo)",
        Some(Region::Transform) => "run the augmentation on the GPU on whole batches (torchvision.transforms.v2 on cuda tensors, DALI, Kornia) and precompute the deterministic transforms offline",
        Some(Region::Collate) => "collate fewer, larger tensors (return arrays, not lists of small tensors), or batch in the dataset (__getitems__ or a BatchSampler with batch_size=None)",
        Some(Region::Handover) => "hand over less: return tensors, not Python objects to pickle, keep persistent_workers=True, and set pin_memory=True",
        Some(Region::Pin) => "pin in the workers (return pinned tensors) or use fewer, larger batches; copy with non_blocking=True",
        Some(Region::Fetch) => "make __getitem__ cheaper: fetch whole batches at once (__getitems__), vectorise per-sample Python, and cache what does not change between epochs",
        Some(_) => "spread it over more workers (num_workers) or preprocess offline",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, module: &str) -> Frame {
        Frame {
            function: function.into(),
            module: module.into(),
        }
    }

    #[test]
    fn a_samples_function_is_its_innermost_python_frame_else_its_native_one() {
        let py = frame(
            "py::ImageFile.load:/usr/lib/python3/PIL/ImageFile.py",
            "/usr/lib/python3/PIL/ImageFile.py",
        );
        let native = frame("inflate_fast", "/usr/lib/x86_64-linux-gnu/libz.so.1");
        assert_eq!(
            function(&[native.clone(), py]).as_deref(),
            Some("ImageFile.load (ImageFile.py)")
        );
        assert_eq!(
            function(&[native]).as_deref(),
            Some("inflate_fast (libz.so.1)")
        );
        assert_eq!(function(&[]), None);
        assert_eq!(function(&[frame("[unknown]", "")]), None);
    }

    #[test]
    fn every_stage_has_its_fixes() {
        for r in Region::ALL.iter().filter(|r| r.is_input()) {
            assert!(!fixes(r.name()).is_empty());
        }
        assert!(fixes("read").contains("local NVMe"));
    }
}
