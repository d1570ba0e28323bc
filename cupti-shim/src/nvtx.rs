//! NVTX ranges, recorded by the shim itself through NVTX's own injection
//! interface, the way Nsight Systems does it.
//!
//! nvtx3 is header-only: every client (PyTorch, Megatron, Python's `nvtx`,
//! C code) carries its own copy, which on first use dlopens the library that
//! `NVTX_INJECTION64_PATH` names and calls its `InitializeInjectionNvtx2`.
//! We then write our handlers into the client's function-pointer slots.
//!
//! Why not hand NVTX to CUPTI (which also exports that entry point): CUPTI
//! would then take the process's single callback-subscriber slot, and
//! torch.profiler fails with MULTIPLE_SUBSCRIBERS.
//!
//! The ABI below is nvtx3's (NVTX_VERSION 3), from the headers of the
//! nvidia-nvtx-cu12 12.9.79 wheel, vendored in tests/nvtx/include:
//! `nvtxDetail/nvtxTypes.h` (export table, module and callback ids),
//! `nvtxDetail/nvtxImpl.h` (how GetModuleFunctionTable hands out its tables),
//! `nvToolsExt.h` (`nvtxEventAttributes_t`, return values).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::mem::{offset_of, size_of};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use crate::clock::monotonic_ns;
use crate::record::GpuRecord;

// ---------------------------------------------------------------- the ABI

/// `NVTX_ETID_CALLBACKS`.
const ETID_CALLBACKS: u32 = 1;
/// `NVTX_ETID_VERSIONINFO`.
const ETID_VERSIONINFO: u32 = 3;
/// The NVTX API version we implement, told to the client's library.
const NVTX_VERSION: u32 = 3;

/// `NvtxCallbackModule` (a C enum: passed as int).
const MODULE_CORE: c_int = 1;
const MODULE_CORE2: c_int = 5;

/// `NvtxCallbackIdCore`: the v1 functions.
mod core {
    pub const MARK_EX: usize = 1;
    pub const MARK_A: usize = 2;
    pub const MARK_W: usize = 3;
    pub const RANGE_START_EX: usize = 4;
    pub const RANGE_START_A: usize = 5;
    pub const RANGE_START_W: usize = 6;
    pub const RANGE_END: usize = 7;
    pub const RANGE_PUSH_EX: usize = 8;
    pub const RANGE_PUSH_A: usize = 9;
    pub const RANGE_PUSH_W: usize = 10;
    pub const RANGE_POP: usize = 11;
}

/// `NvtxCallbackIdCore2`: the domain functions.
mod core2 {
    pub const DOMAIN_MARK_EX: usize = 1;
    pub const DOMAIN_RANGE_START_EX: usize = 2;
    pub const DOMAIN_RANGE_END: usize = 3;
    pub const DOMAIN_RANGE_PUSH_EX: usize = 4;
    pub const DOMAIN_RANGE_POP: usize = 5;
    pub const DOMAIN_REGISTER_STRING_A: usize = 10;
    pub const DOMAIN_REGISTER_STRING_W: usize = 11;
    pub const DOMAIN_CREATE_A: usize = 12;
    pub const DOMAIN_CREATE_W: usize = 13;
}

/// `nvtxMessageType_t`.
const MESSAGE_ASCII: i32 = 1;
const MESSAGE_UNICODE: i32 = 2;
const MESSAGE_REGISTERED: i32 = 3;

/// `NvtxFunctionPointer`: cast back by NVTX to each slot's real type.
type AnyFn = Option<unsafe extern "C" fn()>;
/// An element of an `NvtxFunctionTable`: the address of one of the client
/// library's function-pointer slots.
type Slot = *mut AnyFn;

/// `NvtxGetExportTableFunc_t`.
pub type GetExportTable = Option<unsafe extern "C" fn(u32) -> *const c_void>;

type GetModuleFunctionTable =
    Option<unsafe extern "C" fn(c_int, *mut *mut Slot, *mut c_uint) -> c_int>;

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table: GetModuleFunctionTable,
}

/// `NvtxExportTableVersionInfo`.
#[repr(C)]
struct ExportTableVersionInfo {
    struct_size: usize,
    version: u32,
    reserved0: u32,
    set_injection_nvtx_version: Option<unsafe extern "C" fn(u32)>,
}

/// `nvtxEventAttributes_t` (v2; v1 had the same layout).
#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_void,
}

const _: () = assert!(size_of::<EventAttributes>() == 48);
const _: () = assert!(offset_of!(EventAttributes, message) == 40);
const _: () = assert!(size_of::<libc::wchar_t>() == 4);

/// Opaque handles (`nvtxDomainHandle_t`, `nvtxStringHandle_t`) are our
/// registry indexes plus one: NULL stays "none" (the default domain), and a
/// stale or foreign handle resolves to nothing instead of being dereferenced.
type Handle = *mut c_void;

// ------------------------------------------------------------ entry point

/// Called by the NVTX library compiled into the client, on its first NVTX
/// call, when `NVTX_INJECTION64_PATH` names this library. Every library in
/// the process that carries nvtx3 calls it with its own table, so it may run
/// more than once; all of them share the handlers and the per-thread stacks.
///
/// Returns 0 when the client's tables are not what we know: NVTX then turns
/// every call into a no-op, which is better than writing past a table.
#[no_mangle]
pub extern "C" fn InitializeInjectionNvtx2(get_export_table: GetExportTable) -> c_int {
    guard(0, || {
        // SAFETY: the function and tables are the client's NVTX library's, as
        // nvtxTypes.h describes them; every size is checked before use.
        if !unsafe { install(get_export_table) } {
            return 0;
        }
        start_shim();
        1
    })
}

/// `get_export_table` must be the client library's `nvtxGetExportTable`
/// (or None); its tables must stay where they are (they are the library's
/// globals).
unsafe fn install(get_export_table: GetExportTable) -> bool {
    let Some(get) = get_export_table else {
        return false;
    };
    let callbacks = get(ETID_CALLBACKS) as *const ExportTableCallbacks;
    if callbacks.is_null() || (*callbacks).struct_size < size_of::<ExportTableCallbacks>() {
        return false;
    }
    let Some(get_table) = (*callbacks).get_module_function_table else {
        return false;
    };
    let version = get(ETID_VERSIONINFO) as *const ExportTableVersionInfo;
    if !version.is_null() && (*version).struct_size >= size_of::<ExportTableVersionInfo>() {
        if let Some(set) = (*version).set_injection_nvtx_version {
            set(NVTX_VERSION);
        }
    }

    // Without the v1 push/pop there is nothing worth recording.
    let Some(t) = module_table(get_table, MODULE_CORE, core::RANGE_POP) else {
        return false;
    };
    t.set(core::MARK_EX, mark_ex as *const ());
    t.set(core::MARK_A, mark_a as *const ());
    t.set(core::MARK_W, mark_w as *const ());
    t.set(core::RANGE_START_EX, range_start_ex as *const ());
    t.set(core::RANGE_START_A, range_start_a as *const ());
    t.set(core::RANGE_START_W, range_start_w as *const ());
    t.set(core::RANGE_END, range_end as *const ());
    t.set(core::RANGE_PUSH_EX, range_push_ex as *const ());
    t.set(core::RANGE_PUSH_A, range_push_a as *const ());
    t.set(core::RANGE_PUSH_W, range_push_w as *const ());
    t.set(core::RANGE_POP, range_pop as *const ());
    // Slots left alone (thread/category/resource naming, nvtxInitialize)
    // are set to no-ops by NVTX itself after we return.

    // An NVTX older than domains has no CORE2: the v1 functions still work.
    if let Some(t) = module_table(get_table, MODULE_CORE2, core2::DOMAIN_CREATE_W) {
        t.set(core2::DOMAIN_MARK_EX, domain_mark_ex as *const ());
        t.set(
            core2::DOMAIN_RANGE_START_EX,
            domain_range_start_ex as *const (),
        );
        t.set(core2::DOMAIN_RANGE_END, domain_range_end as *const ());
        t.set(
            core2::DOMAIN_RANGE_PUSH_EX,
            domain_range_push_ex as *const (),
        );
        t.set(core2::DOMAIN_RANGE_POP, domain_range_pop as *const ());
        t.set(
            core2::DOMAIN_REGISTER_STRING_A,
            domain_register_string_a as *const (),
        );
        t.set(
            core2::DOMAIN_REGISTER_STRING_W,
            domain_register_string_w as *const (),
        );
        t.set(core2::DOMAIN_CREATE_A, domain_create_a as *const ());
        t.set(core2::DOMAIN_CREATE_W, domain_create_w as *const ());
    }
    true
}

/// One module's `NvtxFunctionTable`: `slots[id]` is the address of the
/// client's pointer for callback id `id`, valid for `id < len` (NVTX reports
/// the count without its trailing NULL; index 0 is unused).
struct ModuleTable {
    slots: *mut Slot,
    len: usize,
}

/// `get_table` must be the client library's `GetModuleFunctionTable`.
unsafe fn module_table(
    get_table: unsafe extern "C" fn(c_int, *mut *mut Slot, *mut c_uint) -> c_int,
    module: c_int,
    highest_id: usize,
) -> Option<ModuleTable> {
    let mut slots: *mut Slot = ptr::null_mut();
    let mut len: c_uint = 0;
    if get_table(module, &mut slots, &mut len) == 0
        || slots.is_null()
        || (len as usize) <= highest_id
    {
        return None;
    }
    Some(ModuleTable {
        slots,
        len: len as usize,
    })
}

impl ModuleTable {
    /// `handler` must have the C signature NVTX expects for slot `id`.
    unsafe fn set(&self, id: usize, handler: *const ()) {
        if id >= self.len {
            return;
        }
        let slot = *self.slots.add(id);
        if !slot.is_null() {
            *slot = Some(std::mem::transmute::<*const (), unsafe extern "C" fn()>(
                handler,
            ));
        }
    }
}

// ---------------------------------------------------------------- handlers
//
// Each mirrors one `*_impl_fntype` of nvtxTypes.h. NVTX calls them on the
// application's threads, in its hot loops: when nobody records they only
// keep push/pop depths (no clock read, no string, no per-call allocation).

extern "C" fn mark_ex(attr: *const EventAttributes) {
    // SAFETY: NVTX passes the caller's attributes (or NULL) for the call.
    guard((), || mark(DEFAULT_DOMAIN, || unsafe { attr_name(attr) }))
}

extern "C" fn mark_a(message: *const c_char) {
    // SAFETY: NVTX passes the caller's NUL-terminated string (or NULL).
    guard((), || mark(DEFAULT_DOMAIN, || unsafe { ascii(message) }))
}

extern "C" fn mark_w(message: *const libc::wchar_t) {
    // SAFETY: NVTX passes the caller's NUL-terminated string (or NULL).
    guard((), || mark(DEFAULT_DOMAIN, || unsafe { wide(message) }))
}

extern "C" fn range_start_ex(attr: *const EventAttributes) -> u64 {
    // SAFETY: NVTX passes the caller's attributes (or NULL) for the call.
    guard(0, || {
        range_start(DEFAULT_DOMAIN, || unsafe { attr_name(attr) })
    })
}

extern "C" fn range_start_a(message: *const c_char) -> u64 {
    // SAFETY: NVTX passes the caller's NUL-terminated string (or NULL).
    guard(0, || {
        range_start(DEFAULT_DOMAIN, || unsafe { ascii(message) })
    })
}

extern "C" fn range_start_w(message: *const libc::wchar_t) -> u64 {
    // SAFETY: NVTX passes the caller's NUL-terminated string (or NULL).
    guard(0, || {
        range_start(DEFAULT_DOMAIN, || unsafe { wide(message) })
    })
}

extern "C" fn range_end(id: u64) {
    guard((), || range_stop(id))
}

extern "C" fn range_push_ex(attr: *const EventAttributes) -> c_int {
    // SAFETY: NVTX passes the caller's attributes (or NULL) for the call.
    guard(-1, || push(DEFAULT_DOMAIN, || unsafe { attr_name(attr) }))
}

extern "C" fn range_push_a(message: *const c_char) -> c_int {
    // SAFETY: NVTX passes the caller's NUL-terminated string (or NULL).
    guard(-1, || push(DEFAULT_DOMAIN, || unsafe { ascii(message) }))
}

extern "C" fn range_push_w(message: *const libc::wchar_t) -> c_int {
    // SAFETY: NVTX passes the caller's NUL-terminated string (or NULL).
    guard(-1, || push(DEFAULT_DOMAIN, || unsafe { wide(message) }))
}

extern "C" fn range_pop() -> c_int {
    guard(-1, || pop(DEFAULT_DOMAIN))
}

extern "C" fn domain_mark_ex(domain: Handle, attr: *const EventAttributes) {
    // SAFETY: NVTX passes the caller's attributes (or NULL) for the call.
    guard((), || mark(domain.addr(), || unsafe { attr_name(attr) }))
}

extern "C" fn domain_range_start_ex(domain: Handle, attr: *const EventAttributes) -> u64 {
    // SAFETY: NVTX passes the caller's attributes (or NULL) for the call.
    guard(0, || {
        range_start(domain.addr(), || unsafe { attr_name(attr) })
    })
}

/// The domain of the end is ignored: the range belongs to the one it
/// started in.
extern "C" fn domain_range_end(_domain: Handle, id: u64) {
    guard((), || range_stop(id))
}

extern "C" fn domain_range_push_ex(domain: Handle, attr: *const EventAttributes) -> c_int {
    // SAFETY: NVTX passes the caller's attributes (or NULL) for the call.
    guard(-1, || push(domain.addr(), || unsafe { attr_name(attr) }))
}

extern "C" fn domain_range_pop(domain: Handle) -> c_int {
    guard(-1, || pop(domain.addr()))
}

/// Registered strings are kept whether or not anyone records: clients
/// register them once, at start-up, and use the handle for the rest of the
/// run. One table for all domains: a handle is unique on its own.
extern "C" fn domain_register_string_a(_domain: Handle, s: *const c_char) -> Handle {
    // SAFETY: NVTX passes the caller's NUL-terminated string (or NULL).
    guard(ptr::null_mut(), || STRINGS.handle(unsafe { ascii(s) }))
}

extern "C" fn domain_register_string_w(_domain: Handle, s: *const libc::wchar_t) -> Handle {
    // SAFETY: NVTX passes the caller's NUL-terminated string (or NULL).
    guard(ptr::null_mut(), || STRINGS.handle(unsafe { wide(s) }))
}

/// NVTX asks for one handle per name; equal names share one, and domains
/// are never forgotten (nvtxDomainDestroy is left a no-op), so a range still
/// open in a destroyed domain keeps its name.
extern "C" fn domain_create_a(name: *const c_char) -> Handle {
    // SAFETY: NVTX passes the caller's NUL-terminated string (or NULL).
    guard(ptr::null_mut(), || DOMAINS.handle(unsafe { ascii(name) }))
}

extern "C" fn domain_create_w(name: *const libc::wchar_t) -> Handle {
    // SAFETY: NVTX passes the caller's NUL-terminated string (or NULL).
    guard(ptr::null_mut(), || DOMAINS.handle(unsafe { wide(name) }))
}

/// Nothing may unwind into the client's C code; a handler that fails gives
/// NVTX's error value instead.
fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

// ----------------------------------------------------------------- ranges

/// The key of NVTX's default domain (a NULL domain handle); named "".
const DEFAULT_DOMAIN: usize = 0;

/// A push made while recording, not yet popped.
struct Open {
    /// The nesting level NVTX's push returned for it.
    level: c_int,
    start: u64,
    name: String,
}

/// One thread's push/pop state in one domain: NVTX keeps a stack per domain
/// and per thread, and push/pop return levels within it.
struct DomainStack {
    domain: usize,
    depth: c_int,
    /// Pushes made while recording, innermost last. Pushes made before
    /// recording started are only counted in `depth`: their pops (even
    /// during a recording) produce no range, because their start and name
    /// were never kept. A range whose start we did not see is dropped rather
    /// than given a made-up start.
    open: Vec<Open>,
}

thread_local! {
    /// Few domains per thread (usually one or two): a linear search beats
    /// hashing.
    static STACKS: RefCell<Vec<DomainStack>> = const { RefCell::new(Vec::new()) };
}

fn with_stack<T>(domain: usize, f: impl FnOnce(&mut DomainStack) -> T) -> Option<T> {
    STACKS
        .try_with(|stacks| {
            let mut stacks = stacks.try_borrow_mut().ok()?;
            let i = match stacks.iter().position(|s| s.domain == domain) {
                Some(i) => i,
                None => {
                    stacks.push(DomainStack {
                        domain,
                        depth: 0,
                        open: Vec::new(),
                    });
                    stacks.len() - 1
                }
            };
            Some(f(&mut stacks[i]))
        })
        .ok()
        .flatten()
}

/// Returns the 0-based level of the new range, as nvtxRangePush documents.
fn push(domain: usize, name: impl FnOnce() -> String) -> c_int {
    let start = recording().then(monotonic_ns);
    let name = start.map(|_| name());
    with_stack(domain, |s| {
        let level = s.depth;
        s.depth = s.depth.saturating_add(1);
        if let (Some(start), Some(name)) = (start, name) {
            s.open.push(Open { level, start, name });
        }
        level
    })
    .unwrap_or(-1)
}

/// Returns the level of the range it ends (the depth after the pop), or -1
/// for a pop without a push, as nvtxRangePop documents.
fn pop(domain: usize) -> c_int {
    let end = recording().then(monotonic_ns);
    let (level, ended) = with_stack(domain, |s| {
        if s.depth <= 0 {
            return (-1, None);
        }
        s.depth -= 1;
        let ended = match s.open.last() {
            Some(o) if o.level == s.depth => s.open.pop(),
            _ => None,
        };
        (s.depth, ended)
    })
    .unwrap_or((-1, None));
    // A range whose recording stopped before its pop is dropped: the
    // profiler that would have received it is gone.
    if let (Some(o), Some(end)) = (ended, end) {
        emit(GpuRecord::Range {
            start: o.start,
            end,
            tid: gettid(),
            name: o.name,
            domain: DOMAINS.name(domain),
        });
    }
    level
}

/// A range from nvtxRangeStart, until its nvtxRangeEnd (on any thread).
struct Started {
    start: u64,
    /// The starting thread's: ranges are drawn on the thread that opened
    /// them, as Nsight does.
    tid: u32,
    name: String,
    domain: usize,
}

static NEXT_RANGE_ID: AtomicU64 = AtomicU64::new(1);
static STARTED: LazyLock<Mutex<HashMap<u64, Started>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
/// Entries in STARTED, readable without its lock, so an nvtxRangeEnd with
/// nothing open costs one atomic load.
static STARTED_LEN: AtomicUsize = AtomicUsize::new(0);
/// Ranges a client starts and never ends must not grow the process without
/// bound; past this many open ones, new ones are not kept.
const MAX_STARTED: usize = 1 << 16;

/// Returns the range's id (never 0, which NVTX uses for "no range"). Ids are
/// handed out even when not recording; such ranges are simply not kept, so
/// a range started before recording began is dropped at its end.
fn range_start(domain: usize, name: impl FnOnce() -> String) -> u64 {
    let id = NEXT_RANGE_ID.fetch_add(1, Ordering::Relaxed);
    if recording() {
        let started = Started {
            start: monotonic_ns(),
            tid: gettid(),
            name: name(),
            domain,
        };
        let mut map = STARTED.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() < MAX_STARTED {
            map.insert(id, started);
            STARTED_LEN.store(map.len(), Ordering::Relaxed);
        }
    }
    id
}

fn range_stop(id: u64) {
    if STARTED_LEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    let end = monotonic_ns();
    let started = {
        let mut map = STARTED.lock().unwrap_or_else(|e| e.into_inner());
        let s = map.remove(&id);
        STARTED_LEN.store(map.len(), Ordering::Relaxed);
        s
    };
    if let Some(s) = started {
        if recording() {
            emit(GpuRecord::Range {
                start: s.start,
                end,
                tid: s.tid,
                name: s.name,
                domain: DOMAINS.name(s.domain),
            });
        }
    }
}

/// An instantaneous event: a range with `start == end`.
fn mark(domain: usize, name: impl FnOnce() -> String) {
    if !recording() {
        return;
    }
    let ts = monotonic_ns();
    emit(GpuRecord::Range {
        start: ts,
        end: ts,
        tid: gettid(),
        name: name(),
        domain: DOMAINS.name(domain),
    });
}

/// Read per record rather than cached per thread: a forked child's thread
/// has its parent's thread-locals but a tid of its own.
fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

// ---------------------------------------------------------------- strings

/// Names behind handles: domain handles and registered-string handles.
struct Registry(LazyLock<RwLock<Names>>);

#[derive(Default)]
struct Names {
    by_handle: Vec<Arc<str>>,
    by_name: HashMap<Arc<str>, usize>,
}

/// Registering a fresh string per call is a client bug; past this many
/// distinct names, new ones get no handle (NULL: they show as "").
const MAX_NAMES: usize = 1 << 16;

static STRINGS: Registry = Registry(LazyLock::new(Default::default));
static DOMAINS: Registry = Registry(LazyLock::new(Default::default));

impl Registry {
    fn handle(&self, name: String) -> Handle {
        let mut names = self.0.write().unwrap_or_else(|e| e.into_inner());
        let index = match names.by_name.get(name.as_str()) {
            Some(&i) => i,
            None if names.by_handle.len() >= MAX_NAMES => return ptr::null_mut(),
            None => {
                let name: Arc<str> = name.into();
                names.by_handle.push(name.clone());
                let i = names.by_handle.len() - 1;
                names.by_name.insert(name, i);
                i
            }
        };
        ptr::without_provenance_mut(index + 1)
    }

    /// "" for NULL (the default domain) and for handles we never gave out.
    fn name(&self, handle: usize) -> String {
        let Some(index) = handle.checked_sub(1) else {
            return String::new();
        };
        let names = self.0.read().unwrap_or_else(|e| e.into_inner());
        names
            .by_handle
            .get(index)
            .map(|s| s.to_string())
            .unwrap_or_default()
    }
}

/// `s`: NULL or a NUL-terminated string.
unsafe fn ascii(s: *const c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: NVTX messages are NUL-terminated strings owned by the caller
    // for the duration of the call.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// wchar_t is UTF-32 on Linux; invalid code points become U+FFFD.
unsafe fn wide(s: *const libc::wchar_t) -> String {
    let mut out = String::new();
    if s.is_null() {
        return out;
    }
    for i in 0.. {
        // SAFETY: NUL-terminated wide string of the caller; we stop at NUL.
        let c = unsafe { *s.add(i) } as u32;
        if c == 0 {
            break;
        }
        out.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
    }
    out
}

/// The message of an event's attributes; "" when it has none or when the
/// caller's struct is too short to hold one.
unsafe fn attr_name(attr: *const EventAttributes) -> String {
    if attr.is_null() {
        return String::new();
    }
    // SAFETY: the caller's attributes; `size` says how much of the struct it
    // filled, and the message is read only when it lies within that.
    unsafe {
        if ((*attr).size as usize) < size_of::<EventAttributes>() {
            return String::new();
        }
        let message = (*attr).message;
        match (*attr).message_type {
            MESSAGE_ASCII => ascii(message.cast()),
            MESSAGE_UNICODE => wide(message.cast()),
            MESSAGE_REGISTERED => STRINGS.name(message.addr()),
            _ => String::new(),
        }
    }
}

// ------------------------------------------------------------ the shim side

fn recording() -> bool {
    #[cfg(test)]
    if let Some(on) = tests::sink_recording() {
        return on;
    }
    crate::inject::recording()
}

fn emit(range: GpuRecord) {
    #[cfg(test)]
    let Some(range) = tests::sink_record(range) else {
        return;
    };
    crate::inject::record_nvtx(range)
}

fn start_shim() {
    #[cfg(test)]
    if tests::sink_started() {
        return;
    }
    crate::inject::start_from_nvtx()
}

#[cfg(test)]
mod tests {
    //! A fake client library built the way nvtxImpl.h builds its globals
    //! (function-pointer slots, per-module tables of the slots' addresses,
    //! the callbacks export table), then called the way nvtx3's inline API
    //! functions call through those slots. Records land in a sink here
    //! instead of going to the profiler.

    use super::*;
    use std::cell::Cell;
    use std::ffi::CString;
    use std::sync::atomic::{AtomicBool, AtomicU32};
    use std::sync::{Barrier, MutexGuard};

    static SINK: Mutex<Vec<GpuRecord>> = Mutex::new(Vec::new());
    static RECORDING: AtomicBool = AtomicBool::new(false);
    static STARTS: AtomicUsize = AtomicUsize::new(0);
    static TOLD_VERSION: AtomicU32 = AtomicU32::new(0);
    /// The handlers' state is process-wide: one test at a time uses it.
    static SERIAL: Mutex<()> = Mutex::new(());

    pub(super) fn sink_recording() -> Option<bool> {
        Some(RECORDING.load(Ordering::SeqCst))
    }

    pub(super) fn sink_record(range: GpuRecord) -> Option<GpuRecord> {
        SINK.lock().unwrap_or_else(|e| e.into_inner()).push(range);
        None
    }

    pub(super) fn sink_started() -> bool {
        STARTS.fetch_add(1, Ordering::SeqCst);
        true
    }

    fn serial(recording: bool) -> MutexGuard<'static, ()> {
        let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        SINK.lock().unwrap_or_else(|e| e.into_inner()).clear();
        RECORDING.store(recording, Ordering::SeqCst);
        g
    }

    /// (name, domain, tid, start, end) of everything recorded so far.
    fn ranges() -> Vec<(String, String, u32, u64, u64)> {
        SINK.lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .map(|r| match r {
                GpuRecord::Range {
                    start,
                    end,
                    tid,
                    name,
                    domain,
                } => (name, domain, tid, start, end),
                other => panic!("not a range: {other:?}"),
            })
            .collect()
    }

    fn one<'a>(
        rs: &'a [(String, String, u32, u64, u64)],
        name: &str,
    ) -> &'a (String, String, u32, u64, u64) {
        let found: Vec<_> = rs.iter().filter(|r| r.0 == name).collect();
        assert_eq!(found.len(), 1, "{name:?} in {rs:?}");
        found[0]
    }

    // ------------------------------------------------ the fake NVTX library

    const CORE_SIZE: usize = 16; // NVTX_CBID_CORE_SIZE
    const CORE2_SIZE: usize = 16; // NVTX_CBID_CORE2_SIZE

    /// One library's NVTX globals: a slot per function (NULL here stands for
    /// NVTX's own "init" stubs), and per module the slots' addresses, entry 0
    /// unused, with a trailing NULL.
    struct Client {
        core: Box<[AnyFn; CORE_SIZE]>,
        core2: Box<[AnyFn; CORE2_SIZE]>,
        core_table: Box<[Slot; CORE_SIZE + 1]>,
        core2_table: Box<[Slot; CORE2_SIZE + 1]>,
        /// What GetModuleFunctionTable says the CORE table holds.
        core_len: c_uint,
        /// GetModuleFunctionTable fails for every module.
        refuse: bool,
    }

    impl Client {
        fn new() -> Box<Client> {
            let mut c = Box::new(Client {
                core: Box::new([None; CORE_SIZE]),
                core2: Box::new([None; CORE2_SIZE]),
                core_table: Box::new([ptr::null_mut(); CORE_SIZE + 1]),
                core2_table: Box::new([ptr::null_mut(); CORE2_SIZE + 1]),
                core_len: CORE_SIZE as c_uint,
                refuse: false,
            });
            for i in 1..CORE_SIZE {
                c.core_table[i] = &mut c.core[i];
            }
            for i in 1..CORE2_SIZE {
                c.core2_table[i] = &mut c.core2[i];
            }
            c
        }

        /// What nvtxInitializeInjectionLibrary does once it has dlsym'd the
        /// entry point.
        fn inject(&self, get: GetExportTable) -> c_int {
            CURRENT.with(|c| c.set(self));
            let rc = InitializeInjectionNvtx2(get);
            CURRENT.with(|c| c.set(ptr::null()));
            rc
        }

        fn api(&self) -> Api {
            let core =
                |id: usize| self.core[id].unwrap_or_else(|| panic!("core slot {id} not set"));
            let core2 =
                |id: usize| self.core2[id].unwrap_or_else(|| panic!("core2 slot {id} not set"));
            // SAFETY: each slot holds the handler for its callback id, whose C
            // signature is the one nvtxTypes.h gives that id (as below).
            unsafe {
                Api {
                    mark_ex: t(core(core::MARK_EX)),
                    mark_a: t(core(core::MARK_A)),
                    mark_w: t(core(core::MARK_W)),
                    range_start_ex: t(core(core::RANGE_START_EX)),
                    range_start_a: t(core(core::RANGE_START_A)),
                    range_start_w: t(core(core::RANGE_START_W)),
                    range_end: t(core(core::RANGE_END)),
                    range_push_ex: t(core(core::RANGE_PUSH_EX)),
                    range_push_a: t(core(core::RANGE_PUSH_A)),
                    range_push_w: t(core(core::RANGE_PUSH_W)),
                    range_pop: t(core(core::RANGE_POP)),
                    domain_mark_ex: t(core2(core2::DOMAIN_MARK_EX)),
                    domain_range_start_ex: t(core2(core2::DOMAIN_RANGE_START_EX)),
                    domain_range_end: t(core2(core2::DOMAIN_RANGE_END)),
                    domain_range_push_ex: t(core2(core2::DOMAIN_RANGE_PUSH_EX)),
                    domain_range_pop: t(core2(core2::DOMAIN_RANGE_POP)),
                    register_a: t(core2(core2::DOMAIN_REGISTER_STRING_A)),
                    register_w: t(core2(core2::DOMAIN_REGISTER_STRING_W)),
                    create_a: t(core2(core2::DOMAIN_CREATE_A)),
                    create_w: t(core2(core2::DOMAIN_CREATE_W)),
                }
            }
        }
    }

    /// A slot's function as the type NVTX casts it to for that slot.
    unsafe fn t<F: Copy>(f: unsafe extern "C" fn()) -> F {
        assert_eq!(size_of::<F>(), size_of::<unsafe extern "C" fn()>());
        std::mem::transmute_copy(&f)
    }

    thread_local! {
        /// The library whose tables GetModuleFunctionTable hands out: the
        /// real one knows its own globals; ours are per test.
        static CURRENT: Cell<*const Client> = const { Cell::new(ptr::null()) };
    }

    unsafe extern "C" fn get_module_function_table(
        module: c_int,
        out_table: *mut *mut Slot,
        out_size: *mut c_uint,
    ) -> c_int {
        let c = CURRENT.with(|c| c.get());
        assert!(!c.is_null());
        let c = &*c;
        let (table, size) = match module {
            _ if c.refuse => return 0,
            MODULE_CORE => (c.core_table.as_ptr(), c.core_len),
            MODULE_CORE2 => (c.core2_table.as_ptr(), CORE2_SIZE as c_uint),
            _ => return 0,
        };
        *out_table = table as *mut Slot;
        *out_size = size;
        1
    }

    unsafe extern "C" fn set_injection_nvtx_version(v: u32) {
        TOLD_VERSION.store(v, Ordering::SeqCst);
    }

    static CALLBACKS: ExportTableCallbacks = ExportTableCallbacks {
        struct_size: size_of::<ExportTableCallbacks>(),
        get_module_function_table: Some(get_module_function_table),
    };
    static VERSION_INFO: ExportTableVersionInfo = ExportTableVersionInfo {
        struct_size: size_of::<ExportTableVersionInfo>(),
        version: 3,
        reserved0: 0,
        set_injection_nvtx_version: Some(set_injection_nvtx_version),
    };
    static SHORT_CALLBACKS: ExportTableCallbacks = ExportTableCallbacks {
        struct_size: size_of::<usize>(),
        get_module_function_table: Some(get_module_function_table),
    };

    unsafe extern "C" fn export_table(id: u32) -> *const c_void {
        match id {
            ETID_CALLBACKS => (&raw const CALLBACKS).cast(),
            ETID_VERSIONINFO => (&raw const VERSION_INFO).cast(),
            _ => ptr::null(),
        }
    }

    unsafe extern "C" fn no_export_tables(_: u32) -> *const c_void {
        ptr::null()
    }

    unsafe extern "C" fn short_export_table(id: u32) -> *const c_void {
        match id {
            ETID_CALLBACKS => (&raw const SHORT_CALLBACKS).cast(),
            _ => ptr::null(),
        }
    }

    /// A library with our handlers installed.
    fn injected() -> (Box<Client>, Api) {
        let c = Client::new();
        assert_eq!(c.inject(Some(export_table)), 1);
        let api = c.api();
        (c, api)
    }

    // ------------------------------------- nvtx3's inline API, through slots

    type Fn1<A, R> = unsafe extern "C" fn(A) -> R;
    type Fn2<A, B, R> = unsafe extern "C" fn(A, B) -> R;
    type Wide = *const libc::wchar_t;
    type Attrs = *const EventAttributes;

    #[derive(Clone, Copy)]
    struct Api {
        mark_ex: Fn1<Attrs, ()>,
        mark_a: Fn1<*const c_char, ()>,
        mark_w: Fn1<Wide, ()>,
        range_start_ex: Fn1<Attrs, u64>,
        range_start_a: Fn1<*const c_char, u64>,
        range_start_w: Fn1<Wide, u64>,
        range_end: Fn1<u64, ()>,
        range_push_ex: Fn1<Attrs, c_int>,
        range_push_a: Fn1<*const c_char, c_int>,
        range_push_w: Fn1<Wide, c_int>,
        range_pop: unsafe extern "C" fn() -> c_int,
        domain_mark_ex: Fn2<Handle, Attrs, ()>,
        domain_range_start_ex: Fn2<Handle, Attrs, u64>,
        domain_range_end: Fn2<Handle, u64, ()>,
        domain_range_push_ex: Fn2<Handle, Attrs, c_int>,
        domain_range_pop: Fn1<Handle, c_int>,
        register_a: Fn2<Handle, *const c_char, Handle>,
        register_w: Fn2<Handle, Wide, Handle>,
        create_a: Fn1<*const c_char, Handle>,
        create_w: Fn1<Wide, Handle>,
    }

    // SAFETY: only plain function pointers; handles are sent as integers
    // by NVTX clients too.
    unsafe impl Send for Api {}

    fn c(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    fn w(s: &str) -> Vec<libc::wchar_t> {
        s.chars().map(|c| c as libc::wchar_t).chain([0]).collect()
    }

    /// A message of one of the three kinds, as the caller owns it.
    enum Msg {
        Ascii(CString),
        Wide(Vec<libc::wchar_t>),
        Registered(Handle),
        None,
    }

    fn attrs(m: &Msg) -> EventAttributes {
        let (message_type, message): (i32, *const c_void) = match m {
            Msg::Ascii(s) => (MESSAGE_ASCII, s.as_ptr().cast()),
            Msg::Wide(s) => (MESSAGE_UNICODE, s.as_ptr().cast()),
            Msg::Registered(h) => (MESSAGE_REGISTERED, *h),
            Msg::None => (0, ptr::null()),
        };
        EventAttributes {
            version: 3,
            size: size_of::<EventAttributes>() as u16,
            category: 7,
            color_type: 1,
            color: 0xff00ff00,
            payload_type: 1,
            reserved0: 0,
            payload: 42,
            message_type,
            message,
        }
    }

    // SAFETY (every method): the handlers take the pointers of values that
    // live for the call, as NVTX clients pass them.
    impl Api {
        fn push_a(&self, s: &str) -> c_int {
            unsafe { (self.range_push_a)(c(s).as_ptr()) }
        }
        fn push_w(&self, s: &str) -> c_int {
            unsafe { (self.range_push_w)(w(s).as_ptr()) }
        }
        fn push_ex(&self, m: &Msg) -> c_int {
            unsafe { (self.range_push_ex)(&attrs(m)) }
        }
        fn pop(&self) -> c_int {
            unsafe { (self.range_pop)() }
        }
        fn start_a(&self, s: &str) -> u64 {
            unsafe { (self.range_start_a)(c(s).as_ptr()) }
        }
        fn start_w(&self, s: &str) -> u64 {
            unsafe { (self.range_start_w)(w(s).as_ptr()) }
        }
        fn start_ex(&self, m: &Msg) -> u64 {
            unsafe { (self.range_start_ex)(&attrs(m)) }
        }
        fn end(&self, id: u64) {
            unsafe { (self.range_end)(id) }
        }
        fn mark_a(&self, s: &str) {
            unsafe { (self.mark_a)(c(s).as_ptr()) }
        }
        fn mark_w(&self, s: &str) {
            unsafe { (self.mark_w)(w(s).as_ptr()) }
        }
        fn mark_ex(&self, m: &Msg) {
            unsafe { (self.mark_ex)(&attrs(m)) }
        }
        fn domain_create_a(&self, s: &str) -> Handle {
            unsafe { (self.create_a)(c(s).as_ptr()) }
        }
        fn domain_create_w(&self, s: &str) -> Handle {
            unsafe { (self.create_w)(w(s).as_ptr()) }
        }
        fn register_a(&self, d: Handle, s: &str) -> Handle {
            unsafe { (self.register_a)(d, c(s).as_ptr()) }
        }
        fn register_w(&self, d: Handle, s: &str) -> Handle {
            unsafe { (self.register_w)(d, w(s).as_ptr()) }
        }
        fn domain_push(&self, d: Handle, m: &Msg) -> c_int {
            unsafe { (self.domain_range_push_ex)(d, &attrs(m)) }
        }
        fn domain_pop(&self, d: Handle) -> c_int {
            unsafe { (self.domain_range_pop)(d) }
        }
        fn domain_start(&self, d: Handle, m: &Msg) -> u64 {
            unsafe { (self.domain_range_start_ex)(d, &attrs(m)) }
        }
        fn domain_end(&self, d: Handle, id: u64) {
            unsafe { (self.domain_range_end)(d, id) }
        }
        fn domain_mark(&self, d: Handle, m: &Msg) {
            unsafe { (self.domain_mark_ex)(d, &attrs(m)) }
        }
    }

    // ------------------------------------------------------------- tests

    #[test]
    fn init_fills_the_slots_it_knows_and_starts_the_shim() {
        let _g = serial(false);
        let before = STARTS.load(Ordering::SeqCst);
        let (client, _api) = injected();
        assert_eq!(STARTS.load(Ordering::SeqCst), before + 1);
        assert_eq!(TOLD_VERSION.load(Ordering::SeqCst), NVTX_VERSION);
        for id in 1..=core::RANGE_POP {
            assert!(client.core[id].is_some(), "core slot {id}");
        }
        // Thread and category naming stay NVTX's to turn into no-ops.
        for id in core::RANGE_POP + 1..CORE_SIZE {
            assert!(client.core[id].is_none(), "core slot {id}");
        }
        for id in [6, 7, 8, 9, 14, 15] {
            assert!(client.core2[id].is_none(), "core2 slot {id}");
        }
    }

    #[test]
    fn init_refuses_tables_it_does_not_know() {
        let _g = serial(false);
        let before = STARTS.load(Ordering::SeqCst);
        let c = Client::new();
        assert_eq!(c.inject(None), 0);
        assert_eq!(c.inject(Some(no_export_tables)), 0);
        assert_eq!(c.inject(Some(short_export_table)), 0);
        let mut refusing = Client::new();
        refusing.refuse = true;
        assert_eq!(refusing.inject(Some(export_table)), 0);
        let mut short = Client::new();
        short.core_len = core::RANGE_POP as c_uint;
        assert_eq!(short.inject(Some(export_table)), 0);
        assert!(short.core.iter().all(Option::is_none));
        assert_eq!(STARTS.load(Ordering::SeqCst), before);
    }

    #[test]
    fn nested_push_pop_on_two_threads() {
        let _g = serial(true);
        let (_client, api) = injected();
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    assert_eq!(api.push_a(&format!("step {t}")), 0);
                    assert_eq!(api.push_a("forward"), 1);
                    assert_eq!(api.pop(), 1);
                    assert_eq!(api.push_w("backward ✓"), 1);
                    assert_eq!(api.push_ex(&Msg::Ascii(c("optimizer"))), 2);
                    assert_eq!(api.pop(), 2);
                    assert_eq!(api.pop(), 1);
                    assert_eq!(api.pop(), 0);
                    // A pop without a push is an error, and harmless.
                    assert_eq!(api.pop(), -1);
                    gettid()
                })
            })
            .collect();
        let tids: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_ne!(tids[0], tids[1]);
        let all = ranges();
        assert_eq!(all.len(), 8, "{all:?}");
        for (t, tid) in tids.iter().enumerate() {
            let rs: Vec<_> = all.iter().filter(|r| r.2 == *tid).cloned().collect();
            assert_eq!(rs.len(), 4, "{rs:?}");
            let step = one(&rs, &format!("step {t}"));
            let fwd = one(&rs, "forward");
            let bwd = one(&rs, "backward ✓");
            let opt = one(&rs, "optimizer");
            for r in &rs {
                assert_eq!(r.1, "");
                assert!(r.3 <= r.4, "{r:?}");
            }
            for inner in [fwd, bwd] {
                assert!(
                    step.3 <= inner.3 && inner.4 <= step.4,
                    "{inner:?} in {step:?}"
                );
            }
            assert!(bwd.3 <= opt.3 && opt.4 <= bwd.4);
            assert!(fwd.4 <= bwd.3);
        }
    }

    #[test]
    fn start_and_end_across_threads() {
        let _g = serial(true);
        let (_client, api) = injected();
        let me = gettid();
        let load = api.start_a("load");
        let wide = api.start_w("décode");
        let (other, prefetch) = std::thread::spawn(move || {
            api.end(load);
            (gettid(), api.start_ex(&Msg::Ascii(c("prefetch"))))
        })
        .join()
        .unwrap();
        api.end(prefetch);
        api.end(wide);
        // Unknown and repeated ids are ignored.
        api.end(load);
        api.end(0);
        api.end(u64::MAX);
        assert!(load != 0 && prefetch != 0 && wide != 0);
        assert!(load != prefetch && prefetch != wide && load != wide);
        let rs = ranges();
        assert_eq!(rs.len(), 3, "{rs:?}");
        // A range belongs to the thread that started it.
        assert_eq!(one(&rs, "load").2, me);
        assert_eq!(one(&rs, "décode").2, me);
        assert_eq!(one(&rs, "prefetch").2, other);
        assert!(one(&rs, "load").4 <= one(&rs, "prefetch").3);
    }

    #[test]
    fn domains_and_registered_strings() {
        let _g = serial(true);
        let (_client, api) = injected();
        let d = api.domain_create_a("gapscope.test");
        assert!(!d.is_null());
        assert_eq!(api.domain_create_a("gapscope.test"), d);
        let dw = api.domain_create_w("領域");
        assert!(!dw.is_null() && dw != d);
        let allreduce = api.register_a(d, "allreduce");
        let sigma = api.register_w(dw, "σ-step");
        assert!(!allreduce.is_null() && !sigma.is_null() && allreduce != sigma);

        assert_eq!(api.push_a("outer"), 0);
        // Each domain has its own stack; NULL is the default domain.
        assert_eq!(api.domain_push(d, &Msg::Registered(allreduce)), 0);
        assert_eq!(api.domain_push(dw, &Msg::Wide(w("inner ✓"))), 0);
        assert_eq!(
            api.domain_push(ptr::null_mut(), &Msg::Ascii(c("null domain"))),
            1
        );
        assert_eq!(api.domain_pop(ptr::null_mut()), 1);
        assert_eq!(api.domain_pop(dw), 0);
        assert_eq!(api.domain_pop(d), 0);
        assert_eq!(api.domain_pop(d), -1);
        api.domain_mark(dw, &Msg::Registered(sigma));
        let id = api.domain_start(d, &Msg::Ascii(c("async")));
        api.domain_end(ptr::null_mut(), id);
        // A handle we never gave out names nothing rather than crashing.
        api.domain_mark(
            ptr::without_provenance_mut(1 << 40),
            &Msg::Registered(ptr::without_provenance_mut(1 << 40)),
        );
        assert_eq!(api.pop(), 0);

        let rs = ranges();
        assert_eq!(rs.len(), 7, "{rs:?}");
        let outer = one(&rs, "outer");
        assert_eq!(outer.1, "");
        assert_eq!(one(&rs, "allreduce").1, "gapscope.test");
        assert_eq!(one(&rs, "inner ✓").1, "領域");
        assert_eq!(one(&rs, "null domain").1, "");
        let mark = one(&rs, "σ-step");
        assert_eq!(mark.1, "領域");
        assert_eq!(mark.3, mark.4);
        assert_eq!(one(&rs, "async").1, "gapscope.test");
        let unknown = one(&rs, "");
        assert_eq!(unknown.1, "");
        for r in &rs {
            assert!(outer.3 <= r.3 && r.4 <= outer.4, "{r:?} in {outer:?}");
        }
    }

    #[test]
    fn marks_are_instants() {
        let _g = serial(true);
        let (_client, api) = injected();
        api.mark_a("checkpoint");
        api.mark_w("ckpt ✓");
        api.mark_ex(&Msg::Ascii(c("ex")));
        api.mark_ex(&Msg::None);
        let rs = ranges();
        assert_eq!(rs.len(), 4, "{rs:?}");
        for name in ["checkpoint", "ckpt ✓", "ex", ""] {
            let r = one(&rs, name);
            assert_eq!(r.3, r.4);
            assert_eq!(r.2, gettid());
        }
    }

    #[test]
    fn short_or_missing_attributes_give_no_name() {
        let _g = serial(true);
        let (_client, api) = injected();
        let msg = Msg::Ascii(c("unseen"));
        let mut a = attrs(&msg);
        // The struct the caller says it filled ends before messageType.
        a.size = 32;
        // SAFETY: a valid attributes struct for the call; NULL is allowed.
        unsafe {
            (api.mark_ex)(&a);
            (api.mark_ex)(ptr::null());
        }
        let rs = ranges();
        assert_eq!(rs.len(), 2);
        assert!(rs.iter().all(|r| r.0.is_empty()), "{rs:?}");
    }

    #[test]
    fn recording_that_starts_or_stops_mid_range() {
        let _g = serial(false);
        let (_client, api) = injected();
        assert_eq!(api.push_a("before"), 0);
        let early = api.start_a("early");
        api.mark_a("unseen");
        RECORDING.store(true, Ordering::SeqCst);
        // Levels stay right across the switch; the range pushed before it
        // is dropped at its pop.
        assert_eq!(api.push_a("during"), 1);
        assert_eq!(api.pop(), 1);
        api.end(early);
        assert_eq!(api.pop(), 0);
        assert_eq!(api.push_a("cut"), 0);
        let late = api.start_a("late");
        RECORDING.store(false, Ordering::SeqCst);
        assert_eq!(api.pop(), 0);
        api.end(late);
        let rs = ranges();
        assert_eq!(rs.len(), 1, "{rs:?}");
        assert_eq!(rs[0].0, "during");
        assert_eq!(STARTED_LEN.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn two_client_libraries_share_one_thread_stack() {
        let _g = serial(true);
        let (_a, lib_a) = injected();
        let (_b, lib_b) = injected();
        assert_eq!(lib_a.push_a("from a"), 0);
        assert_eq!(lib_b.push_a("from b"), 1);
        assert_eq!(lib_a.pop(), 1);
        assert_eq!(lib_b.pop(), 0);
        let rs = ranges();
        let a = one(&rs, "from a");
        let b = one(&rs, "from b");
        assert!(a.3 <= b.3 && b.4 <= a.4);
    }
}
