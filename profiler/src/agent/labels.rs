//! What a followed process is, in the words of the system that started it:
//! its Slurm job (from the cgroup slurmstepd put it in) and rank (from its
//! environment), its Kubernetes pod (from its cgroup) and namespace (from
//! its service-account volume), else its command. A process chooses its
//! environment and its files, not its cgroup: what says which job's
//! numbers these are comes from the cgroup, and the namespace file is read
//! as `safe_fs` reads anything a target can plant (below its volume, no
//! link out, no FIFO, root's, a DNS label). The job's name is the `workload` label: Prometheus gives every
//! scraped series its own `job` (the scrape job's), and would rename ours.

use std::collections::BTreeMap;
use std::fs;

/// Prometheus labels of a job, by name (sorted: the exposition is stable).
pub type Labels = BTreeMap<&'static str, String>;

/// The labels of the job rooted at `pid`.
pub fn of(pid: u32) -> Labels {
    let env = crate::collect::procfs::environ(pid);
    let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let namespace = pod_uid(&cgroup).and_then(|_| {
        // A FUSE mount of the process's own could hold any read for ever.
        crate::safe_fs::within(std::time::Duration::from_secs(1), move || {
            pod_namespace(pid)
        })
        .flatten()
    });
    from_parts(pid, &comm, &env, &cgroup, namespace)
}

/// The Kubernetes namespace in the pod's service-account volume, as the
/// process sees it: its `serviceaccount` directory is found in its own root
/// (`/var/run` links to `/run` in most images), the file below it only
/// through the volume's own relative links (`namespace -> ..data/…`), on
/// that volume, a regular file of root's, at most a DNS label.
fn pod_namespace(pid: u32) -> Option<String> {
    use crate::safe_fs::{self, Resolve};
    use std::os::fd::AsFd;
    let root = safe_fs::proc_root(pid).ok()?;
    let sa = safe_fs::openat2(
        root.as_fd(),
        std::path::Path::new("var/run/secrets/kubernetes.io/serviceaccount"),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        Resolve::InRoot,
    )
    .ok()?;
    let f =
        safe_fs::open_regular_at(sa.as_fd(), "namespace".as_ref(), Resolve::BeneathLinks).ok()?;
    if std::os::unix::fs::MetadataExt::uid(&f.metadata().ok()?) != 0 {
        return None;
    }
    let bytes = safe_fs::read_capped(f, 256).ok()?;
    let ns = String::from_utf8(bytes).ok()?.trim().to_string();
    dns_label(&ns).then_some(ns)
}

/// An RFC 1123 label, as Kubernetes names namespaces.
fn dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The Slurm job whose step cgroup the process is in: `job_<id>` below
/// slurmstepd's own cgroup (cgroup v2: `/system.slice/slurmstepd.scope/`,
/// or `<node>_slurmstepd.scope` with several slurmds; v1: `/slurm/` or
/// `/slurm_<node>/`). Only root makes cgroups there; a user's own
/// delegated cgroups cannot pose as one.
fn slurm_job(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let first = parts.next()?;
        let under_slurm = match first {
            "system.slice" => parts.next()?.ends_with("slurmstepd.scope"),
            _ => first == "slurm" || first.starts_with("slurm_"),
        };
        if !under_slurm {
            return None;
        }
        let part = parts.find(|p| p.starts_with("job_"))?;
        let id = &part[4..];
        (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| id.to_string())
    })
}

/// The pod's uid in a cgroup path (`…/kubepods-burstable-pod<uid>.slice/…`
/// under systemd, `…/kubepods/burstable/pod<uid>/…` under cgroupfs).
fn pod_uid(cgroup: &str) -> Option<String> {
    if !cgroup.contains("kubepods") {
        return None;
    }
    cgroup.split('/').find_map(|part| {
        let rest = &part[part.rfind("pod")? + 3..];
        let uid = rest.strip_suffix(".slice").unwrap_or(rest);
        let uid_like = uid.len() >= 32
            && uid
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == '-' || c == '_');
        uid_like.then(|| uid.replace('_', "-"))
    })
}

fn from_parts(
    pid: u32,
    comm: &str,
    env: &BTreeMap<String, String>,
    cgroup: &str,
    namespace: Option<String>,
) -> Labels {
    let mut l = Labels::new();
    l.insert("pid", pid.to_string());
    l.insert("command", comm.to_string());
    let get = |k: &str| env.get(k).filter(|v| !v.is_empty()).cloned();
    if let Some(rank) = get("SLURM_PROCID").or_else(|| get("RANK")) {
        l.insert("rank", rank);
    }
    let job = if let Some(id) = slurm_job(cgroup) {
        l.insert("slurm_job_id", id.clone());
        format!("slurm-{id}")
    } else if let Some(uid) = pod_uid(cgroup) {
        // In a pod the hostname is the pod's name.
        let pod = get("HOSTNAME").unwrap_or_else(|| uid.clone());
        l.insert("pod", pod.clone());
        l.insert("pod_uid", uid);
        match namespace {
            Some(ns) => {
                l.insert("namespace", ns.clone());
                format!("{ns}/{pod}")
            }
            None => pod,
        }
    } else {
        format!("{comm}-{pid}")
    };
    l.insert("workload", job);
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn slurm_jobs_are_named_by_their_id_and_rank() {
        let l = from_parts(
            7,
            "python",
            &env(&[("SLURM_JOB_ID", "4242"), ("SLURM_PROCID", "3")]),
            "0::/system.slice/slurmstepd.scope/job_4242/step_0",
            None,
        );
        assert_eq!(l["workload"], "slurm-4242");
        assert_eq!(l["rank"], "3");
        assert_eq!(l["slurm_job_id"], "4242");
    }

    #[test]
    fn pods_are_named_by_namespace_and_pod() {
        let cgroup = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4f9c2e_7d6a_4c3b_9a8e_0f1e2d3c4b5a.slice/cri-containerd-abc.scope";
        let l = from_parts(
            9,
            "python",
            &env(&[("HOSTNAME", "trainer-0"), ("RANK", "1")]),
            cgroup,
            Some("ml".into()),
        );
        assert_eq!(l["workload"], "ml/trainer-0");
        assert_eq!(l["pod_uid"], "1b4f9c2e-7d6a-4c3b-9a8e-0f1e2d3c4b5a");
        assert_eq!(l["rank"], "1");
        let plain = "0::/kubepods/besteffort/pod0f1e2d3c-4b5a-4c3b-9a8e-1b4f9c2e7d6a/abc";
        assert_eq!(
            pod_uid(plain).as_deref(),
            Some("0f1e2d3c-4b5a-4c3b-9a8e-1b4f9c2e7d6a")
        );
    }

    #[test]
    fn a_slurm_job_is_known_by_its_cgroup_never_its_environment() {
        let spoofed = from_parts(
            7,
            "python",
            &env(&[("SLURM_JOB_ID", "4242")]),
            "0::/user.slice/user-1001.slice/user@1001.service/slurmstepd.scope/job_4242",
            None,
        );
        assert_eq!(spoofed["workload"], "python-7");
        assert!(!spoofed.contains_key("slurm_job_id"));
        let v1 = "12:cpuset:/slurm/uid_1000/job_77/step_0\n11:memory:/slurm/uid_1000/job_77";
        assert_eq!(slurm_job(v1).as_deref(), Some("77"));
        let many = "0::/system.slice/node3_slurmstepd.scope/job_5/step_batch/user/task_0";
        assert_eq!(slurm_job(many).as_deref(), Some("5"));
    }

    #[test]
    fn a_namespace_is_a_dns_label_or_nothing() {
        for ok in ["ml", "team-a", "a1"] {
            assert!(dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "A", "a\nb", "root:x:0:0", &"a".repeat(64)] {
            assert!(!dns_label(bad), "{bad}");
        }
    }

    #[test]
    fn anything_else_is_its_command() {
        let l = from_parts(12, "simtrain", &env(&[]), "0::/user.slice", None);
        assert_eq!(l["workload"], "simtrain-12");
        assert!(!l.contains_key("rank"));
    }
}
