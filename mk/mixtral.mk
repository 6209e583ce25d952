# mixtral.mk - the Mixtral architecture (llmc/models/mixtral, llmc/formats/mixtralfile, llmc/cpu/mixtral
# and llmc/cpu/moe: routing ops) and its tests:
#   build/test/test_mixtral_cpu   the CPU model vs dev/reference/train_mixtral.py (test/test_moe.py)
CORE_SRCS += llmc/models/mixtral.c llmc/formats/mixtralfile.c

TEST_BINS += $(BUILD)/test/test_mixtral_cpu
$(BUILD)/test/test_mixtral_cpu: $(call obj,test/test_mixtral_cpu.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

# benchmark, not a test: a Mixtral's tokens/s against the dense Llama of its active parameters (scripts/bench_moe.sh)
PHONY += bench-moe
bench-moe: train_gpt_cpu
	scripts/bench_moe.sh

# expert parallelism (-ep, issue 24 item 5): the CPU trainer's optimizer of an expert-sharded
# Mixtral, in the CPU library beside llmc/cpu/moe_ep.c whose buffer sizes it prints
CPU_SRCS += llmc/train/epopt.c
