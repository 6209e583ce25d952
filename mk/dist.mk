# Data parallelism (llmc/dist/dist.c, bucket.c, llmc/train/optim.c): the TCP transport (-pi tcp | fs, every build),
# the CPU trainer without MPI, for the tests that a build without MPI asked for several processes
# with -pi mpi says how to get them and trains with -pi tcp | fs (a link only: the core's dist.o
# is the build without MPI), and `make bench-dist`.
CORE_SRCS += llmc/dist/dist_tcp.c llmc/dist/bucket.c
TEST_BINS += $(BUILD)/test/train_gpt_cpu_nompi
$(BUILD)/test/train_gpt_cpu_nompi: $(call obj,train_gpt.c) $(BUILD)/libllmc_cpu.a $(BUILD)/libllmc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

# benchmark, not a test: 2 ranks x 1 thread against 1 rank x 2 threads (scripts/bench_dist.sh)
PHONY += bench-dist
bench-dist: train_gpt_cpu
	scripts/bench_dist.sh
