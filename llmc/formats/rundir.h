/*
 * rundir.h - one run per output directory (-o), one process per run.
 *
 * A run's files in -o are log.jsonl, model_*.bin (+ .sum), state_*.bin (statefile.h) and DONE_*,
 * and their temporary versions (*.tmp.<pid>). The trainer takes an exclusive flock on
 * -o/.llmc.lock (which holds its PID) for the whole process, so a second trainer on the same
 * directory stops with an error instead of interleaving its files.
 * Directory layout in -o: model_%08d.bin, state_%08d_%05d.bin (per rank), DONE_%08d written
 * last (it holds the resolved configuration as text); only steps with a DONE file are complete.
 * Every file is written atomically.
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

/* Checkpoint directory helpers. rundir_hf_dir: the HF directory --save-hf writes beside
 * checkpoint step, "<run_dir>/model_%08d_hf". */
void rundir_hf_dir(const char *run_dir, int step, char *out, size_t len);
void checkpoint_paths(const char *dir, int step, int rank, char *model, char *state, char *done, size_t len);
int checkpoint_latest_step(const char *dir);  /* highest step with a DONE file, or -1 */
/* Writes DONE_<step> holding text: the run's resolved configuration (cli.h's
 * train_config_to_text), which a resume compares with its own. */
void checkpoint_mark_done(const char *dir, int step, const char *text);
/* The text of DONE_<step> (malloc'd, NUL-terminated; free it), or NULL when the marker is empty
 * (written by llm.c or an older llmc) or unreadable. */
char *checkpoint_read_done(const char *dir, int step);
/* Deletes complete checkpoints beyond the newest `keep`, sparing multiples of `major` and the
 * step `protect` (the newest checkpoint known to be healthy; -1 = none). */
void checkpoint_prune(const char *dir, int keep, int major, int rank, int protect);

#ifdef __cplusplus
}
#endif
#endif
