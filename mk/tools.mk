# tools.mk - ./generate (continue a prompt with a trained model, CPU) and its KV-cache test.
# Read after tokenizer.mk (sorted order), whose TOK_PCRE2 says whether the tokenizer is built:
# ./generate needs it to encode prompts and decode tokens.
# The front end (llmc/generate.c: flags, prompt, sampling) is in the core library; generate.c
# adds the CPU model, generate.cu the CUDA one (./generate_gpu, mk/cuda.mk), as the trainers.
ifeq ($(TOK_PCRE2),1)
CORE_SRCS += llmc/generate.c
BINS      += generate
TEST_BINS += $(BUILD)/test/test_decode

generate: $(call obj,generate.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@
endif

$(BUILD)/test/test_decode: $(call obj,test/test_decode.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $^ $(LDLIBS) -o $@

# test_blas_select: choosing OpenBLAS kernels from CPU features (llmc/cpu/blas_select.c)
TEST_BINS += $(BUILD)/test/test_blas_select
$(BUILD)/test/test_blas_select: $(call obj,test/test_blas_select.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $^ $(LDLIBS) -o $@
