# tokenizer.mk - the GPT-2 tokenizer library, the ./tokenizer tool, its tests, `make data`
# and `make bench-tokenizer`. Included by the top-level Makefile.
#
# PCRE2 (Debian: libpcre2-dev) is needed for encoding; without it the library, the tool and
# the tests are left out and `make data` says why.

# Own PCRE2 probe as well: with GNU make 4.3 the top-level try_cc passes a literal "\#define"
# to the compiler (the backslash survives inside $(call)), so HAVE_PCRE2 comes out empty.
tok_hash := \#
TOK_PCRE2 := $(if $(HAVE_PCRE2),1,$(shell printf '$(tok_hash)define PCRE2_CODE_UNIT_WIDTH 8\n$(tok_hash)include <pcre2.h>\nint main(void){return 0;}\n' | $(CC) -x c - -o /dev/null -lpcre2-8 >/dev/null 2>&1 && echo 1))

ifeq ($(TOK_PCRE2),1)
CORE_SRCS += llmc/data/tokenizer.c llmc/data/tokenizer_load.c
LDLIBS    += -lpcre2-8
BINS      += tokenizer
TEST_BINS += $(BUILD)/test/test_tokenizer
endif
PHONY += data bench-tokenizer

$(BIN_DIR)/tokenizer: $(call obj,tokenizer_main.c) $(BUILD)/libllmc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/test/test_tokenizer: $(call obj,test/test_tokenizer.c) $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

# Tiny Shakespeare the way llm.c's tinyshakespeare.py does it, plus data/gpt2_tokenizer.bin.
# The script returns at once when every output is already newer than its inputs.
data:
ifeq ($(TOK_PCRE2),1)
	@$(MAKE) --no-print-directory tokenizer
	@data/prepare_tinyshakespeare.sh
else
	@echo "error: 'make data' needs PCRE2 for ./tokenizer: apt-get install libpcre2-dev" >&2; exit 1
endif

bench-tokenizer: tokenizer
	$(PYTHON) dev/bench_tokenizer.py
