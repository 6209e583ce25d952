# fuzz.mk - libFuzzer targets for every parser of outside data (test/fuzz/fuzz_NAME.c; how to
# run, add a target and keep a crash as a regression input: docs/FUZZING.md).
#
#   make fuzz                                  build every target: build/fuzz/fuzz_NAME
#   build/fuzz/fuzz_NAME test/fuzz/corpus/NAME  fuzz (Ctrl-C to stop); see docs/FUZZING.md
#   test/test_fuzz.sh                          the short CI run of every target (make test)
#
# Built with clang (FUZZ_CC; Debian: clang and libclang-rt-dev, which holds libFuzzer) and
# ASan + UBSan, into $(BUILD)/fuzz, apart from the gcc build: the llmc core is compiled again
# here with coverage instrumentation. OpenBLAS, OpenMP and the CPU ops are not needed: no
# target calls them. The link wraps exit and the calls that acquire resources (FUZZ_WRAP, see
# test/fuzz/fuzz.h) so that a clean `error: ...` exit inside a parser returns to the fuzzer.
# Not part of `make` or `make test`'s build step: test/test_fuzz.sh builds it when it runs.

FUZZ_CC      ?= clang
FUZZ_DIR     := $(BUILD)/fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS  := -g -O1 -std=c11 -Wall -Wextra -Wundef -D_GNU_SOURCE -I. -MMD -MP $(FUZZ_SAN) \
                -DLLMC_USE_OPENBLAS=0 -DLLMC_HAVE_PCRE2=1 -DLLMC_HAVE_LIBMVEC=0 -DLLMC_HAVE_CJSON=1
fuzz_comma   := ,
FUZZ_WRAP    := $(addprefix -Wl$(fuzz_comma)--wrap=,exit malloc calloc realloc free fopen fclose open close mmap munmap glob globfree)
FUZZ_LDLIBS  := -lpcre2-8 -lcjson -lz -lm -lpthread
# the shared core (llmc/*.c, all of it but the CPU and CUDA backends: an archive member is linked
# only when a target needs it), with the CPU files the core itself holds (CORE_SRCS: the optimizers'
# math, which --grad-compression's table of matrices reaches from cli.c)
FUZZ_CORE    := $(patsubst %.c,$(FUZZ_DIR)/%.o,$(filter-out llmc/cpu/% llmc/cuda/%,$(wildcard llmc/*/*.c)) \
                  $(filter llmc/cpu/%,$(CORE_SRCS)))
FUZZ_TARGETS := $(patsubst test/fuzz/%.c,$(FUZZ_DIR)/%,$(filter-out test/fuzz/fuzz_common.c,$(wildcard test/fuzz/fuzz_*.c)))
PHONY        += fuzz

fuzz: $(FUZZ_TARGETS)

# objects depend on the compiler and flags they were built with, like the gcc build's
$(FUZZ_DIR)/.cflags: FORCE
	@mkdir -p $(FUZZ_DIR)
	@echo '$(FUZZ_CC) $(FUZZ_CFLAGS)' | cmp -s - $@ || echo '$(FUZZ_CC) $(FUZZ_CFLAGS)' > $@

# the core and the targets get coverage instrumentation; libFuzzer's main comes at the link
$(FUZZ_DIR)/%.o: %.c $(FUZZ_DIR)/.cflags
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/libllmc.a: $(FUZZ_CORE)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/test/fuzz/fuzz_%.o $(FUZZ_DIR)/test/fuzz/fuzz_common.o $(FUZZ_DIR)/libllmc.a
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer $(LDFLAGS) $^ $(FUZZ_WRAP) $(FUZZ_LDLIBS) -o $@

.PRECIOUS: $(FUZZ_DIR)/%.o
