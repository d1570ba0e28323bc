//! A signal frame that gives a thread back its own state. While the thread
//! runs the one syscall gapscope injects (the mmap of the stub's page), its
//! registers cannot be its own; it is therefore made to return from that
//! call into libc's signal-return trampoline (`__restore_rt`: rt_sigreturn)
//! with this frame on its stack, holding every general register, the
//! XSAVE state and the signal mask it had, and its instruction pointer on
//! the `syscall` it was about to make. Should gapscope die while the thread
//! is in the mmap, the kernel's own sigreturn puts everything back and the
//! call is made as if nothing had happened. Otherwise gapscope, still
//! there, sends the thread to the stub instead and the frame is never used.

/// `struct ucontext` up to and including `uc_sigmask` (the kernel's, with
/// an 8-byte sigset), which rt_sigreturn reads at the stack pointer.
const UCONTEXT_LEN: usize = 8 + 8 + 24 + 256 + 8;
const UC_FP_XSTATE: u64 = 1;
const UC_SIGCONTEXT_SS: u64 = 2;
const UC_STRICT_RESTORE_SS: u64 = 4;
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
/// An invalid `ss_flags`: sigreturn's sigaltstack restore fails (its error
/// is ignored) and the thread's alternate stack stays as it is.
const SS_FLAGS_UNCHANGED: u32 = 7;

/// The frame, to be written at `at` (64-byte aligned), and the stack
/// pointer the thread must have when it makes rt_sigreturn.
pub struct Frame {
    pub at: u64,
    pub bytes: Vec<u8>,
    pub sp: u64,
}

/// `xstate`: the thread's NT_X86_XSTATE register set (its XSAVE area, the
/// first 8 software-reserved bytes holding XCR0, as ptrace gives it). None
/// when it is too short to be one.
pub fn build(
    regs: &libc::user_regs_struct,
    resume_ip: u64,
    resume_rax: u64,
    sigmask: u64,
    xstate: &[u8],
) -> Option<Frame> {
    let xstate_size = xstate.len();
    if xstate_size < 576 {
        return None;
    }
    let xcr0 = u64::from_le_bytes(xstate[464..472].try_into().ok()?);
    // [ucontext][pad to 64][xsave area][magic2], below the red zone.
    let fp_off = (UCONTEXT_LEN + 63) & !63;
    let len = fp_off + xstate_size + 4;
    let at = (regs.rsp - 128 - len as u64) & !63;
    let fpstate = at + fp_off as u64;
    let mut b = vec![0u8; len];
    let mut put = |off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    put(0, UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS);
    put(8, 0); // uc_link
    put(16, 0); // uc_stack.ss_sp
    put(24, u64::from(SS_FLAGS_UNCHANGED));
    put(32, 0); // uc_stack.ss_size
                // struct sigcontext, at 40.
    let sc = 40;
    let gprs = [
        regs.r8,
        regs.r9,
        regs.r10,
        regs.r11,
        regs.r12,
        regs.r13,
        regs.r14,
        regs.r15,
        regs.rdi,
        regs.rsi,
        regs.rbp,
        regs.rbx,
        regs.rdx,
        resume_rax,
        regs.rcx,
        regs.rsp,
        resume_ip,
        regs.eflags,
    ];
    for (i, v) in gprs.iter().enumerate() {
        put(sc + 8 * i, *v);
    }
    // cs, gs, fs, ss: four u16.
    let segs = sc + 8 * 18;
    put(
        segs,
        (regs.cs & 0xffff)
            | ((regs.gs & 0xffff) << 16)
            | ((regs.fs & 0xffff) << 32)
            | ((regs.ss & 0xffff) << 48),
    );
    // err, trapno, oldmask, cr2 at segs + 8 .. + 40; then fpstate.
    put(segs + 24, sigmask);
    put(segs + 40, fpstate);
    // uc_sigmask, after the sigcontext's 8 reserved words.
    put(40 + 256, sigmask);
    b[fp_off..fp_off + xstate_size].copy_from_slice(&xstate[..xstate_size]);
    // What a signal frame's XSAVE area says of itself (struct
    // _fpx_sw_bytes in the software-reserved bytes), so that sigreturn
    // restores every component, not the legacy area alone.
    let sw = fp_off + 464;
    b[sw..sw + 48].fill(0);
    b[sw..sw + 4].copy_from_slice(&FP_XSTATE_MAGIC1.to_le_bytes());
    b[sw + 4..sw + 8].copy_from_slice(&((xstate_size + 4) as u32).to_le_bytes());
    b[sw + 8..sw + 16].copy_from_slice(&xcr0.to_le_bytes());
    b[sw + 16..sw + 20].copy_from_slice(&(xstate_size as u32).to_le_bytes());
    b[fp_off + xstate_size..].copy_from_slice(&FP_XSTATE_MAGIC2.to_le_bytes());
    Some(Frame {
        at,
        bytes: b,
        sp: at,
    })
}

/// Where libc's `__restore_rt` is in a process: the first
/// `mov $15, %rax; syscall` in its executable mappings of `file` (the bytes
/// of the library's file), given as (start, end, file offset) each.
pub fn find_restorer(file: &[u8], exec_maps: &[(u64, u64, u64)]) -> Option<u64> {
    const RESTORE_RT: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
    for &(start, end, offset) in exec_maps {
        let from = offset as usize;
        let to = (offset + (end - start)) as usize;
        let text = file.get(from..to.min(file.len()))?;
        if let Some(i) = text.windows(RESTORE_RT.len()).position(|w| w == RESTORE_RT) {
            return Some(start + i as u64);
        }
    }
    None
}
