# mlp.mk - the MLP-only test architecture (llmc/models/mlp, llmc/formats/mlpfile, llmc/cpu/mlp,
# llmc/cuda/mlp.cuh) and its tests: it is built from its own files only (docs/ARCHITECTURES.md).
#   build/test/test_mlp_cpu            the CPU model vs dev/reference/train_mlp.py (test/test_mlp_vs_pytorch.sh)
#   build/cudasim/test/test_mlp_cuda   the CUDA block sequence vs the CPU one, through the harness
# (llmc/cpu/mlp.c is in CPU_SRCS by the Makefile's wildcard over llmc/cpu/*.c)
CORE_SRCS += llmc/models/mlp.c llmc/formats/mlpfile.c

TEST_BINS += $(BUILD)/test/test_mlp_cpu
$(BUILD)/test/test_mlp_cpu: $(call obj,test/test_mlp_cpu.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@
