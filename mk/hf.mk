# hf.mk - Hugging Face model directories (llmc/formats/hf.c, llmc/formats/safetensors.c) and ./hf_convert.
# cJSON (Debian: libcjson-dev) parses their JSON; without it -e DIR and --save-hf 1 say so, and
# ./hf_convert is not built. Own probe (as tokenizer.mk's): make 4.3 keeps the backslash of
# "\#include" inside $(call try_cc), so the top-level helper cannot test a header.
hf_hash := \#
HAVE_CJSON := $(shell printf '$(hf_hash)include <cjson/cJSON.h>\nint main(void){return cJSON_ParseWithLength("{}", 2) == 0;}\n' | $(CC) -x c - -o /dev/null -lcjson >/dev/null 2>&1 && echo 1)

CORE_SRCS += llmc/formats/safetensors.c llmc/formats/hf.c llmc/formats/llamafile.c llmc/formats/arch.c
override CFLAGS += -DLLMC_HAVE_CJSON=$(if $(HAVE_CJSON),1,0)
ifeq ($(HAVE_CJSON),1)
LDLIBS += -lcjson
BINS   += hf_convert
endif

$(BIN_DIR)/hf_convert: $(call obj,hf_convert.c) $(BUILD)/libllmc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

# test/test_cuda_trainer_sim.sh (a cudasim suite command) converts checkpoints with it
ifeq ($(HAVE_CJSON),1)
test-cudasim: $(BIN_DIR)/hf_convert
endif
