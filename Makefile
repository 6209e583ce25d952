# llmc - GPT-2/Llama trainer in C and CUDA.
# `make` builds everything this machine supports and prints what it detected.
# Targets: train_gpt_cpu tokenizer train_gpt demo data test bench clean (see README.md).

CC ?= gcc
ifeq ($(CC),cc)
  CC := gcc
endif
BUILD := build
# where the programs (train_gpt_cpu, tokenizer, train_gpt) are written: the repository root unless
# given, e.g. `make BUILD=build/asan BIN_DIR=build/asan/bin` for a second, differently built copy
BIN_DIR := .
PYTHON ?= /usr/bin/python3

.DEFAULT_GOAL := all
# a recipe that fails removes its half-made target (a failed link must not look up to date)
.DELETE_ON_ERROR:

# ---- feature detection (each ✓/✗ is printed by `make`) ---------------------------------
H := \#
try_cc = $(shell printf '$(1)' | $(CC) -x c - -o /dev/null $(2) >/dev/null 2>&1 && echo 1)
HAVE_OPENMP   := $(call try_cc,int main(void){return 0;},-fopenmp)
HAVE_OPENBLAS := $(call try_cc,$(H)include <cblas.h>\nint main(void){cblas_sgemm(0,0,0,0,0,0,0,0,0,0,0,0,0,0);return 0;},-lopenblas)
HAVE_NATIVE   := $(call try_cc,int main(void){return 0;},-march=native)
HAVE_MPI      := $(if $(shell command -v mpicc 2>/dev/null),1,)
NVCC          ?= $(shell command -v nvcc 2>/dev/null)
HAVE_NVCC     := $(if $(NVCC),1,)
CUDA_HOME     ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(NVCC)),/usr/local/cuda)
HAVE_CUDNN    := $(if $(wildcard $(CUDA_HOME)/include/cudnn.h /usr/include/cudnn.h /usr/include/x86_64-linux-gnu/cudnn.h),1,)
HAVE_NCCL     := $(if $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h),1,)
HAVE_PCRE2    := $(call try_cc,$(H)define PCRE2_CODE_UNIT_WIDTH 8\n$(H)include <pcre2.h>\nint main(void){return 0;},-lpcre2-8)

# ---- flags -----------------------------------------------------------------------------
WARN    := -Wall -Wextra -Wundef
ARCH    := $(if $(HAVE_NATIVE),-march=native,)
# CFLAGS and LDFLAGS are the user's (environment or command line: `make CFLAGS=-O1 ...`); the
# project appends its own flags with `override`, so a command-line CFLAGS adds to them instead of
# replacing them. Both reach every C and C++ (cudasim) compile and link line; sanitizer flags in
# CFLAGS (SANITIZE_FLAGS) reach the C++ harness builds too. nvcc builds take neither.
CFLAGS  ?= -O3
LDFLAGS ?=
SANITIZE_FLAGS := $(filter -fsanitize% -fno-sanitize% -fno-omit-frame-pointer,$(CFLAGS))
# -fno-math-errno: libm calls never set errno, so sqrtf and friends vectorise (same results).
override CFLAGS  += -std=c11 $(WARN) $(ARCH) -fno-math-errno -D_GNU_SOURCE -I. -MMD -MP
LDLIBS  := -lm -lpthread -lz
ifeq ($(HAVE_OPENMP),1)
  override CFLAGS += -fopenmp
  LDLIBS += -fopenmp
endif
# Prefer Debian's OpenMP build of OpenBLAS: it shares our OpenMP threads instead of running a
# second pool that spins against them (on 2 cores that costs more than half the speed).
OPENBLAS_OMP_DIR := $(firstword $(wildcard /usr/lib/*/openblas-openmp))
ifeq ($(HAVE_OPENBLAS),1)
  override CFLAGS += -DLLMC_USE_OPENBLAS=1
  ifneq ($(OPENBLAS_OMP_DIR),)
    LDLIBS += -L$(OPENBLAS_OMP_DIR) -Wl,-rpath,$(OPENBLAS_OMP_DIR) -lopenblas
  else
    LDLIBS += -lopenblas
  endif
else
  override CFLAGS += -DLLMC_USE_OPENBLAS=0
endif
override CFLAGS  += -DLLMC_HAVE_PCRE2=$(if $(HAVE_PCRE2),1,0)
# liburing (io_uring) for --offload-device nvme's reads and writes; without it they are synchronous
HAVE_LIBURING := $(call try_cc,$(H)include <liburing.h>\nint main(void){struct io_uring r;return io_uring_queue_init(1,&r,0);},-luring)
override CFLAGS  += -DLLMC_HAVE_LIBURING=$(if $(HAVE_LIBURING),1,0)
ifeq ($(HAVE_LIBURING),1)
  LDLIBS += -luring
endif
# glibc's vector math library (vector tanhf for GELU), when this CPU and libc have it
HAVE_LIBMVEC  := $(call try_cc,$(H)include <immintrin.h>\n__m256 _ZGVdN8v_tanhf(__m256);\nint main(void){return (int)_mm256_cvtss_f32(_ZGVdN8v_tanhf(_mm256_set1_ps(0.5f)));},$(ARCH) -lmvec)
override CFLAGS  += -DLLMC_HAVE_LIBMVEC=$(if $(HAVE_LIBMVEC),1,0)
ifeq ($(HAVE_LIBMVEC),1)
  LDLIBS += -lmvec
endif

# ---- sources ---------------------------------------------------------------------------
# CORE_SRCS: the shared llmc/ core (both trainers, tools and tests link it).
# CPU_SRCS:  the CPU backend (ops and model sequencing).
# mk/*.mk fragments add to CORE_SRCS, BINS, TEST_BINS and define their own targets.
CORE_SRCS := llmc/core/check.c llmc/core/tensor.c llmc/core/sumfile.c llmc/core/atomicfile.c llmc/core/logger.c llmc/core/rng.c \
             llmc/core/optstate.c llmc/core/mem.c llmc/data/shard.c llmc/models/gpt2.c llmc/models/llama.c \
             llmc/formats/modelfile.c llmc/formats/llmcfile.c llmc/formats/statefile.c llmc/formats/rundir.c llmc/dist/dist.c llmc/generate/sampler.c \
             llmc/train/cli.c llmc/train/schedule.c llmc/train/train.c llmc/train/checkpoint.c llmc/train/report.c \
             llmc/train/optim.c llmc/train/hostopt.c llmc/train/plan.c llmc/cpu/adamw.c llmc/data/evalfile.c \
             llmc/train/eval.c llmc/train/adafactor.c llmc/cpu/adafactor.c llmc/train/gradcomp.c llmc/train/nvme.c
# (llmc/cpu/adamw.c and adafactor.c are the core's: the loop's optimizers, llmc/train/optim.c and
# adafactor.c, run them)
CPU_SRCS  := $(filter-out llmc/cpu/adamw.c llmc/cpu/adafactor.c,$(wildcard llmc/cpu/*.c))
BINS      := train_gpt_cpu
TEST_BINS :=
PHONY     :=

obj = $(patsubst %.c,$(BUILD)/%.o,$(1))

# mk/cudasim.mk first: the other CUDA fragments use its CUDASIM_OK and CUDASIM_LIB when read.
include mk/cudasim.mk
-include $(filter-out mk/cudasim.mk,$(sort $(wildcard mk/*.mk)))

CORE_OBJS := $(call obj,$(CORE_SRCS))
CPU_OBJS  := $(call obj,$(CPU_SRCS))

.PHONY: all features test clean demo bench FORCE $(PHONY)
BIN_PATHS := $(addprefix $(BIN_DIR)/,$(BINS))
all: features $(BIN_PATHS)
ifneq ($(BIN_DIR),.)
# `make train_gpt_cpu` still names the program, wherever BIN_DIR puts it
.PHONY: $(BINS)
$(BINS): %: $(BIN_DIR)/%
endif

features:
	@echo "features detected by make:"
	@echo "  $(if $(HAVE_OPENMP),✓,✗) OpenMP   $(if $(HAVE_OPENMP),,(apt-get install libgomp1; CPU ops run single-threaded))"
	@echo "  $(if $(HAVE_OPENBLAS),✓,✗) OpenBLAS $(if $(HAVE_OPENBLAS),$(if $(OPENBLAS_OMP_DIR),(OpenMP build),(pthread build: apt-get install libopenblas-openmp-dev is faster)),(apt-get install libopenblas-openmp-dev; using the built-in blocked matmul))"
	@echo "  $(if $(HAVE_NATIVE),✓,✗) -march=native"
	@echo "  $(if $(HAVE_LIBMVEC),✓,✗) libmvec  $(if $(HAVE_LIBMVEC),(vector tanhf for GELU),(scalar tanhf))"
	@echo "  $(if $(HAVE_PCRE2),✓,✗) PCRE2    $(if $(HAVE_PCRE2),,(apt-get install libpcre2-dev; needed by ./tokenizer))"
	@echo "  $(if $(HAVE_LIBURING),✓,✗) liburing $(if $(HAVE_LIBURING),(io_uring for --offload-device nvme),(apt-get install liburing-dev; --offload-device nvme reads and writes synchronously))"
	@echo "  $(if $(HAVE_CJSON),✓,✗) cJSON    $(if $(HAVE_CJSON),(Hugging Face directories: -e DIR, --save-hf, ./hf_convert),(apt-get install libcjson-dev; needed for Hugging Face directories and ./hf_convert))"
	@echo "  $(if $(HAVE_MPI),✓,✗) MPI      $(if $(HAVE_MPI),(train_gpt_cpu runs data-parallel under mpirun/srun),(apt-get install openmpi-bin libopenmpi-dev for mpirun/srun; without it train_gpt_cpu runs data-parallel with -pi tcp|fs))"
	@echo "  $(if $(HAVE_NVCC),✓,✗) nvcc     $(if $(HAVE_NVCC),$(NVCC),(CUDA toolkit not found; ./train_gpt and ./generate_gpu not built))"
	@echo "  $(if $(HAVE_CUDNN),✓,✗) cuDNN    $(if $(HAVE_CUDNN),(used by make train_gpt USE_CUDNN=1),)"
	@echo "  $(if $(HAVE_NCCL),✓,✗) NCCL     $(if $(HAVE_NCCL),found (./train_gpt trains data-parallel: -pi tcp|fs, with MPI also under mpirun/srun),(./train_gpt runs one process))"

# The git commit the binaries are built from (llmc_version(), logged in log.jsonl); only
# rundir.o is rebuilt when it changes. "unknown" outside a git checkout.
LLMC_GIT_COMMIT := $(shell test -e .git && git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
$(BUILD)/.git_commit: FORCE
	@mkdir -p $(BUILD)
	@echo '$(LLMC_GIT_COMMIT)' | cmp -s - $@ || echo '$(LLMC_GIT_COMMIT)' > $@
$(BUILD)/llmc/formats/rundir.o: $(BUILD)/.git_commit
$(BUILD)/llmc/formats/rundir.o: override CFLAGS += -DLLMC_GIT_COMMIT='"$(LLMC_GIT_COMMIT)"'

# Objects depend on the flags they were compiled with (rebuilt when a feature appears), and so
# through the libraries do the programs (LDFLAGS are in the stamp so that they relink too).
$(BUILD)/.cflags: FORCE
	@mkdir -p $(BUILD)
	@echo '$(CC) $(CFLAGS) $(LDFLAGS)' | cmp -s - $@ || echo '$(CC) $(CFLAGS) $(LDFLAGS)' > $@
FORCE:

$(BUILD)/%.o: %.c $(BUILD)/.cflags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libllmc.a: $(CORE_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libllmc_cpu.a: $(CPU_OBJS)
	@rm -f $@
	ar rcs $@ $^

# With MPI the CPU trainer links llmc/dist/dist.c compiled against MPI (dist_mpi.o, ahead of the
# archive's single-process dist.o) through mpicc, which wraps $(CC); every other program keeps the
# single-process build.
ifeq ($(HAVE_MPI),1)
MPICC := OMPI_CC=$(CC) mpicc
$(BUILD)/llmc/dist/dist_mpi.o: llmc/dist/dist.c $(BUILD)/.cflags
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -DLLMC_HAVE_MPI=1 -c $< -o $@
$(BIN_DIR)/train_gpt_cpu: $(call obj,train_gpt.c) $(BUILD)/llmc/dist/dist_mpi.o $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@
else
$(BIN_DIR)/train_gpt_cpu: $(call obj,train_gpt.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@
endif

# `make test`: check dependencies (install them when root), build, run every suite (its end: the
# ten slowest commands, then "N passed, M failed"). The build uses every core unless make was given -j.
TEST_JOBS = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(shell nproc))
test:
	@scripts/deps.sh --test
	@$(MAKE) --no-print-directory $(TEST_JOBS) features $(BIN_PATHS) $(TEST_BINS)
	@test/run_tests.sh $(FILTER)

# The main job: tiny Shakespeare, a 4-layer 256-channel GPT-2 from scratch on this CPU, samples.
# (--overwrite 1: each `make demo` is a new run in out/demo)
DEMO_FLAGS := -e d4 -b 16 -t 64 -x 600 -l 2e-3 -u 20 -q 0.1 -c 0.1 -v 100 -m 16 -s 300 -g 96 -o out/demo --overwrite 1
demo:
	@scripts/deps.sh build
	@$(MAKE) --no-print-directory features train_gpt_cpu data
	./train_gpt_cpu $(DEMO_FLAGS)

bench: train_gpt_cpu
	@scripts/deps.sh test
	scripts/bench_cpu.sh

# benchmark, not a test: --offload-device nvme against cpu for GPT-2 124M, the disk measured with dd (scripts/bench_nvme.sh)
.PHONY: bench-nvme
bench-nvme: train_gpt_cpu
	scripts/bench_nvme.sh

# `make print-VAR` prints a variable's value (scripts build variants with the same flags)
print-%:
	@echo '$($*)'

clean:
	rm -rf $(BUILD) $(BIN_PATHS)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
