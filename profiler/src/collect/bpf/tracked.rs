//! The kernel side's set of tracked processes: one bit per possible tgid in
//! a mappable BPF array, which every switch and wakeup on the machine asks
//! with one load. Userspace sets bits in the same memory with the atomic
//! OR the kernel side uses when a tracked process forks, so neither loses
//! the other's bit in a shared word.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use aya::maps::{Map, MapData};

use super::BpfError;

pub struct Tracked {
    /// Keeps the map (and so its memory) alive for the mapping's life.
    _map: MapData,
    words: *const AtomicU64,
    len: usize,
}

// SAFETY: the mapping is shared memory used only through atomics.
unsafe impl Send for Tracked {}

impl Tracked {
    pub fn new(map: Map) -> Result<Tracked, BpfError> {
        let Map::Array(map) = map else {
            return Err(BpfError::Missing("tracked (as an array)"));
        };
        let info = map.info().map_err(|source| BpfError::Map {
            name: "tracked",
            source,
        })?;
        let len = info.max_entries() as usize;
        let bytes = len * std::mem::size_of::<u64>();
        // SAFETY: mapping the array's own memory (BPF_F_MMAPABLE), shared
        // and writable as the kernel allows for such maps; checked below.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(BpfError::Mmap(std::io::Error::last_os_error()));
        }
        Ok(Tracked {
            _map: map,
            words: at.cast(),
            len,
        })
    }

    /// Adds process `tgid`; false when it is past the bitmap (no such pid
    /// on Linux, whose pids stay below 2^22).
    pub fn insert(&self, tgid: u32) -> bool {
        let w = (tgid >> 6) as usize;
        if w >= self.len {
            return false;
        }
        // SAFETY: w is within the mapping, which lives as long as self.
        let word = unsafe { &*self.words.add(w) };
        word.fetch_or(1 << (tgid & 63), Ordering::SeqCst);
        true
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // SAFETY: unmapping what new() mapped, once.
        unsafe {
            libc::munmap(
                self.words as *mut libc::c_void,
                self.len * std::mem::size_of::<u64>(),
            );
        }
    }
}
