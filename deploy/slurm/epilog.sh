#!/bin/sh
# Slurm epilog (Epilog= in slurm.conf): keep the job's last recording
# windows (the agent's flight recorder) with the job, written out as one
# session per process, so a slow or failed run can be diagnosed afterwards
# with `gapscope report <session folder>`.
# GAPSCOPE_KEEP_DIR: where to put them (default: /var/spool/gapscope).
keep="${GAPSCOPE_KEEP_DIR:-/var/spool/gapscope}/job-${SLURM_JOB_ID}"
gapscope agent dump --dir /var/lib/gapscope --workload "slurm-${SLURM_JOB_ID}-" -o "$keep" \
    && chown -R "${SLURM_JOB_UID:-root}" "$keep" 2>/dev/null
exit 0
