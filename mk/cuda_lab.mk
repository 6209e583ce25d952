# cuda_lab.mk - the kernel lab (dev/cuda/NAME.cu) through the cudasim harness, so CI runs each
# lab program's checks (--small shapes, test/suite.d/55-cuda-lab.txt) without a GPU.
#
#   make build/cudasim/dev/cuda/gelu && build/cudasim/dev/cuda/gelu --small
# The nvcc builds (build/dev/cuda/NAME, `make cuda-lab`) are mk/cuda.mk's; this fragment only
# adds that they depend on dev/cuda/common_lab.h as well.

# (not dev/cuda/cudnn_*.cu: the harness has no cuDNN; mk/cudnn.mk builds those with nvcc)
LAB_SRCS     := $(filter-out dev/cuda/cudnn_%,$(wildcard dev/cuda/*.cu))
LAB_SIM_BINS := $(patsubst %.cu,$(BUILD)/cudasim/%,$(LAB_SRCS))
# everything the translation inlines besides the .cu itself (quoted includes are inlined)
LAB_INLINED  := $(CUDA_HDRS) dev/cuda/common_lab.h test/testing.h $(wildcard llmc/*/*.h)

ifeq ($(CUDASIM_OK),1)
  TEST_BINS += $(LAB_SIM_BINS)
endif

$(patsubst %.cu,$(BUILD)/cuda/%.o,$(LAB_SRCS)): dev/cuda/common_lab.h test/testing.h

$(patsubst %,%.cpp,$(LAB_SIM_BINS)): $(LAB_INLINED)
$(BUILD)/cudasim/dev/cuda/%: $(BUILD)/cudasim/dev/cuda/%.cpp $(CUDASIM_LIB) $(CUDA_LIBS)
	$(CUDASIM_CXX) $(CUDASIM_CXXFLAGS) $(LDFLAGS) -Wno-unknown-pragmas -DLLMC_HAVE_PCRE2=$(if $(HAVE_PCRE2),1,0) $< -o $@ $(CUDA_LIBS) $(CUDASIM_LIB) $(CUDASIM_LDLIBS) $(LDLIBS)
