//! Finding and binding libcupti (and the bits of libcuda the shim needs) at
//! run time, without ever panicking when they are absent.
//!
//! cudarc's own loader only tries the sonames of the CUDA version it was
//! built for and panics when none loads; a PyTorch process usually carries
//! libcupti already mapped (cu12 wheels: `site-packages/nvidia/cuda_cupti/lib`,
//! cu13 wheels: `site-packages/nvidia/cu13/lib`), and a CUDA 13 driver needs
//! `libcupti.so.13`. So the shim resolves the library itself and binds only
//! the functions it calls, typed with cudarc's definitions.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use cudarc::cupti::sys;

/// CUPTI entry points, with `CUptiResult` returned as a raw u32 so that an
/// unknown result code from a newer CUPTI is just a number.
#[allow(non_snake_case)]
pub struct Cupti {
    pub path: String,
    pub version: u32,
    pub cuptiActivityRegisterCallbacks:
        unsafe extern "C" fn(sys::CUpti_BuffersCallbackRequestFunc, BufferCompleteFn) -> u32,
    pub cuptiActivityRegisterTimestampCallback:
        Option<unsafe extern "C" fn(sys::CUpti_TimestampCallbackFunc) -> u32>,
    /// Present since CUPTI 9; SYSTEM makes API records carry gettid()
    /// values instead of pthread_self(), so they match the eBPF timeline.
    pub cuptiSetThreadIdType: Option<unsafe extern "C" fn(u32) -> u32>,
    pub cuptiActivityEnable: unsafe extern "C" fn(u32) -> u32,
    pub cuptiActivityDisable: unsafe extern "C" fn(u32) -> u32,
    pub cuptiActivityFlushAll: unsafe extern "C" fn(u32) -> u32,
    pub cuptiActivityGetNextRecord:
        unsafe extern "C" fn(*mut u8, usize, *mut *mut sys::CUpti_Activity) -> u32,
    pub cuptiActivityGetNumDroppedRecords:
        unsafe extern "C" fn(*mut std::ffi::c_void, u32, *mut usize) -> u32,
    pub cuptiGetTimestamp: unsafe extern "C" fn(*mut u64) -> u32,
    pub cuptiSubscribe: unsafe extern "C" fn(
        *mut sys::CUpti_SubscriberHandle,
        sys::CUpti_CallbackFunc,
        *mut c_void,
    ) -> u32,
    pub cuptiUnsubscribe: unsafe extern "C" fn(sys::CUpti_SubscriberHandle) -> u32,
    /// Per-call switches for API records (CUDA 12.5+): the bookkeeping
    /// calls PyTorch makes around every op are left out with them.
    pub cuptiActivityEnableRuntimeApi: Option<unsafe extern "C" fn(u32, u8) -> u32>,
    pub cuptiActivityEnableDriverApi: Option<unsafe extern "C" fn(u32, u8) -> u32>,
    /// CUDA 12.x/13 record every event/stream query as a synchronization by
    /// default; this turns that off (real waits are still recorded).
    pub cuptiActivityEnableAllSyncRecords: Option<unsafe extern "C" fn(u8) -> u32>,
}

/// `CUpti_BuffersCallbackCompleteFunc` with the context as an opaque pointer
/// (cudarc keeps its `CUcontext` alias private).
pub type BufferCompleteFn = Option<unsafe extern "C" fn(*mut c_void, u32, *mut u8, usize, usize)>;

pub const CUPTI_SUCCESS: u32 = 0;
/// `CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM`: thread ids as gettid() returns them.
pub const THREAD_ID_TYPE_SYSTEM: u32 = 1;
pub const CUPTI_ERROR_NOT_INITIALIZED: u32 = 15;
pub const CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: u32 = 39;
/// `cuptiActivityGetNextRecord`: no more records in the buffer.
pub const CUPTI_ERROR_MAX_LIMIT_REACHED: u32 = 12;
/// The first CUPTI API version that survives a refused buffer (CUDA 12.9);
/// older ones can crash when the buffer callback returns none.
pub const API_VERSION_REFUSES_SAFELY: u32 = 27;

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a thread-local C string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn open(path: &str, flags: c_int) -> Option<*mut c_void> {
    let c = CString::new(path).ok()?;
    // SAFETY: dlopen with a valid C string.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    (!h.is_null()).then_some(h)
}

/// # Safety
/// `T` must be the function's real type.
unsafe fn sym<T: Copy>(handle: *mut c_void, name: &str) -> Option<T> {
    let c = CString::new(name).ok()?;
    let p = libc::dlsym(handle, c.as_ptr());
    if p.is_null() {
        None
    } else {
        Some(std::mem::transmute_copy::<*mut c_void, T>(&p))
    }
}

/// Paths of shared libraries mapped into this process whose file name
/// starts with `prefix` ("libcupti" matches libcupti.so.13 and a
/// differently named build of it alike).
fn mapped(prefix: &str) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut out: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            std::path::Path::new(p).file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(prefix) && n.contains(".so")
            })
        })
        .map(str::to_string)
        .collect();
    out.dedup();
    out
}

/// The CUDA driver's version (e.g. 12090), if libcuda is loaded.
pub fn driver_version() -> u32 {
    let Some(h) = open("libcuda.so.1", libc::RTLD_NOW | libc::RTLD_NOLOAD) else {
        return 0;
    };
    let mut v: c_int = 0;
    // SAFETY: cuDriverGetVersion(int*) as documented.
    unsafe {
        if let Some(f) = sym::<unsafe extern "C" fn(*mut c_int) -> c_int>(h, "cuDriverGetVersion") {
            if f(&mut v) != 0 {
                v = 0;
            }
        }
        libc::dlclose(h);
    }
    v.max(0) as u32
}

/// Names of the GPUs the driver sees, by ordinal, with their UUIDs where
/// the driver gives them. Driver calls: never from inside `cuInit`
/// (InitializeInjection runs there), only once CUDA works.
pub fn device_names() -> Vec<(u32, String, Option<String>)> {
    let Some(h) = open("libcuda.so.1", libc::RTLD_NOW | libc::RTLD_NOLOAD) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    // SAFETY: driver API signatures as documented; buffers sized as passed.
    unsafe {
        let count = sym::<unsafe extern "C" fn(*mut c_int) -> c_int>(h, "cuDeviceGetCount");
        let get = sym::<unsafe extern "C" fn(*mut c_int, c_int) -> c_int>(h, "cuDeviceGet");
        let name =
            sym::<unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int>(h, "cuDeviceGetName");
        // CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev), CUuuid
        // being 16 bytes (cuDeviceGetUuid before CUDA 11.4: same signature).
        type GetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;
        let uuid = sym::<GetUuid>(h, "cuDeviceGetUuid_v2")
            .or_else(|| sym::<GetUuid>(h, "cuDeviceGetUuid"));
        if let (Some(count), Some(get), Some(name)) = (count, get, name) {
            let mut n: c_int = 0;
            if count(&mut n) == 0 {
                for i in 0..n.clamp(0, 64) {
                    let mut dev: c_int = 0;
                    let mut buf = [0 as c_char; 256];
                    if get(&mut dev, i) == 0 && name(buf.as_mut_ptr(), 256, dev) == 0 {
                        let s = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
                        let mut bytes = [0u8; 16];
                        let id = uuid
                            .filter(|f| f(&mut bytes, dev) == 0)
                            .map(|_| uuid_text(&bytes));
                        out.push((i as u32, s, id));
                    }
                }
            }
        }
        libc::dlclose(h);
    }
    out
}

/// A GPU UUID as NVML and nvidia-smi write it: `GPU-` and the 16 bytes in
/// hex, grouped 4-2-2-2-6.
pub fn uuid_text(b: &[u8; 16]) -> String {
    let hex =
        |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// libcupti files in `dir`, newest soname first.
fn cupti_in(dir: &std::path::Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("libcupti.so"))
        .map(|e| e.path().to_string_lossy().into_owned())
        .collect();
    found.sort_unstable_by(|a, b| b.cmp(a));
    found
}

/// Directories where the NVIDIA wheels beside a mapped CUDA runtime keep
/// libcupti: the runtime's own directory (cu13 wheels put every library in
/// `nvidia/cu13/lib`), `nvidia/cu*/lib`, and cu12's `nvidia/cuda_cupti/lib`.
fn wheel_dirs(cudart: &str) -> Vec<std::path::PathBuf> {
    let rt = std::path::Path::new(cudart);
    let mut dirs: Vec<std::path::PathBuf> =
        rt.parent().map(|d| d.to_path_buf()).into_iter().collect();
    // .../site-packages/nvidia/<package>/lib/libcudart.so.N
    if let Some(nvidia) = rt.ancestors().nth(3) {
        if let Ok(rd) = std::fs::read_dir(nvidia) {
            let mut cu: Vec<_> = rd
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("cu"))
                .map(|e| e.path().join("lib"))
                .collect();
            cu.sort_unstable_by(|a, b| b.cmp(a));
            dirs.extend(cu);
        }
    }
    dirs
}

/// Where libcupti may be, best first, and what the caller should be told.
///
/// A copy already mapped in the process wins over everything, `--cupti`
/// (GAPSCOPE_CUPTI) included: two CUPTIs in one process are two tool
/// clients on one driver, which is never right. Then the explicit path,
/// the wheels beside the CUDA runtime a framework loaded, CUDA installs,
/// and the linker's search.
fn candidates(driver: u32) -> (Vec<String>, Option<String>) {
    let mut c = Vec::new();
    let mut note = None;
    let already = mapped("libcupti");
    let explicit = crate::inject::named_cupti();
    if let (Some(first), Some(asked)) = (already.first(), &explicit) {
        let same = std::fs::canonicalize(first).ok() == std::fs::canonicalize(asked).ok();
        if !same {
            note = Some(format!(
                "the process already has {first} loaded; using it rather than {asked} \
                 (two CUPTIs in one process cannot both work)"
            ));
        }
    }
    c.extend(already);
    c.extend(explicit);
    for rt in mapped("libcudart") {
        for dir in wheel_dirs(&rt) {
            c.extend(cupti_in(&dir));
        }
    }
    let major = driver / 1000;
    for home in [
        crate::inject::setting("CUDA_HOME"),
        Some("/usr/local/cuda".into()),
    ]
    .into_iter()
    .flatten()
    {
        c.push(format!("{home}/extras/CUPTI/lib64/libcupti.so.{major}"));
        c.push(format!("{home}/extras/CUPTI/lib64/libcupti.so"));
    }
    if major > 0 {
        c.push(format!("libcupti.so.{major}"));
    }
    c.extend(["libcupti.so.13", "libcupti.so.12", "libcupti.so"].map(String::from));
    (c, note)
}

impl Cupti {
    /// Loads libcupti (with a note to pass on, if any), or says why it
    /// could not.
    pub fn load(driver: u32) -> Result<(Cupti, Option<String>), String> {
        let mut tried = Vec::new();
        let (paths, note) = candidates(driver);
        for path in paths {
            let Some(h) = open(&path, libc::RTLD_NOW | libc::RTLD_GLOBAL) else {
                tried.push(format!("{path}: {}", dlerror()));
                continue;
            };
            // SAFETY: each symbol is bound to its documented signature.
            let bound = unsafe { Self::bind(h, path.clone()) };
            match bound {
                Some(c) => return Ok((c, note)),
                None => tried.push(format!("{path}: missing CUPTI entry points")),
            }
        }
        Err(format!(
            "libcupti not found (set GAPSCOPE_CUPTI=/path/to/libcupti.so); tried {}",
            tried.len()
        ))
    }

    unsafe fn bind(h: *mut c_void, path: String) -> Option<Cupti> {
        let get_version = sym::<unsafe extern "C" fn(*mut u32) -> u32>(h, "cuptiGetVersion")?;
        let mut version = 0;
        if get_version(&mut version) != CUPTI_SUCCESS {
            version = 0;
        }
        Some(Cupti {
            path,
            version,
            cuptiActivityRegisterCallbacks: sym(h, "cuptiActivityRegisterCallbacks")?,
            cuptiActivityRegisterTimestampCallback: sym(
                h,
                "cuptiActivityRegisterTimestampCallback",
            ),
            cuptiSetThreadIdType: sym(h, "cuptiSetThreadIdType"),
            cuptiActivityEnable: sym(h, "cuptiActivityEnable")?,
            cuptiActivityDisable: sym(h, "cuptiActivityDisable")?,
            cuptiActivityFlushAll: sym(h, "cuptiActivityFlushAll")?,
            cuptiActivityGetNextRecord: sym(h, "cuptiActivityGetNextRecord")?,
            cuptiActivityGetNumDroppedRecords: sym(h, "cuptiActivityGetNumDroppedRecords")?,
            cuptiGetTimestamp: sym(h, "cuptiGetTimestamp")?,
            cuptiSubscribe: sym(h, "cuptiSubscribe")?,
            cuptiUnsubscribe: sym(h, "cuptiUnsubscribe")?,
            cuptiActivityEnableRuntimeApi: sym(h, "cuptiActivityEnableRuntimeApi"),
            cuptiActivityEnableDriverApi: sym(h, "cuptiActivityEnableDriverApi"),
            cuptiActivityEnableAllSyncRecords: sym(h, "cuptiActivityEnableAllSyncRecords"),
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_uuid_reads_as_nvml_writes_it() {
        let bytes: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(
            super::uuid_text(&bytes),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
    }
}
