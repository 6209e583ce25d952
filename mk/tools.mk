# tools.mk - ./generate (continue a prompt with a trained model, CPU) and its KV-cache test.
# Read after tokenizer.mk (sorted order), whose TOK_PCRE2 says whether the tokenizer is built:
# ./generate needs it to encode prompts and decode tokens.
ifeq ($(TOK_PCRE2),1)
BINS      += generate
TEST_BINS += $(BUILD)/test/test_decode

generate: $(call obj,generate.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $^ $(LDLIBS) -o $@
endif

$(BUILD)/test/test_decode: $(call obj,test/test_decode.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $^ $(LDLIBS) -o $@
