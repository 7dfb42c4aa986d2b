# tests/kernels/emu/emu.mk — the CUDA kernels on the CPU, included by the
# top-level Makefile after kernels/cuda/cuda.mk.  Builds
#   $(B)/bin/kvtrim-cuda-emu-tests
# the same tests/kernels/test_cuda_kernels.c as kvtrim-cuda-tests, but
# against kernels/cuda/*.cu compiled by g++ under the emulator of this
# directory (docs/cuda.md, "CPU emulation of the kernels"), so the kernels
# run, and are compared with kernels/cpu, on a machine without a GPU.  It
# needs neither nvcc nor any CUDA header or library, works with
# SANITIZER=address (build/san-address/), and is part of `all`.
#
# backend_cuda.cu is in too: the emulator has no driver API, so the
# backend runs its legacy-IPC mode, with IPC handles opened in the one
# process; only the tests that share chunks between two processes skip.
#
# The binary runs the full shape list of the GPU run; about 21 s on two
# cores (60 s under ASan).  At run time, KVT_EMU_ORDER=reverse runs a
# block's threads in reverse order (races a forward order hides) and
# KVT_EMU_STACK_KB sets the fiber stack size.

CXX ?= g++

EMU_DIR  := tests/kernels/emu
EMU_KSRC := $(wildcard kernels/cuda/*.cu)
EMU_KOBJ := $(patsubst kernels/cuda/%.cu,$(B)/obj/emu/kernels/cuda/%.o, \
              $(EMU_KSRC))
EMU_ROBJ := $(patsubst %.cc,$(B)/obj/%.o,$(wildcard $(EMU_DIR)/*.cc))
EMU_TOBJ := $(B)/obj/emu/tests/kernels/test_cuda_kernels.o

# C++ for the kernels and the emulator, with the warnings nvcc gives its
# host compiler (cuda.mk) less -Wunused-parameter, like the C code; no
# -Wunknown-pragmas, for the kernels' #pragma unroll.
EMU_CXXFLAGS := -std=c++17 -D_GNU_SOURCE -Wall -Wextra \
                -Wno-unused-parameter -Wno-unknown-pragmas -pthread -MMD -MP \
                -I$(EMU_DIR)/include -Iinclude -Idaemon -Ikernels/cpu \
                -Ikernels/cuda -Itests/harness \
                $(shell pkg-config --cflags openblas 2>/dev/null)
ifneq ($(SANITIZER),)
EMU_CXXFLAGS += -fsanitize=$(SANITIZER) -fno-sanitize-recover=all \
                -fno-omit-frame-pointer
endif

ifneq ($(shell command -v $(CXX) 2>/dev/null),)

# `make test` runs it (empty, so skipped, without a C++ compiler).
CUDA_EMU_TESTS := $(B)/bin/kvtrim-cuda-emu-tests

all: $(CUDA_EMU_TESTS)

# The wrapper is the .cu plus its __launch_bounds__ (see wrap.awk); kept,
# or make would delete it as an intermediate and rebuild it next time.
.PRECIOUS: $(B)/obj/emu/kernels/cuda/%.cc
$(B)/obj/emu/kernels/cuda/%.cc: kernels/cuda/%.cu $(EMU_DIR)/wrap.awk
	@mkdir -p $(dir $@)
	$(Q)awk -f $(EMU_DIR)/wrap.awk $< > $@.tmp && mv $@.tmp $@

$(B)/obj/emu/kernels/cuda/%.o: $(B)/obj/emu/kernels/cuda/%.cc
	@$(if $(Q),echo "  EMU   kernels/cuda/$*.cu")
	$(Q)$(CXX) -x c++ -include $(EMU_DIR)/emu.h -iquote . $(EMU_CXXFLAGS) \
	  $(CFLAGS) -c $< -o $@

$(B)/obj/$(EMU_DIR)/%.o: $(EMU_DIR)/%.cc
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CXX   $<")
	$(Q)$(CXX) $(EMU_CXXFLAGS) $(CFLAGS) -c $< -o $@

# The test as it is, with the stand-in CUDA headers first on the path.
$(EMU_TOBJ): tests/kernels/test_cuda_kernels.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $< (cuda emulator)")
	$(Q)$(CC) -I$(EMU_DIR)/include -Ikernels/cuda $(KVT_CFLAGS) $(CFLAGS) \
	  -c $< -o $@

# Outside ASan the emulator fills the executable's TLS block before every
# thread block, so that block must hold the __shared__ variables (C++
# function-local statics, _ZZ...) and nothing else; the link checks.
$(CUDA_EMU_TESTS): $(EMU_TOBJ) $(EMU_KOBJ) $(EMU_ROBJ) \
                   $(B)/obj/tests/harness/runner.o \
                   $(call obj,$(KERNEL_SRC)) $(ERR_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CXX) $(KVT_LDFLAGS) $(LDFLAGS) -o $@.tmp $^ $(LDLIBS)
	$(Q)bad=$$(readelf -sW $@.tmp | \
	  awk '$$4 == "TLS" && $$8 !~ /^_ZZ/ {print $$8}'); \
	if [ -n "$$bad" ]; then \
	  echo "$@: thread-local variables besides __shared__: $$bad" >&2; \
	  rm -f $@.tmp; exit 1; \
	fi; mv $@.tmp $@

else
CUDA_EMU_TESTS :=
$(info $(CXX) not found: no kvtrim-cuda-emu-tests)
endif
