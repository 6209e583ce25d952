# mlp.mk - the MLP-only test architecture (llmc/models/mlp, llmc/formats/mlpfile, llmc/cpu/mlp,
# llmc/cuda/mlp.cuh) and its tests: it is built from its own files only (docs/ARCHITECTURES.md).
#   build/test/test_mlp_cpu            the CPU model vs dev/reference/train_mlp.py (test/test_mlp_vs_pytorch.sh)
#   build/cudasim/test/test_mlp_cuda   the CUDA block sequence vs the CPU one, through the harness
# (llmc/cpu/mlp.c is in CPU_SRCS by the Makefile's wildcard over llmc/cpu/*.c)
CORE_SRCS += llmc/models/mlp.c llmc/formats/mlpfile.c

TEST_BINS += $(BUILD)/test/test_mlp_cpu
$(BUILD)/test/test_mlp_cpu: $(call obj,test/test_mlp_cpu.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

# the CUDA block sequence vs the CPU one: through the harness (suite: 13-mlp.txt; built by
# `make test-cudasim` with the other SIM_TESTS) and natively with nvcc (`make cuda-tests`)
$(BUILD)/cudasim/test/test_mlp_cuda.cpp: $(CUDA_HDRS)
SIM_TESTS += $(BUILD)/cudasim/test/test_mlp_cuda
ifeq ($(CUDASIM_OK),1)
  TEST_BINS += $(BUILD)/cudasim/test/test_mlp_cuda
endif
$(BUILD)/test/test_mlp_cuda: $(BUILD)/cuda/test/test_mlp_cuda.o $(CUDA_LIBS)
	@mkdir -p $(dir $@)
	$(NVCC) -arch=$(GPU_ARCH) $^ $(CUDA_LDLIBS) -o $@
cuda-tests: $(BUILD)/test/test_mlp_cuda
