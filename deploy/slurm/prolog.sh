#!/bin/sh
# Slurm prolog (Prolog= in slurm.conf): nothing to start — the node's
# gapscope agent (a systemd service) finds the job's GPU processes itself
# and labels them with SLURM_JOB_ID and SLURM_PROCID from their environment.
# Make sure it is running, so the job is watched from its first step.
systemctl is-active --quiet gapscope-agent || systemctl start gapscope-agent
exit 0
