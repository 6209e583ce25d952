/*
 * fuzz_cli.c - the trainers' command line (llmc/train/cli.c: train_config_parse).
 *
 * The input is argv[1..]: arguments separated by NUL bytes (at most 64). Promises checked: any
 * argv gives either a configuration (and exit never called) or a clean error (exit 1), or for
 * --help the help text and exit 0; a configuration that is accepted passes the checks the
 * trainers rely on and prints.
 */
#include "llmc/train/cli.h"
#include "test/fuzz/fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_ARGS = 64 };

typedef struct {
    int argc;
    char **argv;
} Input;

static FILE *devnull;

static void parse(void *arg) {
    const Input *in = arg;
    TrainConfig cfg;
    train_config_defaults(&cfg);
    train_config_parse(&cfg, in->argc, in->argv, "train_gpt_cpu");
    if (cfg.B < 1 || cfg.T < 1 || cfg.total_batch < 0 || cfg.num_processes < 1 || cfg.process_rank < 0 ||
        cfg.process_rank >= cfg.num_processes || cfg.gen_tokens < 1 || (cfg.max_steps < 0 && cfg.max_steps != -1)) /* -x 0: evaluation only */
        fuzz_fail("accepted B %d T %d d %lld pn %d pr %d g %d x %d", cfg.B, cfg.T, cfg.total_batch, cfg.num_processes,
                  cfg.process_rank, cfg.gen_tokens, cfg.max_steps);
    const char *strings[] = {cfg.train_pattern, cfg.val_pattern, cfg.init, cfg.output_dir, cfg.tokenizer,
                             cfg.schedule, cfg.precision, cfg.nccl_init, cfg.server_ip, cfg.fs_path};
    const size_t sizes[] = {sizeof cfg.train_pattern, sizeof cfg.val_pattern, sizeof cfg.init, sizeof cfg.output_dir,
                            sizeof cfg.tokenizer, sizeof cfg.schedule, sizeof cfg.precision, sizeof cfg.nccl_init,
                            sizeof cfg.server_ip, sizeof cfg.fs_path};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!memchr(strings[i], 0, sizes[i])) fuzz_fail("string setting %zu is not terminated", i);
    train_config_print(&cfg, 0, devnull);
    train_config_print(&cfg, 1, devnull);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!devnull && !(devnull = fopen("/dev/null", "w"))) fuzz_fail("cannot open /dev/null");
    /* one copy of the bytes, NUL-terminated, cut at each NUL into arguments */
    char *buf = malloc(size + 1);
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[MAX_ARGS + 2] = {"train_gpt_cpu"};
    int argc = 1;
    for (char *p = buf; size > 0 && p <= buf + size && argc <= MAX_ARGS; p += strlen(p) + 1) argv[argc++] = p;
    argv[argc] = NULL;
    Input in = {argc, argv};
    int status = fuzz_call(parse, &in);
    if (status != -1 && status != 0 && status != 1) fuzz_fail("exit status %d", status);
    free(buf);
    return 0;
}
