//! What recording needs from the machine, checked up front so the user gets
//! one clear line and a hint instead of a verifier log.

use std::path::Path;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
pub const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error(
        "recording needs root or CAP_BPF and CAP_PERFMON (missing: {missing}); \
         hint: run with sudo, or grant them: sudo setcap cap_bpf,cap_perfmon,cap_dac_read_search+ep $(which gapscope)"
    )]
    Privileges { missing: String },
    #[error(
        "this kernel exposes no BTF ({BTF_PATH} is missing); hint: gapscope needs a kernel built \
         with CONFIG_DEBUG_INFO_BTF=y (every major distribution since 2020 ships one)"
    )]
    NoBtf,
}

/// Effective capability bits of this process.
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

pub fn check() -> Result<(), PreflightError> {
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    if !has(CAP_SYS_ADMIN) {
        let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
            .into_iter()
            .filter(|(c, _)| !has(*c))
            .map(|(_, n)| n)
            .collect();
        if !missing.is_empty() {
            return Err(PreflightError::Privileges {
                missing: missing.join(", "),
            });
        }
    }
    if !Path::new(BTF_PATH).exists() {
        return Err(PreflightError::NoBtf);
    }
    Ok(())
}
