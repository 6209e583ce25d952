# devalloc.mk - the device caching allocator's own test (llmc/cuda/devalloc.cuh), through the harness:
#   build/cudasim/test/test_dev_alloc   hand-worked allocation sequences: reserved, allocated, largest free, snapshot
# (test/test_allocator.py checks it inside ./train_gpt; suite: test/suite.d/24-alloc.txt)
$(BUILD)/cudasim/test/test_dev_alloc.cpp: $(CUDA_HDRS)
SIM_TESTS += $(BUILD)/cudasim/test/test_dev_alloc
ifeq ($(CUDASIM_OK),1)
  TEST_BINS += $(BUILD)/cudasim/test/test_dev_alloc
endif
