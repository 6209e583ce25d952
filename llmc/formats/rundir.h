/*
 * rundir.h - one run per output directory (-o), one process per run.
 *
 * The run files: the exact names the trainers write in -o, one table (rundir_file_kind) that both
 * "does -o hold a run?" and every deletion (--overwrite 1, -y 1 starting over, stale temporary
 * files) use. Nothing else in -o is ever deleted or counted as a run:
 *   log.jsonl                        the log (regular file)
 *   model_SSSSSSSS.bin (+ .sum)      the model of step S and its checksum file (regular files)
 *   state_SSSSSSSS_RRRRR.bin         the training state of step S (rank R; regular file)
 *   DONE_SSSSSSSS                    written last: step S is complete (regular file)
 *   model_SSSSSSSS_hf/               --save-hf's Hugging Face directory (a directory)
 *   adapter_SSSSSSSS/                a LoRA run's adapter of step S, PEFT's format (a directory; the
 *                                    run writes no model_ file then)
 *   <any of these>.tmp.<pid>         its temporary version (atomicfile.h), and
 *   model_SSSSSSSS_hf.old.tmp.<pid>  an HF directory being replaced (adapter_SSSSSSSS.old.tmp.<pid>: an adapter's)
 * S is the step as %08d writes it (8 digits, more only past 99999999), R the rank as %05d;
 * case counts. A look-alike (model_base.bin, model_1.bin, model_00000002.bin.bak, DONE_x,
 * MODEL_00000002.BIN, ...) is not ours. A run file's name on the wrong kind of entry (a directory
 * named model_00000002.bin, a symbolic link named log.jsonl) is refused at start, never deleted.
 * The -e input is never deleted: a command that would have to (--overwrite 1, or -y 1 starting over,
 * with -e a run file of -o or inside one of its HF directories) stops with an error first.
 * Besides the run files, -o holds .llmc.lock (below; kept) and the CUDA trainer's matmul algorithm
 * cache matmul_algos.txt (kept: it describes the GPU, not the run; a dead process's temporary
 * version of it is removed with the run's).
 *
 * The trainer takes an exclusive flock on -o/.llmc.lock (which holds its PID) for the whole
 * process, so a second trainer on the same directory stops with an error instead of interleaving
 * its files. Only steps with a DONE file are complete; DONE_ holds the resolved configuration as
 * text. Every file is written atomically.
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
/* What a name in -o is to a run (the table above); RUN_FILE_NONE: not a run's name. *step gets its
 * step (may be NULL), *temp 1 for a temporary version (may be NULL). */
typedef enum { RUN_FILE_NONE, RUN_FILE_LOG, RUN_FILE_MODEL, RUN_FILE_SUM, RUN_FILE_STATE, RUN_FILE_DONE, RUN_FILE_HF,
               RUN_FILE_ADAPTER } RunFileKind;
RunFileKind rundir_file_kind(const char *name, int *step, int *temp);
/* Number of run files in dir (0 when it does not exist; temporary files are not counted); names
 * gets a short list of them. Dies when a run file's name is on the wrong kind of entry (a
 * directory, a symbolic link, a FIFO where the run writes a regular file; anything but a
 * directory for model_SSSSSSSS_hf), naming it: no run could write there, nor delete it. */
int rundir_run_files(const char *dir, char *names, size_t len);
/* Removes the temporary run files (rundir_file_kind's; and those of matmul_algos.txt) of processes
 * that no longer run. */
int rundir_remove_stale(const char *dir);
/* Dies, deleting nothing, when rundir_remove_run(dir, keep, why) could not delete the run whole:
 * keep (the -e input; NULL or a name that is no file: none) is one of its files, or inside one of
 * its HF directories. why names the flag that deletes (in the message). */
void rundir_check_removable(const char *dir, const char *keep, const char *why);
/* Deletes the run files (DONE_ markers first, so no checkpoint looks complete midway), after
 * rundir_check_removable. Temporary files are left to rundir_remove_stale. */
void rundir_remove_run(const char *dir, const char *keep, const char *why);
/* This machine for the log: host name, CPU model, online cores. */
void rundir_machine(char *host, size_t host_len, char *cpu, size_t cpu_len, int *cores);
/* The git commit this binary was built from (the Makefile's LLMC_GIT_COMMIT), or "unknown". */
const char *llmc_version(void);

/* Checkpoint directory helpers. rundir_hf_dir: the HF directory --save-hf writes beside
 * checkpoint step, "<run_dir>/model_%08d_hf". */
void rundir_hf_dir(const char *run_dir, int step, char *out, size_t len);
/* The LoRA adapter directory of checkpoint step (PEFT's format, llmc/formats/adapter.h), "<run_dir>/adapter_%08d". */
void rundir_adapter_dir(const char *run_dir, int step, char *out, size_t len);
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
