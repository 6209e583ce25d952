#!/usr/bin/env bash
# Data-parallel ./train_gpt_cpu (a build with MPI: `make` prints "✓ MPI"). Every rank gets the same
# flags; -d (tokens per step) fixes the global batch, so the gradient accumulation adapts to the
# number of ranks, and a checkpoint resumes on any number of ranks. -o must be a directory every
# rank can read (a shared filesystem across nodes): rank 0 writes it, every rank reads it on -y 1.
#
#   scripts/run_dist.sh local N   FLAGS...   one node, N ranks (mpirun -np N)
#   scripts/run_dist.sh hosts FILE FLAGS...  several nodes: one rank per slot of an OpenMPI
#                                            hostfile ("node1 slots=4" lines); ranks = total slots
#   scripts/run_dist.sh slurm     FLAGS...   inside an allocation (sbatch scripts/slurm_dist.sbatch):
#                                            srun starts one rank per task
# Threads: each rank uses --threads T (default: its share of the node's cores, OMP_NUM_THREADS).
# Env: MPIRUN_ARGS (extra mpirun arguments), TRAINER (default ./train_gpt_cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
trainer=${TRAINER:-./train_gpt_cpu}
mode=${1:-}
case "$mode" in
local)
    n=$2; shift 2
    per=$(( $(nproc) / n )); [ "$per" -ge 1 ] || per=1
    exec mpirun -np "$n" --bind-to none ${MPIRUN_ARGS:-} -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-$per}" "$trainer" "$@" ;;
hosts)
    file=$2; shift 2
    [ -r "$file" ] || { echo "error: hostfile '$file' is not readable" >&2; exit 1; }
    exec mpirun --hostfile "$file" --bind-to none ${MPIRUN_ARGS:-} "$trainer" "$@" ;;
slurm)
    shift
    [ -n "${SLURM_JOB_ID:-}" ] || { echo "error: 'slurm' runs inside a Slurm allocation (sbatch scripts/slurm_dist.sbatch)" >&2; exit 1; }
    exec srun --mpi=pmix --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" "$trainer" "$@" ;;
*)
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 1 ;;
esac
