#!/usr/bin/env bash
# Data-parallel ./train_gpt_cpu (or ./train_gpt: TRAINER=./train_gpt). Every rank gets the same
# flags; -d (tokens per step) fixes the global batch, so the gradient accumulation adapts to the
# number of ranks, and a checkpoint resumes on any number of ranks. -o must be a directory every
# rank can read (a shared filesystem across nodes): rank 0 writes it, every rank reads it on -y 1.
# Relative paths in FLAGS (and TRAINER) mean the directory you run this from.
#
#   scripts/run_dist.sh local N   FLAGS...   one node, N ranks (mpirun -np N; a build with MPI)
#   scripts/run_dist.sh local N --pi tcp FLAGS...
#   scripts/run_dist.sh local N --pi fs  FLAGS...
#                                            one node, N ranks started here without mpirun (any
#                                            build): each gets -pn N -pr RANK and -pi tcp -ps
#                                            127.0.0.1:$PORT (default: a free port) or -pi fs -pf a
#                                            fresh temporary directory. When a rank fails, the
#                                            others get RUN_DIST_GRACE seconds (default 5) to
#                                            stop by themselves, then SIGTERM; the exit status is
#                                            that of the lowest-numbered rank that failed itself
#   scripts/run_dist.sh hosts FILE FLAGS...  several nodes: one rank per slot of an OpenMPI
#                                            hostfile ("node1 slots=4" lines); ranks = total slots
#   scripts/run_dist.sh slurm     FLAGS...   inside an allocation (sbatch scripts/slurm_dist.sbatch):
#                                            srun starts one rank per task (MPI through PMIx)
#   scripts/run_dist.sh slurm --pi fs DIR FLAGS...
#                                            the same without MPI: each task -pi fs -pf DIR (a
#                                            directory every node sees), rank from SLURM_PROCID
# Threads: each rank uses --threads T (default: its share of the node's cores, OMP_NUM_THREADS).
# Env: MPIRUN_ARGS (extra mpirun arguments), TRAINER (default: train_gpt_cpu of this checkout),
# PORT (--pi tcp), RUN_DIST_GRACE (local --pi tcp|fs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
trainer=${TRAINER:-$root/train_gpt_cpu}
mode=${1:-}
usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 1
}
die() {
    echo "error: run_dist.sh: $*" >&2
    exit 1
}
# a number of ranks 1 .. 1024, else an error naming what it is
count() {
    [[ "$2" =~ ^[0-9]{1,5}$ ]] && [ "$((10#$2))" -ge 1 ] && [ "$((10#$2))" -le 1024 ] ||
        die "$1 '$2': expected a number of ranks, 1 .. 1024"
}
need_trainer() {
    [ -f "$trainer" ] && [ -x "$trainer" ] ||
        die "the trainer '$trainer' is not an executable file (build it with make, or set TRAINER)"
}
need() {
    command -v "$1" > /dev/null || die "$2"
}
case "$mode" in
local)
    [ $# -ge 2 ] || die "'local' needs the number of ranks: scripts/run_dist.sh local N [--pi tcp|fs] FLAGS..."
    count "local N" "$2"
    n=$((10#$2)); shift 2
    per=$(( $(nproc) / n )); [ "$per" -ge 1 ] || per=1
    pi=mpi
    if [ "${1:-}" = --pi ]; then
        [ $# -ge 2 ] || die "--pi needs a value: mpi, tcp or fs"
        pi=$2; shift 2
    fi
    need_trainer
    case "$pi" in
    mpi)
        need mpirun "'local $n' starts the ranks with mpirun, which is not installed here: use 'local $n --pi tcp' or '--pi fs' (no MPI needed), or install OpenMPI"
        exec mpirun -np "$n" --bind-to none ${MPIRUN_ARGS:-} -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-$per}" "$trainer" "$@" ;;
    tcp)
        # PORT unset: a port the kernel says is free now (two local jobs on one machine must not meet
        # each other's ranks on a fixed port); 12345 where python3 is missing
        port=${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2> /dev/null || echo 12345)}
        [[ "$port" =~ ^[0-9]{1,5}$ ]] && [ "$((10#$port))" -ge 1 ] && [ "$((10#$port))" -le 65535 ] ||
            die "PORT '$port': expected a TCP port, 1 .. 65535"
        group=(-pi tcp -ps "127.0.0.1:$((10#$port))") ;;
    fs)
        dir=$(mktemp -d "${TMPDIR:-/tmp}/llmc-rendezvous.XXXXXX")
        group=(-pi fs -pf "$dir") ;;
    *) die "--pi '$pi': expected mpi, tcp or fs" ;;
    esac
    grace=${RUN_DIST_GRACE:-5}
    [[ "$grace" =~ ^[0-9]+$ ]] || die "RUN_DIST_GRACE '$grace': expected whole seconds"
    pids=()
    # Stops every rank still running (SIGTERM, then SIGKILL 5 s later) and waits for it.
    stop_ranks() {
        local pid left
        for pid in "${pids[@]}"; do [ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null || true; done
        for _ in $(seq 50); do
            left=0
            for pid in "${pids[@]}"; do [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null || left=1; done
            [ "$left" = 1 ] || break
            sleep 0.1
        done
        for pid in "${pids[@]}"; do [ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true; done
        for pid in "${pids[@]}"; do [ -z "$pid" ] || wait "$pid" 2>/dev/null || true; done
    }
    cleanup() { [ -z "${dir:-}" ] || rm -rf "$dir"; }
    trap 'stop_ranks; cleanup; exit 130' INT
    trap 'stop_ranks; cleanup; exit 143' TERM
    trap cleanup EXIT
    for ((r = 0; r < n; r++)); do
        OMP_NUM_THREADS="${OMP_NUM_THREADS:-$per}" "$trainer" "$@" "${group[@]}" -pn "$n" -pr "$r" &
        pids+=($!)
    done
    # a rank that fails makes the others stop within --dist-timeout, naming it; one that keeps
    # waiting (e.g. for a rank 0 that could not listen) is stopped after the grace period
    rc=0 first=-1 failed_at=-1 running=$n
    while [ "$running" -gt 0 ]; do
        live=" $(jobs -rp | tr '\n' ' ') "
        running=0
        for ((r = 0; r < n; r++)); do
            pid=${pids[$r]}
            [ -n "$pid" ] || continue
            if [[ "$live" == *" $pid "* ]]; then running=$((running + 1)); continue; fi
            s=0
            wait "$pid" || s=$?
            pids[$r]=""
            if [ "$s" -ne 0 ]; then
                { [ "$first" -ge 0 ] && [ "$first" -lt "$r" ]; } || { first=$r; rc=$s; }
                [ "$failed_at" -ge 0 ] || failed_at=$SECONDS
            fi
        done
        if [ "$running" -gt 0 ] && [ "$failed_at" -ge 0 ] && [ $((SECONDS - failed_at)) -ge "$grace" ]; then
            still=""
            for ((r = 0; r < n; r++)); do [ -z "${pids[$r]}" ] || still="$still $r"; done
            echo "run_dist.sh: rank $first failed (exit $rc); stopping rank(s)$still, still running ${grace} s later" >&2
            stop_ranks
            break
        fi
        [ "$running" -eq 0 ] || sleep 0.1
    done
    exit "$rc" ;;
hosts)
    [ $# -ge 2 ] || die "'hosts' needs an OpenMPI hostfile: scripts/run_dist.sh hosts FILE FLAGS..."
    file=$2; shift 2
    [ -r "$file" ] && [ ! -d "$file" ] || die "hostfile '$file' is not a readable file"
    need_trainer
    need mpirun "'hosts' starts the ranks with mpirun, which is not installed here (install OpenMPI)"
    exec mpirun --hostfile "$file" --bind-to none ${MPIRUN_ARGS:-} "$trainer" "$@" ;;
slurm)
    shift
    [ -n "${SLURM_JOB_ID:-}" ] || die "'slurm' runs inside a Slurm allocation (sbatch scripts/slurm_dist.sbatch)"
    need_trainer
    need srun "'slurm' starts the ranks with srun, which is not on PATH"
    if [ "${1:-}" = --pi ]; then
        [ "${2:-}" = fs ] && [ -n "${3:-}" ] || die "slurm --pi takes 'fs DIR' (a directory every node sees)"
        dir=$3; shift 3
        mkdir -p "$dir"
        # each task takes its rank from SLURM_PROCID; rank 0 publishes its address in DIR
        exec srun --mpi=none --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" "$trainer" "$@" -pi fs -pf "$dir"
    fi
    exec srun --mpi=pmix --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" "$trainer" "$@" ;;
'')
    echo "error: run_dist.sh: no mode given (local, hosts or slurm)" >&2
    usage ;;
*)
    echo "error: run_dist.sh: unknown mode '$mode' (local, hosts or slurm)" >&2
    usage ;;
esac
