# dataloader: llmc/data/dataloader.c (in libllmc.a) and its test binary.
CORE_SRCS += llmc/data/dataloader.c
TEST_BINS += $(BUILD)/test/test_dataloader

$(BUILD)/test/test_dataloader: $(call obj,test/test_dataloader.c) $(BUILD)/libllmc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS)
