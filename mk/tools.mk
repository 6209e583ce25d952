# tools.mk - ./generate (continue a prompt with a trained model, CPU) and its KV-cache test.
# Read after tokenizer.mk (sorted order), whose TOK_PCRE2 says whether the tokenizer is built:
# ./generate needs it to encode prompts and decode tokens.
# The front end (llmc/generate/generate.c: flags, prompt, sampling) is in the core library; generate.c
# adds the CPU model, generate.cu the CUDA one (./generate_gpu, mk/cuda.mk), as the trainers.
ifeq ($(TOK_PCRE2),1)
CORE_SRCS += llmc/generate/generate.c
BINS      += generate
TEST_BINS += $(BUILD)/test/test_decode

$(BIN_DIR)/generate: $(call obj,generate.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

# ./generate_gpu (generate.cu; its nvcc rule is mk/cuda.mk's) where nvcc exists. In CI its
# harness build build/cudasim/generate runs against ./generate (test/suite.d/17-generate.txt),
# so `make test-cudasim` builds those three (SIM_TESTS).
ifeq ($(HAVE_NVCC),1)
  BINS += generate_gpu
endif
SIM_TESTS += $(BUILD)/cudasim/generate $(BIN_DIR)/generate $(BIN_DIR)/tokenizer
ifeq ($(CUDASIM_OK),1)
  TEST_BINS += $(BUILD)/cudasim/generate
endif
endif

# the CUDA KV-cache decode (llmc/cuda/decode.cuh) against the CPU's, through the harness
SIM_TESTS += $(BUILD)/cudasim/test/test_decode_cuda
ifeq ($(CUDASIM_OK),1)
  TEST_BINS += $(BUILD)/cudasim/test/test_decode_cuda
endif
$(BUILD)/cudasim/test/test_decode_cuda.cpp: $(CUDA_HDRS)

$(BUILD)/test/test_decode: $(call obj,test/test_decode.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $^ $(LDLIBS) -o $@

# test_blas_select: choosing OpenBLAS kernels from CPU features (llmc/cpu/blas_select.c)
TEST_BINS += $(BUILD)/test/test_blas_select
$(BUILD)/test/test_blas_select: $(call obj,test/test_blas_select.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $^ $(LDLIBS) -o $@
