//! What a followed process is, in the words of the system that started it:
//! its Slurm job and rank (from its environment), its Kubernetes pod and
//! namespace (from its cgroup and its service-account mount), else its
//! command. The job's name is the `workload` label: Prometheus gives every
//! scraped series its own `job` (the scrape job's), and would rename ours.

use std::collections::BTreeMap;
use std::fs;

/// Prometheus labels of a job, by name (sorted: the exposition is stable).
pub type Labels = BTreeMap<&'static str, String>;

/// The labels of the job rooted at `pid`.
pub fn of(pid: u32) -> Labels {
    let env = environ(pid);
    let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let namespace = fs::read_to_string(format!(
        "/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    ))
    .ok()
    .map(|s| s.trim().to_string());
    from_parts(pid, &comm, &env, &cgroup, namespace)
}

fn environ(pid: u32) -> BTreeMap<String, String> {
    fs::read(format!("/proc/{pid}/environ"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter_map(|kv| {
                    let kv = String::from_utf8_lossy(kv);
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_string(), v.to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
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
    let job = if let Some(id) = get("SLURM_JOB_ID") {
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
    fn anything_else_is_its_command() {
        let l = from_parts(12, "simtrain", &env(&[]), "0::/user.slice", None);
        assert_eq!(l["workload"], "simtrain-12");
        assert!(!l.contains_key("rank"));
    }
}
