# cudnn.mk - the optional cuDNN attention behind USE_CUDNN=1 (llmc/cuda/cudnn_att.h, .cpp).
#
#   make train_gpt USE_CUDNN=1                        train_gpt.cu compiled with -DUSE_CUDNN=1,
#                                                     linked with cudnn_att.o and -lcudnn
#   make cuda-tests USE_CUDNN=1                       the native CUDA tests, the same way
#   make build/dev/cuda/cudnn_att_check USE_CUDNN=1   lab: cuDNN vs our kernels (runs on a GPU)
#   make cudnn-frontend-dir USE_CUDNN=1               prints the cudnn_frontend include dir used
#
# cudnn_frontend is header-only and not part of this repository. Its include directory (the one
# holding cudnn_frontend.h) comes from CUDNN_FRONTEND_PATH when set (that directory or its
# include/), else from the pip package nvidia-cudnn-frontend, found through $(PYTHON) or the
# python3 on PATH: `pip install nvidia-cudnn-frontend` (only its headers are used).
# cuDNN itself (cudnn.h, libcudnn) comes with the CUDA toolkit, the cuDNN packages, CUDNN_PATH or
# the nvidia-cudnn-cu13 pip wheel (found through $(PYTHON) or python3).
# Without USE_CUDNN (or USE_CUDNN=0) nothing here changes a build.
#
# Switching USE_CUDNN rebuilds every nvcc object: they depend on $(BUILD)/.cudnn, a stamp that
# changes with the setting.

USE_CUDNN    ?= 0
CUDNN_OBJ    := $(BUILD)/cudnn/cudnn_att.o
CUDNN_LAB    := $(BUILD)/dev/cuda/cudnn_att_check
# host code only, so nvcc hands it to the host compiler; CUDNN_OPT=-O0 halves the compile time
# (about 45 s at -O2), the graphs are built once per shape so the speed hardly matters.
# CUDNN_FRONTEND_SKIP_JSON_LIB leaves out the frontend's JSON (de)serialisation, which is unused.
CUDNN_OPT    ?= -O2
CUDNN_CXXFLAGS = $(CUDNN_OPT) -std=c++17 -I. $(CUDNN_INC_FLAGS) -isystem $(CUDNN_FRONTEND_INCLUDE) -DCUDNN_FRONTEND_SKIP_JSON_LIB \
                 -Xcompiler -Wall,-Wextra
PHONY        += cudnn-frontend-dir

ifeq ($(USE_CUDNN),1)
  ifneq ($(HAVE_NVCC),1)
    $(error USE_CUDNN=1 needs nvcc (the CUDA toolkit); none was found)
  endif
  # cuDNN itself: CUDNN_PATH (a directory with include/cudnn.h and lib/libcudnn.so*), else the
  # toolkit or the system, else the pip wheel (nvidia-cudnn-cu12/cu13, as PyTorch installs it;
  # the machines lent with a GPU have cuDNN only there). A wheel ships libcudnn.so.9 without the
  # unversioned link, so the library is named by file; the rpath lets the programs find it.
  cudnn_py := import importlib.util as u, glob; s = u.find_spec("nvidia"); \
              print(next((h[:-len("/include/cudnn.h")] for b in (list(s.submodule_search_locations) if s else []) \
                          for h in sorted(glob.glob(b + "/**/include/cudnn.h", recursive=True))), ""))
  ifeq ($(CUDNN_PATH),)
    ifneq ($(HAVE_CUDNN),1)
      CUDNN_PATH := $(shell $(PYTHON) -c '$(cudnn_py)' 2>/dev/null)
      ifeq ($(CUDNN_PATH),)
        CUDNN_PATH := $(shell python3 -c '$(cudnn_py)' 2>/dev/null)
      endif
    endif
  endif
  ifneq ($(CUDNN_PATH),)
    ifeq ($(wildcard $(CUDNN_PATH)/include/cudnn.h),)
      $(error USE_CUDNN=1: CUDNN_PATH=$(CUDNN_PATH) has no include/cudnn.h)
    endif
    CUDNN_LIBFILE := $(notdir $(firstword $(wildcard $(CUDNN_PATH)/lib/libcudnn.so $(CUDNN_PATH)/lib/libcudnn.so.[0-9]*)))
    ifeq ($(CUDNN_LIBFILE),)
      $(error USE_CUDNN=1: CUDNN_PATH=$(CUDNN_PATH) has no lib/libcudnn.so*)
    endif
    CUDNN_INC_FLAGS := -I$(CUDNN_PATH)/include
    CUDNN_LINK      := -L$(CUDNN_PATH)/lib -Xlinker -rpath=$(CUDNN_PATH)/lib -l:$(CUDNN_LIBFILE)
    HAVE_CUDNN      := 1
  else
    CUDNN_LINK      := -lcudnn
  endif
  ifneq ($(HAVE_CUDNN),1)
    $(error USE_CUDNN=1: cuDNN (cudnn.h) not found under $(CUDA_HOME)/include, /usr/include or a pip wheel (nvidia-cudnn-cu13); install cuDNN 9 (e.g. apt-get install cudnn9-cuda-13 from NVIDIA's repository, or pip install nvidia-cudnn-cu13), or set CUDNN_PATH to a directory with include/cudnn.h and lib/)
  endif
  # <dir>/include next to the installed `cudnn` python package (the wheel's layout), or inside it
  cudnn_fe_py := import importlib.util as u, os; s = u.find_spec("cudnn"); d = os.path.dirname(s.origin) if s and s.origin else ""; \
                 print(next((c for c in (os.path.dirname(d) + "/include", d + "/include") if d and os.path.isfile(c + "/cudnn_frontend.h")), ""))
  ifneq ($(CUDNN_FRONTEND_PATH),)
    CUDNN_FRONTEND_INCLUDE := $(firstword $(patsubst %/cudnn_frontend.h,%,$(wildcard $(CUDNN_FRONTEND_PATH)/cudnn_frontend.h $(CUDNN_FRONTEND_PATH)/include/cudnn_frontend.h)))
    ifeq ($(CUDNN_FRONTEND_INCLUDE),)
      $(error USE_CUDNN=1: cudnn_frontend.h not found in CUDNN_FRONTEND_PATH=$(CUDNN_FRONTEND_PATH) (nor in its include/); point it at the directory holding cudnn_frontend.h, or unset it and `pip install nvidia-cudnn-frontend`)
    endif
  else
    CUDNN_FRONTEND_INCLUDE := $(shell $(PYTHON) -c '$(cudnn_fe_py)' 2>/dev/null)
    ifeq ($(CUDNN_FRONTEND_INCLUDE),)
      CUDNN_FRONTEND_INCLUDE := $(shell python3 -c '$(cudnn_fe_py)' 2>/dev/null)
    endif
    ifeq ($(CUDNN_FRONTEND_INCLUDE),)
      $(error USE_CUDNN=1: cudnn_frontend.h not found: `pip install nvidia-cudnn-frontend` (for $(PYTHON) or the python3 on PATH), or set CUDNN_FRONTEND_PATH to the directory holding cudnn_frontend.h)
    endif
  endif

  NVCCFLAGS   += -DUSE_CUDNN=1 $(CUDNN_INC_FLAGS)
  # -lnvrtc: cudnn_frontend 1.3x calls NVRTC directly (its experimental sm100 engine in plans.h)
  CUDA_LDLIBS += $(CUDNN_LINK) -lnvrtc
  # the trainer and the native tests link the cuDNN object too. It lands after the static
  # libraries on their link lines ($^ lists the recipe rule's prerequisites first); it needs
  # only llmc_check_failed from libllmc.a, which every CUDA program already pulls in (cudaCheck).
  $(BIN_DIR)/train_gpt $(CUDA_TESTS): $(CUDNN_OBJ)
  cuda-lab: $(CUDNN_LAB)
else ifneq ($(USE_CUDNN),0)
  $(error USE_CUDNN must be 0 or 1, not '$(USE_CUDNN)')
endif

# Every nvcc object depends on the setting (rebuilt when it changes). A stamp first written for
# the default (off) is dated 1970: objects built before this stamp existed were built without
# cuDNN, so they stay valid.
CUDNN_STAMP_TEXT := USE_CUDNN=$(USE_CUDNN) $(CUDNN_FRONTEND_INCLUDE) $(CUDNN_PATH)
$(BUILD)/.cudnn: FORCE
	@mkdir -p $(BUILD)
	@if [ ! -e $@ ] && [ '$(USE_CUDNN)' = 0 ]; then echo '$(CUDNN_STAMP_TEXT)' > $@ && touch -d @0 $@; fi
	@echo '$(CUDNN_STAMP_TEXT)' | cmp -s - $@ || echo '$(CUDNN_STAMP_TEXT)' > $@
$(patsubst %.cu,$(BUILD)/cuda/%.o,$(wildcard *.cu test/*.cu dev/cuda/*.cu)): $(BUILD)/.cudnn

ifeq ($(USE_CUDNN),1)
$(CUDNN_OBJ): llmc/cuda/cudnn_att.cpp llmc/cuda/cudnn_att.h llmc/core/check.h $(BUILD)/.cudnn
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDNN_CXXFLAGS) -c $< -o $@

# the lab program: the cuDNN object first, then the libraries it and the lab code need
$(BUILD)/cuda/dev/cuda/cudnn_att_check.o: llmc/cuda/cudnn_att.h dev/cuda/common_lab.h test/testing.h
$(CUDNN_LAB): $(BUILD)/cuda/dev/cuda/cudnn_att_check.o $(CUDNN_OBJ) $(CUDA_LIBS)
	@mkdir -p $(dir $@)
	$(NVCC) -arch=$(GPU_ARCH) $^ $(CUDA_LDLIBS) -o $@

cudnn-frontend-dir:
	@echo '$(CUDNN_FRONTEND_INCLUDE)'
else
$(CUDNN_OBJ) $(CUDNN_LAB) cudnn-frontend-dir:
	@echo "error: $@ is part of the cuDNN build: add USE_CUDNN=1 (see mk/cudnn.mk)" >&2; exit 1
endif
