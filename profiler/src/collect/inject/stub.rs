//! The code a target thread runs to load the shim: it saves every register
//! and the extended (FPU/SSE/AVX) state on the thread's own stack, calls
//! `dlopen(path, RTLD_NOW)` — the path is `/proc/self/fd/N`, the sealed
//! memfd gapscope filled with the shim — closes that fd, calls
//! `dlsym(handle, "gapscope_injected")` and that function with what the
//! injector passes (the libcupti to use, or ""), makes its own page
//! read-only (nothing stays writable and executable), restores everything
//! and jumps back to the `syscall` instruction the thread was about to run,
//! which then runs as if nothing had happened. It needs no tracer once
//! started: if gapscope dies while the target runs it, the target finishes
//! it and carries on.
//!
//! The stub is copied as bytes into a page mapped in the target; its data
//! follows its code in the same page and is reached RIP-relative, so the
//! copy works wherever it lands.

use std::arch::global_asm;

global_asm!(
    ".pushsection .text.gs_inject_stub,\"ax\",@progbits",
    ".p2align 6",
    ".globl gs_inject_stub_start",
    "gs_inject_stub_start:",
    // Below the red zone the interrupted code may be using.
    "lea rsp, [rsp - 128]",
    "pushfq",
    "push rax",
    "push rbx",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push rbp",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "mov rbp, rsp",
    "sub rsp, qword ptr [rip + gs_stub_xsave_size]",
    "and rsp, -64",
    // XRSTOR faults unless the reserved bytes of the XSAVE header are zero,
    // and XSAVE does not write them.
    "xor eax, eax",
    "mov qword ptr [rsp + 512], rax",
    "mov qword ptr [rsp + 520], rax",
    "mov qword ptr [rsp + 528], rax",
    "mov qword ptr [rsp + 536], rax",
    "mov qword ptr [rsp + 544], rax",
    "mov qword ptr [rsp + 552], rax",
    "mov qword ptr [rsp + 560], rax",
    "mov qword ptr [rsp + 568], rax",
    "mov eax, -1",
    "mov edx, -1",
    "xsave64 [rsp]",
    "lea rdi, [rip + gs_stub_path]",
    "mov esi, 2", // RTLD_NOW
    "call qword ptr [rip + gs_stub_dlopen]",
    "mov qword ptr [rip + gs_stub_handle], rax",
    // The mapping keeps the memfd's pages: its fd goes, loaded or not.
    "mov rdi, qword ptr [rip + gs_stub_fd]",
    "mov eax, 3", // close
    "syscall",
    "mov rax, qword ptr [rip + gs_stub_handle]",
    "test rax, rax",
    "jz .Lgs_stub_no_library",
    "mov rdi, rax",
    "lea rsi, [rip + gs_stub_symbol]",
    "call qword ptr [rip + gs_stub_dlsym]",
    "test rax, rax",
    "jz .Lgs_stub_no_symbol",
    "lea rdi, [rip + gs_stub_cupti]",
    "call rax",
    "mov qword ptr [rip + gs_stub_result], rax",
    "mov qword ptr [rip + gs_stub_status], 1",
    "jmp .Lgs_stub_restore",
    ".Lgs_stub_no_library:",
    "call qword ptr [rip + gs_stub_dlerror]",
    "mov qword ptr [rip + gs_stub_error], rax",
    "mov qword ptr [rip + gs_stub_status], 2",
    "jmp .Lgs_stub_restore",
    ".Lgs_stub_no_symbol:",
    "mov qword ptr [rip + gs_stub_status], 3",
    ".Lgs_stub_restore:",
    // W^X: from here on the page is only read and run. gapscope reads the
    // status above through ptrace, which needs no write permission.
    "lea rdi, [rip + gs_inject_stub_start]",
    "mov rsi, qword ptr [rip + gs_stub_page_len]",
    "mov edx, 5",  // PROT_READ | PROT_EXEC
    "mov eax, 10", // mprotect
    "syscall",
    "mov eax, -1",
    "mov edx, -1",
    "xrstor64 [rsp]",
    "mov rsp, rbp",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rbp",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "pop rbx",
    "pop rax",
    "popfq",
    // lea, not add: the flags are the interrupted code's again.
    "lea rsp, [rsp + 128]",
    "jmp qword ptr [rip + gs_stub_resume]",
    // Where gapscope has the thread make one more call (memfd_create)
    // before the stub runs: should gapscope die there, the thread goes on
    // into rt_sigreturn on the frame that gives it its own state back, as
    // from the injected mmap (see `sigframe`).
    ".globl gs_stub_tramp",
    "gs_stub_tramp:",
    "syscall",
    "mov eax, 15", // rt_sigreturn
    "syscall",
    "ud2",
    ".p2align 3",
    ".globl gs_stub_status",
    "gs_stub_status: .quad 0",
    ".globl gs_stub_dlopen",
    "gs_stub_dlopen: .quad 0",
    ".globl gs_stub_dlsym",
    "gs_stub_dlsym: .quad 0",
    ".globl gs_stub_dlerror",
    "gs_stub_dlerror: .quad 0",
    ".globl gs_stub_resume",
    "gs_stub_resume: .quad 0",
    ".globl gs_stub_xsave_size",
    "gs_stub_xsave_size: .quad 0",
    ".globl gs_stub_handle",
    "gs_stub_handle: .quad 0",
    ".globl gs_stub_result",
    "gs_stub_result: .quad 0",
    ".globl gs_stub_error",
    "gs_stub_error: .quad 0",
    ".globl gs_stub_fd",
    "gs_stub_fd: .quad 0",
    ".globl gs_stub_page_len",
    "gs_stub_page_len: .quad 0",
    ".globl gs_stub_memfd_name",
    "gs_stub_memfd_name: .asciz \"libgapscope_cupti.so\"",
    ".globl gs_stub_symbol",
    "gs_stub_symbol: .asciz \"gapscope_injected\"",
    ".p2align 3",
    ".globl gs_stub_path",
    "gs_stub_path: .space 64",
    ".globl gs_stub_cupti",
    "gs_stub_cupti: .space 1024",
    ".globl gs_inject_stub_end",
    "gs_inject_stub_end:",
    ".popsection",
);

extern "C" {
    static gs_inject_stub_start: u8;
    static gs_inject_stub_end: u8;
    static gs_stub_status: u8;
    static gs_stub_dlopen: u8;
    static gs_stub_dlsym: u8;
    static gs_stub_dlerror: u8;
    static gs_stub_resume: u8;
    static gs_stub_xsave_size: u8;
    static gs_stub_error: u8;
    static gs_stub_fd: u8;
    static gs_stub_tramp: u8;
    static gs_stub_memfd_name: u8;
    static gs_stub_page_len: u8;
    static gs_stub_path: u8;
    static gs_stub_cupti: u8;
}

/// What the stub reports in its status word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Still running (or never started).
    Running,
    /// Loaded, and InitializeInjection returned.
    Loaded,
    /// dlopen failed; `error` points at dlerror()'s text in the target.
    NoLibrary,
    /// The library has no `gapscope_injected`.
    NoSymbol,
}

impl Status {
    pub fn from_word(w: u64) -> Status {
        match w {
            1 => Status::Loaded,
            2 => Status::NoLibrary,
            3 => Status::NoSymbol,
            _ => Status::Running,
        }
    }
}

/// Offsets of the stub's data fields from its start.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub len: usize,
    pub status: usize,
    pub dlopen: usize,
    pub dlsym: usize,
    pub dlerror: usize,
    pub resume: usize,
    pub xsave_size: usize,
    pub error: usize,
    pub fd: usize,
    pub page_len: usize,
    /// `syscall; rt_sigreturn`: see the assembly.
    pub tramp: usize,
    /// The memfd's name, as `/proc/PID/maps` shows it (`/memfd:NAME`).
    pub memfd_name: usize,
    pub path: usize,
    pub path_max: usize,
    pub cupti: usize,
    pub cupti_max: usize,
}

/// Where each field lies, from the symbols' addresses in this binary.
pub fn layout() -> Layout {
    let start = std::ptr::addr_of!(gs_inject_stub_start) as usize;
    let at = |p: *const u8| p as usize - start;
    let end = at(std::ptr::addr_of!(gs_inject_stub_end));
    let path = at(std::ptr::addr_of!(gs_stub_path));
    let cupti = at(std::ptr::addr_of!(gs_stub_cupti));
    Layout {
        len: end,
        status: at(std::ptr::addr_of!(gs_stub_status)),
        dlopen: at(std::ptr::addr_of!(gs_stub_dlopen)),
        dlsym: at(std::ptr::addr_of!(gs_stub_dlsym)),
        dlerror: at(std::ptr::addr_of!(gs_stub_dlerror)),
        resume: at(std::ptr::addr_of!(gs_stub_resume)),
        xsave_size: at(std::ptr::addr_of!(gs_stub_xsave_size)),
        error: at(std::ptr::addr_of!(gs_stub_error)),
        fd: at(std::ptr::addr_of!(gs_stub_fd)),
        page_len: at(std::ptr::addr_of!(gs_stub_page_len)),
        tramp: at(std::ptr::addr_of!(gs_stub_tramp)),
        memfd_name: at(std::ptr::addr_of!(gs_stub_memfd_name)),
        path,
        path_max: cupti - path,
        cupti,
        cupti_max: end - cupti,
    }
}

/// The stub's bytes, its data fields filled.
pub struct Fill<'a> {
    pub dlopen: u64,
    pub dlsym: u64,
    pub dlerror: u64,
    /// Where the thread goes when done: its `syscall` instruction.
    pub resume: u64,
    /// Bytes of XSAVE area this CPU needs.
    pub xsave_size: u64,
    /// The memfd holding the shim, in the target, and its path there.
    pub fd: u64,
    pub path: &'a [u8],
    /// The libcupti the shim is to use; empty: its own search.
    pub cupti: &'a [u8],
    /// The mapped length of the stub's page(s).
    pub page_len: u64,
}

pub fn bytes(fill: &Fill) -> Option<Vec<u8>> {
    let l = layout();
    if fill.path.len() + 1 > l.path_max || fill.cupti.len() + 1 > l.cupti_max {
        return None;
    }
    // SAFETY: the symbols delimit bytes of this binary's text.
    let mut b = unsafe {
        std::slice::from_raw_parts(std::ptr::addr_of!(gs_inject_stub_start), l.len).to_vec()
    };
    let mut put = |at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    put(l.status, 0);
    put(l.dlopen, fill.dlopen);
    put(l.dlsym, fill.dlsym);
    put(l.dlerror, fill.dlerror);
    put(l.resume, fill.resume);
    put(l.xsave_size, fill.xsave_size);
    put(l.fd, fill.fd);
    put(l.page_len, fill.page_len);
    b[l.path..l.path + fill.path.len()].copy_from_slice(fill.path);
    b[l.path + fill.path.len()] = 0;
    b[l.cupti..l.cupti + fill.cupti.len()].copy_from_slice(fill.cupti);
    b[l.cupti + fill.cupti.len()] = 0;
    Some(b)
}

/// Bytes of the XSAVE area for every state component this CPU enables
/// (CPUID leaf 0xD, sub-leaf 0, EBX), with room to align it to 64.
pub fn xsave_size() -> u64 {
    let r = std::arch::x86_64::__cpuid_count(0xd, 0);
    u64::from(r.ebx.max(576)) + 64
}

/// Whether the OS has XSAVE enabled (CPUID leaf 1, ECX bit 27: OSXSAVE).
pub fn xsave_supported() -> bool {
    let r = std::arch::x86_64::__cpuid(1);
    r.ecx & (1 << 27) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One page is mapped, stays mapped, and is made read-only and
    /// executable by the stub: all of it must fit; the memfd carries the
    /// shim's own name, which is how a process's maps tell it was injected.
    #[test]
    fn the_stub_fits_one_page_and_names_its_memfd_as_the_shim() {
        let l = layout();
        assert!(l.len <= 4096, "{l:?}");
        let fill = |cupti: &[u8]| {
            bytes(&Fill {
                dlopen: 1,
                dlsym: 2,
                dlerror: 3,
                resume: 4,
                xsave_size: 5,
                fd: 6,
                path: b"/proc/self/fd/6",
                cupti,
                page_len: 4096,
            })
        };
        let b = fill(b"/opt/cuda/libcupti.so.13").unwrap();
        let name = &b[l.memfd_name..];
        let name = &name[..name.iter().position(|&c| c == 0).unwrap()];
        assert_eq!(name, gapscope_wire::LIBRARY_NAME.as_bytes());
        assert_eq!(u64::from_le_bytes(b[l.fd..l.fd + 8].try_into().unwrap()), 6);
        assert_eq!(&b[l.cupti..l.cupti + 25], b"/opt/cuda/libcupti.so.13\0");
        // Paths that do not fit are refused, not cut.
        assert!(fill(&vec![b'a'; l.cupti_max]).is_none());
    }
}
