# CPU ops (llmc/cpu/*.c): forward vs a naive double implementation, backward vs finite
# differences, AdamW, global norm, sgemm vs fallback vs a triple loop.
TEST_BINS += $(BUILD)/test/test_ops_cpu

$(BUILD)/test/test_ops_cpu: $(call obj,test/test_ops_cpu.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@
