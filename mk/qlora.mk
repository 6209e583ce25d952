# qlora.mk - QLoRA's quantised frozen base (llmc/core/quant.c comes with lora.mk's core sources, the CPU
# part llmc/cpu/qbase.c with llmc/cpu/*.c): test_quant writes the C quantiser's codes, absmax and
# dequantised values for test/test_qlora.py to compare with dev/reference/nf4.py.
TEST_BINS += $(BUILD)/test/test_quant

$(BUILD)/test/test_quant: $(call obj,test/test_quant.c) $(BUILD)/libllmc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@
