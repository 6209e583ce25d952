#!/usr/bin/env bash
# Data-parallel ./train_gpt_cpu (or ./train_gpt: TRAINER=./train_gpt). Every rank gets the same
# flags; -d (tokens per step) fixes the global batch, so the gradient accumulation adapts to the
# number of ranks, and a checkpoint resumes on any number of ranks. -o must be a directory every
# rank can read (a shared filesystem across nodes): rank 0 writes it, every rank reads it on -y 1.
#
#   scripts/run_dist.sh local N   FLAGS...   one node, N ranks (mpirun -np N; a build with MPI)
#   scripts/run_dist.sh local N --pi tcp FLAGS...
#   scripts/run_dist.sh local N --pi fs  FLAGS...
#                                            one node, N ranks started here without mpirun (any
#                                            build): each gets -pn N -pr RANK and -pi tcp -ps
#                                            127.0.0.1:$PORT (default 12345) or -pi fs -pf a
#                                            fresh temporary directory; exits with the first
#                                            failed rank's status
#   scripts/run_dist.sh hosts FILE FLAGS...  several nodes: one rank per slot of an OpenMPI
#                                            hostfile ("node1 slots=4" lines); ranks = total slots
#   scripts/run_dist.sh slurm     FLAGS...   inside an allocation (sbatch scripts/slurm_dist.sbatch):
#                                            srun starts one rank per task (MPI through PMIx)
#   scripts/run_dist.sh slurm --pi fs DIR FLAGS...
#                                            the same without MPI: each task -pi fs -pf DIR (a
#                                            directory every node sees), rank from SLURM_PROCID
# Threads: each rank uses --threads T (default: its share of the node's cores, OMP_NUM_THREADS).
# Env: MPIRUN_ARGS (extra mpirun arguments), TRAINER (default ./train_gpt_cpu), PORT (--pi tcp).
set -euo pipefail
cd "$(dirname "$0")/.."
trainer=${TRAINER:-./train_gpt_cpu}
mode=${1:-}
usage() {
    sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 1
}
case "$mode" in
local)
    [ $# -ge 2 ] || usage
    n=$2; shift 2
    per=$(( $(nproc) / n )); [ "$per" -ge 1 ] || per=1
    pi=mpi
    if [ "${1:-}" = --pi ]; then pi=${2:-}; shift 2 || usage; fi
    case "$pi" in
    mpi) exec mpirun -np "$n" --bind-to none ${MPIRUN_ARGS:-} -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-$per}" "$trainer" "$@" ;;
    tcp) group=(-pi tcp -ps "127.0.0.1:${PORT:-12345}") ;;
    fs)
        dir=$(mktemp -d "${TMPDIR:-/tmp}/llmc-rendezvous.XXXXXX")
        trap 'rm -rf "$dir"' EXIT
        group=(-pi fs -pf "$dir") ;;
    *) echo "error: --pi '$pi': expected mpi, tcp or fs" >&2; exit 1 ;;
    esac
    pids=()
    trap 'kill "${pids[@]}" 2>/dev/null' INT TERM
    for ((r = 0; r < n; r++)); do
        OMP_NUM_THREADS="${OMP_NUM_THREADS:-$per}" "$trainer" "$@" "${group[@]}" -pn "$n" -pr "$r" &
        pids+=($!)
    done
    # a rank that fails makes the others stop within --dist-timeout, naming it
    rc=0
    for pid in "${pids[@]}"; do
        s=0
        wait "$pid" || s=$?
        [ "$rc" -ne 0 ] || rc=$s
    done
    exit "$rc" ;;
hosts)
    file=$2; shift 2
    [ -r "$file" ] || { echo "error: hostfile '$file' is not readable" >&2; exit 1; }
    exec mpirun --hostfile "$file" --bind-to none ${MPIRUN_ARGS:-} "$trainer" "$@" ;;
slurm)
    shift
    [ -n "${SLURM_JOB_ID:-}" ] || { echo "error: 'slurm' runs inside a Slurm allocation (sbatch scripts/slurm_dist.sbatch)" >&2; exit 1; }
    if [ "${1:-}" = --pi ]; then
        [ "${2:-}" = fs ] && [ -n "${3:-}" ] || { echo "error: slurm --pi takes 'fs DIR' (a directory every node sees)" >&2; exit 1; }
        dir=$3; shift 3
        mkdir -p "$dir"
        # each task takes its rank from SLURM_PROCID; rank 0 publishes its address in DIR
        exec srun --mpi=none --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" "$trainer" "$@" -pi fs -pf "$dir"
    fi
    exec srun --mpi=pmix --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" "$trainer" "$@" ;;
*)
    usage ;;
esac
