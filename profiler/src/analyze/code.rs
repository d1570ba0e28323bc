//! Which code a thread was running, named from a stack: the regions of a
//! training job that the attribution and the input pipeline's stages tell
//! apart — loading (the DataLoader's iterator, fetching, decoding,
//! transforming, collating, receiving a batch from workers, pinning it),
//! the model (forward, backward, the optimizer), collectives,
//! checkpointing and logging.
//!
//! A region comes from a stack's Python frames where it has them (the
//! unwinder's `py::qualname:file`) and otherwise from its native frames:
//! the library a frame is in (libpng, zlib, PIL's `_imaging`…) or its
//! symbol (`c10d::`, `torch::autograd::Engine`). One table, [`BUILTIN`];
//! users add their own rules ([`Rules::add`]: "this function is input").
//!
//! Regions nest: a stack is read from its outermost frame in, and a frame
//! of a more specific region refines what the frames outside it said
//! (the iterator < fetching < decoding; a transform stays a transform
//! through the PIL calls it makes; `torch.save` stays checkpointing through
//! the zlib it calls; whatever a module runs as it is imported is
//! importing). Of two regions equally specific, the outer one stands.

use std::collections::HashMap;

use serde::Serialize;

use crate::session::Frame;

/// A region of a training job's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Region {
    /// The DataLoader's iterator and a worker's loop, outside any stage
    /// below.
    #[serde(rename = "input.loader")]
    Loader,
    /// Getting samples: the fetchers and the dataset's `__getitem__`.
    #[serde(rename = "input.fetch")]
    Fetch,
    /// Decoding and decompressing: image, audio and video decoders, zlib.
    #[serde(rename = "input.decode")]
    Decode,
    /// Transforms and augmentation, tokenizers.
    #[serde(rename = "input.transform")]
    Transform,
    /// Putting samples together into a batch.
    #[serde(rename = "input.collate")]
    Collate,
    /// A batch passed from the workers to the trainer: a worker pickling
    /// and sending it, the trainer taking it from the queue, unpickling it
    /// and rebuilding its tensors from shared memory.
    #[serde(rename = "input.handover")]
    Handover,
    /// The pin-memory thread.
    #[serde(rename = "input.pin")]
    Pin,
    #[serde(rename = "model.forward")]
    Forward,
    #[serde(rename = "model.backward")]
    Backward,
    #[serde(rename = "model.optimizer")]
    Optimizer,
    /// torch.distributed: collectives, barriers, the process group.
    #[serde(rename = "collective")]
    Collective,
    /// torch.save and torch.load.
    #[serde(rename = "checkpoint")]
    Checkpoint,
    /// logging, TensorBoard, Weights & Biases.
    #[serde(rename = "logging")]
    Logging,
    /// Importing modules (start-up): whatever a module runs as it is
    /// imported is not that region's work.
    #[serde(rename = "import")]
    Import,
    /// A server's request loop: accepting connections and reading requests
    /// (socketserver, http.server, the ASGI/WSGI and RPC servers). Blocked
    /// there, a server is waiting for work to be offered.
    #[serde(rename = "serve")]
    Serve,
}

impl Region {
    pub const ALL: [Region; 15] = [
        Region::Loader,
        Region::Fetch,
        Region::Decode,
        Region::Transform,
        Region::Collate,
        Region::Handover,
        Region::Pin,
        Region::Forward,
        Region::Backward,
        Region::Optimizer,
        Region::Collective,
        Region::Checkpoint,
        Region::Logging,
        Region::Import,
        Region::Serve,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Region::Loader => "input.loader",
            Region::Fetch => "input.fetch",
            Region::Decode => "input.decode",
            Region::Transform => "input.transform",
            Region::Collate => "input.collate",
            Region::Handover => "input.handover",
            Region::Pin => "input.pin",
            Region::Forward => "model.forward",
            Region::Backward => "model.backward",
            Region::Optimizer => "model.optimizer",
            Region::Collective => "collective",
            Region::Checkpoint => "checkpoint",
            Region::Logging => "logging",
            Region::Import => "import",
            Region::Serve => "serve",
        }
    }

    pub fn parse(name: &str) -> Option<Region> {
        Region::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Whether it is loading input.
    pub fn is_input(self) -> bool {
        self.name().starts_with("input.")
    }

    /// How specific it is: a frame of a more specific region refines what
    /// the frames outside it said.
    fn rank(self) -> u8 {
        match self {
            // Everything a request handler does is inside the server's
            // loop: any region of it is more specific.
            Region::Serve => 0,
            Region::Loader => 1,
            Region::Fetch | Region::Forward | Region::Backward | Region::Optimizer => 2,
            Region::Decode | Region::Transform | Region::Collate => 3,
            Region::Handover
            | Region::Pin
            | Region::Collective
            | Region::Checkpoint
            | Region::Logging => 4,
            Region::Import => 5,
        }
    }
}

/// What a rule looks at in a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    /// A Python function's qualified name (`Dataset.__getitem__`).
    Py,
    /// A Python function's file.
    PyFile,
    /// A native frame's library: its file name (`libpng16.so.16`).
    Lib,
    /// A native frame's symbol.
    Sym,
    /// A profiler op's name, as a trace records it (`Optimizer.step#SGD.step`,
    /// a `record_function` range): an imported trace's code context.
    Op,
}

/// One rule: frames whose `field` matches `glob` are in `region`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    region: Region,
    field: Field,
    /// `*` at its start, its end, or both: ends with, starts with,
    /// contains; otherwise equal.
    glob: String,
}

/// The built-in rules, as `REGION=FIELD:GLOB` (the form `--code` takes).
pub const BUILTIN: &[&str] = &[
    // torch.utils.data: the iterator, receiving from workers, pinning.
    "input.loader=py:_BaseDataLoaderIter.__next__",
    "input.loader=py:_SingleProcessDataLoaderIter._next_data",
    "input.loader=py:_MultiProcessingDataLoaderIter._next_data",
    "input.loader=py:_worker_loop",
    "input.handover=py:_MultiProcessingDataLoaderIter._get_data",
    "input.handover=py:_MultiProcessingDataLoaderIter._try_get_data",
    "input.handover=pyfile:*torch/multiprocessing/reductions.py",
    "input.handover=pyfile:*/multiprocessing/queues.py",
    // A batch's shared memory let go (the trainer's previous batch, freed
    // as the next one arrives).
    "input.handover=sym:at::MapAllocator::*",
    "input.handover=sym:at::RefcountedMapAllocator::*",
    "input.pin=pyfile:*torch/utils/data/_utils/pin_memory.py",
    "input.fetch=pyfile:*torch/utils/data/_utils/fetch.py",
    "input.collate=pyfile:*torch/utils/data/_utils/collate.py",
    "input.collate=py:*collate*",
    // Transforms and tokenizers.
    "input.transform=pyfile:*torchvision/transforms/*",
    "input.transform=pyfile:*albumentations/*",
    "input.transform=pyfile:*transformers/tokenization*",
    "input.transform=lib:*tokenizers*",
    "input.transform=sym:tokenizers::*",
    // Decoders and decompression.
    "input.decode=pyfile:*/PIL/*",
    "input.decode=pyfile:*torchvision/io/*",
    "input.decode=pyfile:*torchaudio/*",
    "input.decode=pyfile:*/soundfile.py",
    "input.decode=pyfile:*/decord/*",
    "input.decode=lib:_imaging.*",
    "input.decode=lib:libjpeg*",
    "input.decode=lib:libturbojpeg*",
    "input.decode=lib:libpng*",
    "input.decode=lib:libz.so*",
    "input.decode=lib:libz-*",
    "input.decode=lib:libwebp*",
    "input.decode=lib:libtiff*",
    "input.decode=lib:libopenjp2*",
    "input.decode=lib:libav*",
    "input.decode=lib:libswscale*",
    "input.decode=lib:libswresample*",
    "input.decode=lib:libopencv_imgcodecs*",
    "input.decode=lib:libsndfile*",
    "input.decode=lib:libFLAC*",
    "input.decode=lib:libvorbis*",
    "input.decode=lib:libmpg123*",
    "input.decode=sym:inflate*",
    "input.decode=sym:Imaging*",
    "input.decode=sym:jpeg_*",
    "input.decode=sym:png_*",
    // The model.
    "model.forward=py:Module._call_impl",
    "model.forward=py:Module._wrapped_call_impl",
    "model.backward=pyfile:*torch/autograd/*",
    "model.backward=py:Tensor.backward",
    "model.backward=sym:torch::autograd::Engine::*",
    "model.optimizer=pyfile:*torch/optim/*",
    // Everything else a step does.
    "collective=pyfile:*torch/distributed/*",
    "collective=sym:c10d::*",
    "collective=lib:libnccl*",
    "checkpoint=pyfile:*torch/serialization.py",
    "logging=pyfile:*/logging/__init__.py",
    "logging=pyfile:*torch/utils/tensorboard/*",
    "logging=pyfile:*/wandb/*",
    // Start-up.
    "import=pyfile:<frozen importlib._bootstrap*",
    // Servers' request loops: accepting and reading requests.
    "serve=pyfile:*/socketserver.py",
    "serve=pyfile:*/http/server.py",
    "serve=pyfile:*/wsgiref/*",
    "serve=pyfile:*/werkzeug/serving.py",
    "serve=pyfile:*/uvicorn/*",
    "serve=pyfile:*/gunicorn/*",
    "serve=pyfile:*/hypercorn/*",
    "serve=pyfile:*/tornado/*",
    "serve=pyfile:*/aiohttp/web*",
    "serve=pyfile:*/grpc/_server.py",
    "serve=py:socket.accept",
    // The ops torch's profiler writes around regions of a step, for traces
    // (which have ops, not stacks): the DataLoader's iterator, the
    // optimizer's step and zero_grad, the backward pass's autograd nodes,
    // collectives, and the `## forward ##` style ranges of torch's own
    // profiling recipes.
    "input.loader=op:enumerate(DataLoader)#*",
    "model.optimizer=op:Optimizer.step#*",
    "model.optimizer=op:Optimizer.zero_grad#*",
    "model.optimizer=op:## optimizer ##",
    "model.forward=op:## forward ##",
    "model.backward=op:## backward ##",
    "model.backward=op:autograd::engine::evaluate_function: *",
    "collective=op:nccl:*",
    "collective=op:gloo:*",
    "collective=op:c10d::*",
    "collective=op:record_param_comms",
];

impl Rule {
    /// `REGION=FIELD:GLOB`, FIELD one of py, pyfile, lib, sym, op.
    pub fn parse(spec: &str) -> Result<Rule, String> {
        let bad = |why: &str| {
            format!("code rule '{spec}': {why} (want REGION=py|pyfile|lib|sym|op:GLOB)")
        };
        let (region, rest) = spec.split_once('=').ok_or_else(|| bad("no '='"))?;
        let region = Region::parse(region.trim()).ok_or_else(|| {
            let all: Vec<&str> = Region::ALL.iter().map(|r| r.name()).collect();
            bad(&format!("no region '{region}' (one of {})", all.join(", ")))
        })?;
        let (field, glob) = rest.split_once(':').ok_or_else(|| bad("no ':'"))?;
        let field = match field.trim() {
            "py" => Field::Py,
            "pyfile" => Field::PyFile,
            "lib" => Field::Lib,
            "sym" => Field::Sym,
            "op" => Field::Op,
            other => return Err(bad(&format!("no field '{other}'"))),
        };
        let glob = glob.trim();
        if glob.trim_matches('*').is_empty() || glob.trim_matches('*').contains('*') {
            return Err(bad("a glob has text, with '*' only at its ends"));
        }
        Ok(Rule {
            region,
            field,
            glob: glob.to_string(),
        })
    }

    fn matches(&self, text: &str) -> bool {
        let g = self.glob.as_str();
        match (g.strip_prefix('*'), g.strip_suffix('*')) {
            (Some(_), Some(_)) => text.contains(&g[1..g.len() - 1]),
            (Some(end), None) => text.ends_with(end),
            (None, Some(start)) => text.starts_with(start),
            (None, None) => text == g,
        }
    }
}

/// A frame as the rules see it.
enum Seen<'a> {
    Python { qualname: &'a str, file: &'a str },
    Native { lib: &'a str, symbol: &'a str },
}

fn seen(f: &Frame) -> Seen<'_> {
    match python(f) {
        Some((qualname, file)) => Seen::Python { qualname, file },
        None => Seen::Native {
            lib: f.module.rsplit('/').next().unwrap_or(""),
            symbol: &f.function,
        },
    }
}

/// A Python frame's qualified name and file (`py::QUALNAME:FILE`, as the
/// symbolizer names them); None for a native frame.
pub fn python(f: &Frame) -> Option<(&str, &str)> {
    let rest = f.function.strip_prefix("py::")?;
    let qualname = rest
        .strip_suffix(f.module.as_str())
        .and_then(|q| q.strip_suffix(':'))
        .unwrap_or(rest);
    Some((qualname, &f.module))
}

/// The rules a report reads stacks with: the built-in ones and the user's.
#[derive(Clone, Debug)]
pub struct Rules {
    /// The user's rules first, in the order given, then the built-in ones.
    rules: Vec<Rule>,
    users: usize,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            rules: BUILTIN
                .iter()
                .map(|s| Rule::parse(s).expect("built-in rules parse"))
                .collect(),
            users: 0,
        }
    }
}

impl Rules {
    /// Adds a rule of the user's: it is tried after those added before it
    /// and before the built-in ones.
    pub fn add(&mut self, spec: &str) -> Result<(), String> {
        self.rules.insert(self.users, Rule::parse(spec)?);
        self.users += 1;
        Ok(())
    }

    /// The region of one frame, by the first rule it matches.
    pub fn frame(&self, f: &Frame) -> Option<Region> {
        let s = seen(f);
        self.rules
            .iter()
            .find(|r| match (&s, r.field) {
                (Seen::Python { qualname, .. }, Field::Py) => r.matches(qualname),
                (Seen::Python { file, .. }, Field::PyFile) => r.matches(file),
                (Seen::Native { lib, .. }, Field::Lib) => r.matches(lib),
                (Seen::Native { symbol, .. }, Field::Sym) => r.matches(symbol),
                _ => false,
            })
            .map(|r| r.region)
    }

    /// The region of a profiler op, by the first `op:` rule its name
    /// matches.
    pub fn op(&self, name: &str) -> Option<Region> {
        self.rules
            .iter()
            .find(|r| r.field == Field::Op && r.matches(name))
            .map(|r| r.region)
    }

    /// The region of a stack, innermost frame first (as stacks are kept):
    /// read from the outermost frame in, each frame of a more specific
    /// region refining what the frames outside it said.
    pub fn stack(&self, frames: &[Frame]) -> Option<Region> {
        let mut region: Option<Region> = None;
        for f in frames.iter().rev() {
            if let Some(r) = self.frame(f) {
                if region.is_none_or(|outer| r.rank() > outer.rank()) {
                    region = Some(r);
                }
            }
        }
        region
    }
}

/// What a thread was running, as its samples say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Code of a region.
    In(Region),
    /// The job's own Python code, in no region: stacks with Python frames
    /// none of which a rule names (the training loop's own work). A stack
    /// with native frames only says nothing of the kind — the interpreter
    /// runs every Python function through the same few of them.
    Own,
}

impl Code {
    pub fn is_input(self) -> bool {
        matches!(self, Code::In(r) if r.is_input())
    }
}

/// Each user stack's code, for the attribution to ask what code a thread
/// ran in a stretch of time: known before the events are replayed (a
/// session's symbols come first).
#[derive(Clone, Debug, Default)]
pub struct CodeOf {
    codes: HashMap<u64, Code>,
    /// How far from a stretch a sample still speaks for it: half the
    /// cpu-clock period.
    reach_ns: u64,
    /// The rules, for what has no stack: a trace's ops.
    rules: Rules,
}

impl CodeOf {
    pub fn new(symbols: &HashMap<u64, Vec<Frame>>, rules: &Rules, sample_hz: u64) -> CodeOf {
        CodeOf {
            codes: symbols
                .iter()
                .filter_map(|(&hash, frames)| {
                    let code = match rules.stack(frames) {
                        Some(r) => Code::In(r),
                        None if frames.iter().any(|f| python(f).is_some()) => Code::Own,
                        None => return None,
                    };
                    Some((hash, code))
                })
                .collect(),
            reach_ns: 500_000_000 / sample_hz.max(1),
            rules: rules.clone(),
        }
    }

    /// The code of one user stack, by its hash: where a thread blocked.
    pub fn of_stack(&self, ustack: u64) -> Option<Code> {
        self.codes.get(&ustack).copied()
    }

    /// The region of a trace's op ([`Rules::op`]).
    pub fn op(&self, name: &str) -> Option<Region> {
        self.rules.op(name)
    }

    /// How far past a stretch a sample may still speak for it.
    pub fn reach_ns(&self) -> u64 {
        self.reach_ns
    }

    /// The code a thread's samples (time, user stack, kernel stack; in
    /// time order) found it in during `[s, e)`: the most frequent among
    /// those inside; with none inside (a stretch shorter than the sampling
    /// period), the nearest within half a period. None where no sample
    /// speaks for the stretch, or the one that does says nothing (native
    /// frames in no region).
    pub fn during(&self, samples: &[(u64, u64, u64)], s: u64, e: u64) -> Option<Code> {
        let lo = samples.partition_point(|x| x.0 < s);
        let hi = samples.partition_point(|x| x.0 < e);
        if lo < hi {
            let mut counts: Vec<(Option<Code>, u32)> = Vec::new();
            for &(_, u, _) in &samples[lo..hi] {
                let c = self.codes.get(&u).copied();
                match counts.iter_mut().find(|x| x.0 == c) {
                    Some(x) => x.1 += 1,
                    None => counts.push((c, 1)),
                }
            }
            // Ties go to the earliest seen.
            let best = counts.iter().map(|c| c.1).max()?;
            return counts.iter().find(|c| c.1 == best)?.0;
        }
        let before = lo
            .checked_sub(1)
            .map(|i| samples[i])
            .filter(|x| s - x.0 <= self.reach_ns);
        let after = samples
            .get(hi)
            .filter(|x| x.0 - e <= self.reach_ns)
            .copied();
        let nearest = match (before, after) {
            (Some(b), Some(a)) => Some(if s - b.0 <= a.0 - e { b } else { a }),
            (b, a) => b.or(a),
        }?;
        self.codes.get(&nearest.1).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(qualname: &str, file: &str) -> Frame {
        Frame {
            function: format!("py::{qualname}:{file}"),
            module: file.into(),
        }
    }

    fn native(symbol: &str, lib: &str) -> Frame {
        Frame {
            function: symbol.into(),
            module: lib.into(),
        }
    }

    const TORCH: &str = "/venv/lib/python3.11/site-packages/torch";

    /// Outermost first, as a flamegraph reads; the rules take innermost
    /// first.
    fn region(outer_first: &[Frame]) -> Option<Region> {
        let mut frames = outer_first.to_vec();
        frames.reverse();
        Rules::default().stack(&frames)
    }

    fn next_data() -> Vec<Frame> {
        vec![
            py("<module>", "/job/train.py"),
            py("train", "/job/train.py"),
            py(
                "_BaseDataLoaderIter.__next__",
                &format!("{TORCH}/utils/data/dataloader.py"),
            ),
            py(
                "_SingleProcessDataLoaderIter._next_data",
                &format!("{TORCH}/utils/data/dataloader.py"),
            ),
            py(
                "_MapDatasetFetcher.fetch",
                &format!("{TORCH}/utils/data/_utils/fetch.py"),
            ),
        ]
    }

    #[test]
    fn inline_loading_is_told_by_stage() {
        let mut decode = next_data();
        decode.extend([
            py("PngDataset.__getitem__", "/job/train.py"),
            py(
                "Image.convert",
                "/venv/lib/python3.11/site-packages/PIL/Image.py",
            ),
            py(
                "ImageFile.load",
                "/venv/lib/python3.11/site-packages/PIL/ImageFile.py",
            ),
            native(
                "ImagingZipDecode",
                "/venv/lib/python3.11/site-packages/PIL/_imaging.cpython-311-x86_64-linux-gnu.so",
            ),
            native("inflate", "/usr/lib/x86_64-linux-gnu/libz.so.1.2.13"),
        ]);
        assert_eq!(region(&decode), Some(Region::Decode));

        let mut transform = next_data();
        transform.extend([
            py("PngDataset.__getitem__", "/job/train.py"),
            py(
                "Compose.__call__",
                "/venv/lib/python3.11/site-packages/torchvision/transforms/transforms.py",
            ),
            py(
                "Image.resize",
                "/venv/lib/python3.11/site-packages/PIL/Image.py",
            ),
        ]);
        assert_eq!(
            region(&transform),
            Some(Region::Transform),
            "PIL inside a transform"
        );

        let mut collate = next_data();
        collate.extend([
            py(
                "default_collate",
                &format!("{TORCH}/utils/data/_utils/collate.py"),
            ),
            py("collate", &format!("{TORCH}/utils/data/_utils/collate.py")),
            native("at::native::stack", &format!("{TORCH}/lib/libtorch_cpu.so")),
        ]);
        assert_eq!(region(&collate), Some(Region::Collate));

        let mut fetch = next_data();
        fetch.push(py("PngDataset.__getitem__", "/job/train.py"));
        assert_eq!(region(&fetch), Some(Region::Fetch));
        assert_eq!(region(&next_data()[..4]), Some(Region::Loader));
    }

    #[test]
    fn the_trainers_own_work_is_not_input() {
        let dl = format!("{TORCH}/utils/data/dataloader.py");
        // Receiving a batch from workers, down to unpickling.
        let receive = [
            py("train", "/job/train.py"),
            py("_BaseDataLoaderIter.__next__", &dl),
            py("_MultiProcessingDataLoaderIter._next_data", &dl),
            py("_MultiProcessingDataLoaderIter._get_data", &dl),
            py("_MultiProcessingDataLoaderIter._try_get_data", &dl),
            py("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py"),
            native("load", "/usr/lib/python3.11/lib-dynload/_pickle.so"),
        ];
        assert_eq!(region(&receive), Some(Region::Handover));
        // After the batch arrived: the model, and the host's own work.
        let forward = [
            py("train", "/job/train.py"),
            py(
                "Module._wrapped_call_impl",
                &format!("{TORCH}/nn/modules/module.py"),
            ),
            py(
                "Module._call_impl",
                &format!("{TORCH}/nn/modules/module.py"),
            ),
            py("Net.forward", "/job/train.py"),
        ];
        assert_eq!(region(&forward), Some(Region::Forward));
        let host = [
            py("train", "/job/train.py"),
            py("augment_metrics", "/job/train.py"),
        ];
        assert_eq!(region(&host), None);
        // torch.save compresses with zlib: checkpointing, not decoding.
        let save = [
            py("train", "/job/train.py"),
            py("save", &format!("{TORCH}/serialization.py")),
            native("deflate", "/usr/lib/x86_64-linux-gnu/libz.so.1"),
            native("inflate_fast", "/usr/lib/x86_64-linux-gnu/libz.so.1"),
        ];
        assert_eq!(region(&save), Some(Region::Checkpoint));
        // A collective in a backward hook.
        let allreduce = [
            py("train", "/job/train.py"),
            py("Tensor.backward", &format!("{TORCH}/_tensor.py")),
            native(
                "torch::autograd::Engine::thread_main",
                &format!("{TORCH}/lib/libtorch_cpu.so"),
            ),
            native(
                "c10d::Reducer::autograd_hook",
                &format!("{TORCH}/lib/libtorch_cpu.so"),
            ),
        ];
        assert_eq!(region(&allreduce), Some(Region::Collective));
    }

    #[test]
    fn importing_a_module_is_start_up_whatever_it_runs() {
        let import = [
            py("<module>", "/job/train.py"),
            py("_find_and_load", "<frozen importlib._bootstrap>"),
            py("_call_with_frames_removed", "<frozen importlib._bootstrap>"),
            py("<module>", &format!("{TORCH}/distributed/__init__.py")),
        ];
        assert_eq!(region(&import), Some(Region::Import));
    }

    #[test]
    fn native_frames_alone_name_the_decoders() {
        // An interpreter the unwinder cannot walk: only native frames.
        let png = [
            native("_PyEval_EvalFrameDefault", "/usr/lib/libpython3.11.so"),
            native(
                "_imaging_decode",
                "/site-packages/PIL/_imaging.cpython-311-x86_64-linux-gnu.so",
            ),
            native(
                "png_read_row",
                "/usr/lib/x86_64-linux-gnu/libpng16.so.16.39.0",
            ),
        ];
        assert_eq!(region(&png), Some(Region::Decode));
        let jpeg = [native(
            "decompress_onepass",
            "/site-packages/pillow.libs/libjpeg-45e70d75.so.62.4.0",
        )];
        assert_eq!(region(&jpeg), Some(Region::Decode));
        let eval = [native(
            "_PyEval_EvalFrameDefault",
            "/usr/lib/libpython3.11.so",
        )];
        assert_eq!(region(&eval), None);
    }

    #[test]
    fn users_rules_come_first_in_the_order_given() {
        let mut rules = Rules::default();
        rules.add("input.decode=py:*.load_sample").unwrap();
        let mine = [
            py("train", "/job/train.py"),
            py("MyReader.load_sample", "/job/reader.py"),
        ];
        let mut frames = mine.to_vec();
        frames.reverse();
        assert_eq!(rules.stack(&frames), Some(Region::Decode));
        // A rule of the user's wins over a built-in one for the same frame.
        rules.add("logging=lib:libz.so*").unwrap();
        let z = native("inflate", "/usr/lib/x86_64-linux-gnu/libz.so.1");
        assert_eq!(rules.frame(&z), Some(Region::Logging));
        // Of the user's rules, the one given first.
        rules.add("checkpoint=lib:libz.so.1").unwrap();
        assert_eq!(rules.frame(&z), Some(Region::Logging));

        for bad in [
            "decode=py:x",
            "input.decode:py:x",
            "input.decode=file:x",
            "input.decode=py:*",
            "input.decode=py:a*b",
        ] {
            let e = Rule::parse(bad).unwrap_err();
            assert!(e.starts_with(&format!("code rule '{bad}'")), "{e}");
        }
    }

    /// A stretch of time is named by its samples: the most frequent region
    /// inside it; with none inside, the nearest sample within half a period
    /// (5 ms at 100 Hz), never one further.
    #[test]
    fn a_stretch_is_named_by_the_samples_that_speak_for_it() {
        let symbols: HashMap<u64, Vec<Frame>> = [
            (1, vec![native("png_read_row", "/usr/lib/libpng16.so.16")]),
            (
                2,
                vec![py("Module._call_impl", "/venv/torch/nn/modules/module.py")],
            ),
            (3, vec![native("main", "/usr/bin/python3")]),
            (
                4,
                vec![
                    native("_PyEval_EvalFrameDefault", "/usr/bin/python3"),
                    py("train_step", "/work/train.py"),
                ],
            ),
        ]
        .into();
        let code = CodeOf::new(&symbols, &Rules::default(), 100);
        const MS: u64 = 1_000_000;
        let samples = [
            (10 * MS, 2, 0),
            (20 * MS, 1, 0),
            (30 * MS, 1, 0),
            (40 * MS, 2, 0),
            (100 * MS, 3, 0),
            (200 * MS, 4, 0),
        ];
        let decode = Some(Code::In(Region::Decode));
        let forward = Some(Code::In(Region::Forward));
        assert_eq!(code.during(&samples, 15 * MS, 45 * MS), decode);
        // One each: the earlier stands.
        assert_eq!(code.during(&samples, 5 * MS, 25 * MS), forward);
        // None inside: the nearest, within 5 ms.
        assert_eq!(code.during(&samples, 41 * MS, 42 * MS), forward);
        assert_eq!(code.during(&samples, 24 * MS, 26 * MS), decode);
        assert_eq!(code.during(&samples, 26 * MS, 27 * MS), decode);
        assert_eq!(code.during(&samples, 50 * MS, 90 * MS), None);
        // A native sample in no region says nothing of its stretch.
        assert_eq!(code.during(&samples, 95 * MS, 105 * MS), None);
        // Python code no rule names is the job's own.
        assert_eq!(code.during(&samples, 195 * MS, 205 * MS), Some(Code::Own));
        assert_eq!(code.during(&[], 0, 100 * MS), None);
    }

    #[test]
    fn the_report_schema_lists_every_region() {
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../../docs/report.schema.json")).unwrap();
        let listed: Vec<&str> = schema["$defs"]["CodeRegion"]["properties"]["region"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let ours: Vec<&str> = Region::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(listed, ours);
        for r in Region::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
        }
    }

    #[test]
    fn every_built_in_rule_parses_and_names_a_region() {
        let rules = Rules::default();
        assert_eq!(rules.rules.len(), BUILTIN.len());
        for r in Region::ALL {
            assert_eq!(Region::parse(r.name()), Some(r));
        }
        assert!(Region::Collate.is_input() && !Region::Forward.is_input());
    }
}
