# test_gpt2_cpu: the CPU model against the PyTorch reference's debug state.
TEST_BINS += $(BUILD)/test/test_gpt2_cpu
$(BUILD)/test/test_gpt2_cpu: $(call obj,test/test_gpt2_cpu.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

# test_core: descriptors, tensor tables, schedules, log float formatting, bf16, sampler.
TEST_BINS += $(BUILD)/test/test_core
$(BUILD)/test/test_core: $(call obj,test/test_core.c) $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

# test_llama_cpu: the CPU Llama model against the PyTorch reference (dev/reference/train_llama3.py).
TEST_BINS += $(BUILD)/test/test_llama_cpu
$(BUILD)/test/test_llama_cpu: $(call obj,test/test_llama_cpu.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@
