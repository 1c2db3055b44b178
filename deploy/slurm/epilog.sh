#!/bin/sh
# Slurm epilog (slurm.conf: Epilog=/path/to/epilog.sh): after a job, remove the shared-memory
# segments its rdmasched daemon and ranks left on this node (/dev/shm/rdmasched.job<ID>.*,
# those whose creating process is gone: a daemon killed with SIGKILL, a job cancelled).
# Runs as root on every node of the job, with Slurm's environment (SLURM_JOB_ID). A job that
# named its cluster itself (RDMASCHED_CLUSTER) is not the epilog's to know: clean it with
# `rdmasched cleanup --cluster NAME`. Never fails the node: an epilog that exits non-zero
# drains it, and a segment left behind is no reason to.
#
# RDMASCHED (default `rdmasched`): the command; RDMASCHED_EPILOG_LOG (default none): a file
# the epilog appends what it removed to.
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
RDMASCHED=${RDMASCHED:-rdmasched}
out=$($RDMASCHED cleanup --cluster "job$SLURM_JOB_ID" 2>&1)
rc=$?
if [ -n "${RDMASCHED_EPILOG_LOG:-}" ]; then
    printf '%s job %s node %s rc %s: %s\n' "$(date -u +%FT%TZ)" "$SLURM_JOB_ID" \
        "${SLURMD_NODENAME:-$(hostname -s)}" "$rc" "$(echo "$out" | tr '\n' ';')" \
        >>"$RDMASCHED_EPILOG_LOG"
fi
exit 0
