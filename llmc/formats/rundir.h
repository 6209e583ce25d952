/*
 * rundir.h - one run per output directory (-o), one process per run.
 *
 * A run's files in -o are log.jsonl, model_*.bin, state_*.bin and DONE_* (checkpoint.h), and
 * their temporary versions (*.tmp.<pid>). The trainer takes an exclusive flock on -o/.llmc.lock
 * (which holds its PID) for the whole process, so a second trainer on the same directory stops
 * with an error instead of interleaving its files.
 */
#ifndef LLMC_RUNDIR_H
#define LLMC_RUNDIR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* mkdir -p dir, then the exclusive lock (kept until the process exits); dies if another
 * process holds it, naming the directory and that process's PID. */
void rundir_lock(const char *dir);
/* Number of run files in dir (0 when it does not exist; temporary files are not counted); names
 * gets a short list of them. */
int rundir_run_files(const char *dir, char *names, size_t len);
/* Deletes the run files (DONE_ markers first, so no checkpoint looks complete midway). */
void rundir_remove_run(const char *dir);
/* This machine for the log: host name, CPU model, online cores. */
void rundir_machine(char *host, size_t host_len, char *cpu, size_t cpu_len, int *cores);
/* The git commit this binary was built from (the Makefile's LLMC_GIT_COMMIT), or "unknown". */
const char *llmc_version(void);

#ifdef __cplusplus
}
#endif
#endif
