# cudasim - compile CUDA sources with g++ and run their kernels on the CPU (test/cudasim/README.md).
#
# A CUDA test `test/foo.cu` (or any .cu, including ones that #include "llmc/cuda/x.cuh") becomes
# a host binary with:   make build/cudasim/test/foo      then run   build/cudasim/test/foo
#   build/cudasim/%.cpp : %.cu   translate (cu2cpp.py: launches, __shared__, inlined .cuh)
#   build/cudasim/%     : build/cudasim/%.cpp + the harness library
# Variables for other fragments: CUDASIM_CXXFLAGS (it carries the sanitizer flags of CFLAGS),
# CUDASIM_LIB, CUDASIM_LDLIBS, CUDASIM_OK (1 when the CUDA headers the harness compiles against
# are present).
# `make test-cudasim` builds everything the suite commands naming cudasim run (the harness
# self-tests, mk/cuda.mk's SIM_TESTS, mk/cuda_lab.mk's lab binaries) and runs those commands
# (ends "N passed, M failed").
# test/test_make_targets.sh checks that this list covers every binary they run.

CXX ?= g++
ifeq ($(CXX),c++)
  CUDASIM_CXX := g++
else
  CUDASIM_CXX := $(CXX)
endif
CUDASIM_DIR      := test/cudasim
CUDASIM_OK       := $(if $(wildcard $(CUDA_HOME)/include/cuda_runtime.h),1,)
CUDASIM_CXXFLAGS := -std=c++17 -O2 -g -fno-strict-aliasing -Wall -Wextra -Wundef -D_GNU_SOURCE -I. \
                    -I$(CUDASIM_DIR)/include -isystem $(CUDA_HOME)/include -MMD -MP $(SANITIZE_FLAGS)
CUDASIM_LDLIBS   := -lm -lpthread
CUDASIM_LIB      := $(BUILD)/cudasim-rt/libcudasim.a
CUDASIM_RT_SRCS  := $(CUDASIM_DIR)/runtime.cpp $(CUDASIM_DIR)/blas.cpp $(CUDASIM_DIR)/nccl.cpp
CUDASIM_RT_OBJS  := $(patsubst $(CUDASIM_DIR)/%.cpp,$(BUILD)/cudasim-rt/%.o,$(CUDASIM_RT_SRCS))
CUDASIM_TESTS    := $(patsubst %.cu,$(BUILD)/cudasim/%,$(wildcard $(CUDASIM_DIR)/tests/*.cu))

ifeq ($(CUDASIM_OK),1)
  TEST_BINS += $(CUDASIM_TESTS)
endif
PHONY += test-cudasim cudasim-nvcc-check

# (rebuilt when CFLAGS change: they carry the sanitizer flags, SANITIZE_FLAGS)
$(BUILD)/cudasim-rt/%.o: $(CUDASIM_DIR)/%.cpp $(BUILD)/.cflags
	@mkdir -p $(dir $@)
	$(CUDASIM_CXX) $(CUDASIM_CXXFLAGS) -c $< -o $@

$(CUDASIM_LIB): $(CUDASIM_RT_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/cudasim/%.cpp: %.cu $(CUDASIM_DIR)/cu2cpp.py
	@mkdir -p $(dir $@)
	$(PYTHON) $(CUDASIM_DIR)/cu2cpp.py $< -o $@ -I .

$(BUILD)/cudasim/%: $(BUILD)/cudasim/%.cpp $(CUDASIM_LIB)
	$(CUDASIM_CXX) $(CUDASIM_CXXFLAGS) $(LDFLAGS) -I$(dir $*) $< -o $@ $(CUDASIM_LIB) $(CUDASIM_LDLIBS)

# keep the translated sources (they are what gdb and the error messages' #line refer back to)
.PRECIOUS: $(BUILD)/cudasim/%.cpp

# (./train_gpt_cpu: test/test_allocator.py checks that the CPU trainer refuses --memory-snapshot)
test-cudasim: $(BIN_DIR)/train_gpt_cpu
ifeq ($(CUDASIM_OK),1)
	@$(MAKE) --no-print-directory $(CUDASIM_TESTS) $(SIM_TESTS) $(LAB_SIM_BINS)
	@test/run_tests.sh cudasim
else
	@echo "cudasim: CUDA headers not found under $(CUDA_HOME)/include; skipping"
endif

# The self-tests are ordinary CUDA: check that the real toolchain accepts them too.
cudasim-nvcc-check:
	@for f in $(CUDASIM_DIR)/tests/*.cu; do \
	  $(NVCC) -arch=sm_90 -std=c++17 -I. -c $$f -o /dev/null && echo "nvcc ok: $$f" || exit 1; done
