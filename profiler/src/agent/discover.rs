//! Which processes on the node use a GPU: those NVML lists on a GPU, those
//! holding a `/dev/nvidia*` file open, those with the CUDA driver mapped,
//! and those with a dormant gapscope shim (or gapscope's simulated GPU)
//! listening on its control socket. Each is followed with its descendants,
//! so a DataLoader's workers come with their trainer.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;

use crate::collect::{inject, pidns, procfs};

/// The processes to follow: GPU processes none of whose ancestors is one
/// (a child is recorded with its parent), by pid.
pub fn gpu_jobs() -> Vec<u32> {
    let pids = all_pids();
    let parents: HashMap<u32, u32> = pids
        .iter()
        .filter_map(|&p| Some((p, procfs::process_info(p)?.ppid)))
        .collect();
    let listening = listening_shims(&pids);
    // NVML's lists see through what /proc may hide (another mount
    // namespace's device files); the files and mappings work without it.
    let on_gpu = crate::collect::nvml::gpu_pids().unwrap_or_default();
    let me = std::process::id();
    let chosen: HashSet<u32> = pids
        .iter()
        .copied()
        .filter(|&p| p != me)
        .filter(|&p| {
            on_gpu.contains(&p)
                || listening.contains(&p)
                || holds_device_file(p)
                || inject::gpu_process(p)
        })
        .collect();
    let mut jobs: Vec<u32> = chosen
        .iter()
        .copied()
        .filter(|&p| !has_ancestor_in(p, &parents, &chosen))
        .collect();
    jobs.sort_unstable();
    jobs
}

fn has_ancestor_in(pid: u32, parents: &HashMap<u32, u32>, set: &HashSet<u32>) -> bool {
    let mut at = pid;
    // Bounded: a cycle in a racing /proc read must not hang the agent.
    for _ in 0..64 {
        match parents.get(&at) {
            Some(&pp) if pp > 1 => {
                if set.contains(&pp) {
                    return true;
                }
                at = pp;
            }
            _ => return false,
        }
    }
    false
}

fn all_pids() -> Vec<u32> {
    let mut v: Vec<u32> = fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// A `/dev/nvidia0`, `/dev/nvidiactl`, `/dev/nvidia-uvm`… among its open
/// files.
fn holds_device_file(pid: u32) -> bool {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    dir.flatten().any(|e| {
        fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("/dev/nvidia"))
    })
}

/// The processes whose shim (or simulated GPU) listens on its control
/// socket: abstract Unix sockets as each network namespace lists them.
fn listening_shims(pids: &[u32]) -> HashSet<u32> {
    let mut names_by_netns: HashMap<u64, BTreeSet<String>> = HashMap::new();
    let mut out = HashSet::new();
    for &pid in pids {
        let Some(name) = pidns::control_socket_of(pid) else {
            continue;
        };
        let Some(net) = pidns::namespace_of(pid, "net") else {
            continue;
        };
        let names = names_by_netns
            .entry(net)
            .or_insert_with(|| abstract_names(&format!("/proc/{pid}/net/unix")));
        if names.contains(&name) {
            out.insert(pid);
        }
    }
    out
}

/// The abstract socket names in a `/proc/net/unix` listing ("@name").
fn abstract_names(path: &str) -> BTreeSet<String> {
    fs::read_to_string(path)
        .map(|t| parse_unix(&t))
        .unwrap_or_default()
}

fn parse_unix(text: &str) -> BTreeSet<String> {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter_map(|p| p.strip_prefix('@'))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abstract_sockets_are_read_from_the_listing() {
        let text = "Num       RefCount Protocol Flags    Type St Inode Path\n\
                    0000000000000000: 00000002 00000000 00010000 0001 01 12345 @gapscope-cupti.42.4026531836\n\
                    0000000000000000: 00000002 00000000 00010000 0001 01 12346 /run/systemd/notify\n\
                    0000000000000000: 00000003 00000000 00000000 0001 03 12347\n";
        let names = parse_unix(text);
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["gapscope-cupti.42.4026531836"]
        );
    }

    #[test]
    fn a_child_of_a_followed_process_is_not_followed_twice() {
        let parents: HashMap<u32, u32> = [(10, 1), (11, 10), (12, 11), (20, 1)].into();
        let set: HashSet<u32> = [10, 12, 20].into();
        assert!(!has_ancestor_in(10, &parents, &set));
        assert!(has_ancestor_in(12, &parents, &set));
        assert!(!has_ancestor_in(20, &parents, &set));
    }
}
