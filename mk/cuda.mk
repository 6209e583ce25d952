# cuda.mk - the GPU trainer ./train_gpt, the CUDA tests (native with nvcc, and through the
# cudasim harness on machines without a GPU), the kernel lab in dev/cuda and `make bench-gpu`.
#
#   make train_gpt                  nvcc build for sm_90 (GPU_ARCH=sm_80 ... to change)
#   make cuda-tests                 native test binaries build/test/test_cuda_ops, test_gpt
#   make build/cudasim/test/test_cuda_ops build/cudasim/test/test_gpt   harness builds (CI)
#   make bench-gpu                  scripts/bench_gpu.sh (needs a GPU)
# Without nvcc nothing here is built by `make` (the harness builds need only the CUDA headers).

GPU_ARCH    ?= sm_90
# everything a CUDA translation unit may include (the shared core's headers as well)
CUDA_HDRS   := $(wildcard llmc/cuda/*.cuh llmc/*/*.h)
NVCCFLAGS   := -O3 -std=c++17 -arch=$(GPU_ARCH) -I. -Xcompiler -Wall,-Wextra -DLLMC_HAVE_PCRE2=$(if $(HAVE_PCRE2),1,0)
# LDLIBS as nvcc understands them (OpenMP and -Wl options through the host compiler), after the
# sanitizer flags of CFLAGS and LDFLAGS (so that an ASan-built libllmc.a links here too)
comma := ,
# (nvcc splits -Xcompiler values at commas: -fsanitize=a,b goes as -fsanitize=a -fsanitize=b)
san_split       = $(foreach f,$(1),$(if $(and $(findstring sanitize,$(f)),$(findstring =,$(f))),$(foreach v,$(subst $(comma), ,$(word 2,$(subst =, ,$(f)))),$(word 1,$(subst =, ,$(f)))=$(v)),$(f)))
nvcc_host_flags = $(foreach f,$(call san_split,$(1)),$(if $(filter -Wl$(comma)%,$(f)),-Xlinker $(patsubst -Wl$(comma)%,%,$(f)),$(if $(filter -f% -static%,$(f)),-Xcompiler $(f),$(f))))
CUDA_LDLIBS = $(call nvcc_host_flags,$(SANITIZE_FLAGS) $(LDFLAGS) $(LDLIBS)) -lcublasLt -lcudart
CUDA_LIBS   := $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
CUDA_TESTS  := $(BUILD)/test/test_cuda_ops $(BUILD)/test/test_gpt
SIM_TESTS   := $(BUILD)/cudasim/test/test_cuda_ops $(BUILD)/cudasim/test/test_gpt $(BUILD)/cudasim/test/test_lt_plans \
               $(BUILD)/cudasim/train_gpt
PHONY       += cuda-tests bench-gpu gpu-check

ifeq ($(HAVE_NVCC),1)
  BINS += train_gpt
endif
ifeq ($(CUDASIM_OK),1)
  TEST_BINS += $(SIM_TESTS)
endif

# ptxas's resource report (registers, stack, spills per kernel) is kept beside each object as
# OBJ.ptxas (test/test_sass.sh reads train_gpt.o's); everything else nvcc prints still shows.
$(BUILD)/cuda/%.o: %.cu $(CUDA_HDRS)
	@mkdir -p $(dir $@)
	@$(if $(findstring s,$(firstword -$(MAKEFLAGS))),:,echo '$(NVCC) $(NVCCFLAGS) -Xptxas -v -c $< -o $@')
	@$(NVCC) $(NVCCFLAGS) -Xptxas -v -c $< -o $@ 2> $@.ptxas.tmp; rc=$$?; \
	  grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' $@.ptxas.tmp >&2; mv $@.ptxas.tmp $@.ptxas; exit $$rc

# Data parallelism needs NCCL; with MPI (llmc/dist/dist.c's MPI build, dist_mpi.o, ahead of the
# archive's dist.o) the ranks come from mpirun/srun (-pi mpi), in every build from -pi tcp | fs.
# Without NCCL ./train_gpt runs one process.
TRAIN_GPT_DP := $(if $(HAVE_NCCL),1,)
TRAIN_GPT_MPI := $(if $(and $(HAVE_MPI),$(HAVE_NCCL)),1,)
ifeq ($(TRAIN_GPT_DP),1)
$(BUILD)/cuda/train_gpt.o: NVCCFLAGS += -DLLMC_HAVE_NCCL=1
endif
$(BIN_DIR)/train_gpt: $(BUILD)/cuda/train_gpt.o $(if $(TRAIN_GPT_MPI),$(BUILD)/llmc/dist/dist_mpi.o) $(CUDA_LIBS)
	@mkdir -p $(dir $@)
	$(NVCC) -arch=$(GPU_ARCH) $^ $(CUDA_LDLIBS) $(if $(TRAIN_GPT_MPI),$(shell mpicc --showme:link)) $(if $(TRAIN_GPT_DP),-lnccl) -o $@

$(BIN_DIR)/generate_gpu: $(BUILD)/cuda/generate.o $(CUDA_LIBS)
	@mkdir -p $(dir $@)
	$(NVCC) -arch=$(GPU_ARCH) $^ $(CUDA_LDLIBS) -o $@

$(BUILD)/test/test_cuda_ops: $(BUILD)/cuda/test/test_cuda_ops.o $(CUDA_LIBS)
	@mkdir -p $(dir $@)
	$(NVCC) -arch=$(GPU_ARCH) $^ $(CUDA_LDLIBS) -o $@

$(BUILD)/test/test_gpt: $(BUILD)/cuda/test/test_gpt.o $(CUDA_LIBS)
	@mkdir -p $(dir $@)
	$(NVCC) -arch=$(GPU_ARCH) $^ $(CUDA_LDLIBS) -o $@

cuda-tests: $(CUDA_TESTS)

# harness builds: the translation depends on every llmc/cuda header it inlines; the link adds
# the CPU reference ops and the shared core
$(BUILD)/cudasim/test/test_cuda_ops.cpp $(BUILD)/cudasim/test/test_gpt.cpp $(BUILD)/cudasim/test/test_lt_plans.cpp: $(CUDA_HDRS)
# test_cuda_ops.cu includes the Llama ops' tests
$(BUILD)/cudasim/test/test_cuda_ops.cpp $(BUILD)/cuda/test/test_cuda_ops.o: test/cuda_llama_ops.h
$(BUILD)/cudasim/test/%: $(BUILD)/cudasim/test/%.cpp $(CUDASIM_LIB) $(CUDA_LIBS)
	$(CUDASIM_CXX) $(CUDASIM_CXXFLAGS) $(LDFLAGS) -Wno-unknown-pragmas -DLLMC_HAVE_PCRE2=$(if $(HAVE_PCRE2),1,0) $< -o $@ $(CUDA_LIBS) $(CUDASIM_LIB) $(CUDASIM_LDLIBS) $(LDLIBS)

bench-gpu: train_gpt
	scripts/bench_gpu.sh

gpu-check:
	scripts/gpu_check.sh

# the kernel lab: build/dev/cuda/NAME from dev/cuda/NAME.cu (includes the real llmc/cuda header);
# dev/cuda/cudnn_*.cu need cuDNN and are mk/cudnn.mk's (USE_CUDNN=1 only)
CUDA_LAB := $(patsubst dev/cuda/%.cu,$(BUILD)/dev/cuda/%,$(filter-out dev/cuda/cudnn_%,$(wildcard dev/cuda/*.cu)))
PHONY    += cuda-lab
cuda-lab: $(CUDA_LAB)
$(BUILD)/dev/cuda/%: $(BUILD)/cuda/dev/cuda/%.o $(CUDA_LIBS)
	@mkdir -p $(dir $@)
	$(NVCC) -arch=$(GPU_ARCH) $^ $(CUDA_LDLIBS) -o $@
.PRECIOUS: $(BUILD)/cuda/dev/cuda/%.o

# ./train_gpt and ./generate_gpu themselves through the harness (end-to-end runs on the CPU)
$(BUILD)/cudasim/train_gpt.cpp $(BUILD)/cudasim/generate.cpp: $(CUDA_HDRS)
$(BUILD)/cudasim/generate: $(BUILD)/cudasim/generate.cpp $(CUDASIM_LIB) $(CUDA_LIBS)
	$(CUDASIM_CXX) $(CUDASIM_CXXFLAGS) $(LDFLAGS) -Wno-unknown-pragmas -DLLMC_HAVE_PCRE2=$(if $(HAVE_PCRE2),1,0) $< -o $@ $(CUDA_LIBS) $(CUDASIM_LIB) $(CUDASIM_LDLIBS) $(LDLIBS)
# (with MPI: data-parallel through cudasim's multi-rank NCCL, test/cudasim/nccl.cpp)
$(BUILD)/cudasim/train_gpt: $(BUILD)/cudasim/train_gpt.cpp $(CUDASIM_LIB) $(CUDA_LIBS) $(if $(HAVE_MPI),$(BUILD)/llmc/dist/dist_mpi.o)
	$(CUDASIM_CXX) $(CUDASIM_CXXFLAGS) $(LDFLAGS) -Wno-unknown-pragmas -DLLMC_HAVE_PCRE2=$(if $(HAVE_PCRE2),1,0) \
	  $(if $(HAVE_MPI),-DLLMC_HAVE_NCCL=1) $< -o $@ $(if $(HAVE_MPI),$(BUILD)/llmc/dist/dist_mpi.o $(shell mpicc --showme:link)) \
	  $(CUDA_LIBS) $(CUDASIM_LIB) $(CUDASIM_LDLIBS) $(LDLIBS)

# The harness compile and link lines, for scripts that build variants of a CUDA test
# (test/test_cudasim_mutants.sh).
PHONY += cudasim-build-cmd
cudasim-build-cmd:
	@echo '$(CUDASIM_CXX) $(CUDASIM_CXXFLAGS) $(LDFLAGS) -Wno-unknown-pragmas -DLLMC_HAVE_PCRE2=$(if $(HAVE_PCRE2),1,0)'
	@echo '$(CUDA_LIBS) $(CUDASIM_LIB) $(CUDASIM_LDLIBS) $(LDLIBS)'
