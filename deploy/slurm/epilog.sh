#!/bin/sh
# Slurm epilog (Epilog= in slurm.conf): keep the job's last recording
# windows (the agent's flight recorder) with the job, so a slow or failed
# run can be diagnosed afterwards with `gapscope report <window>`.
# GAPSCOPE_KEEP_DIR: where to put them (default: /var/spool/gapscope).
keep="${GAPSCOPE_KEEP_DIR:-/var/spool/gapscope}/job-${SLURM_JOB_ID}"
found=0
for w in /var/lib/gapscope/slurm-"${SLURM_JOB_ID}"-*; do
    [ -d "$w" ] || continue
    mkdir -p "$keep" && cp -a "$w" "$keep"/ && found=1
done
[ "$found" = 1 ] && chown -R "${SLURM_JOB_UID:-root}" "$keep" 2>/dev/null
exit 0
