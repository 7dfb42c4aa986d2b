# tests/kernels/emu/emu.mk — the CUDA kernels on the CPU, included by the
# top-level Makefile after backend/cuda/cuda.mk.  Builds
#   $(B)/bin/kvtrim-cuda-emu-tests
# the same tests/kernels/test_cuda_*.c as kvtrim-cuda-tests, but
# against kernels/cuda/*.cu compiled by g++ under the emulator of this
# directory (docs/cuda.md, "CPU emulation of the kernels"), so the kernels
# run, and are compared with kernels/cpu, on a machine without a GPU.  It
# needs neither nvcc nor any CUDA header or library, works with
# SANITIZER=address (build/san-address/), and is part of `all`.
#
# The cuda backend (backend/cuda/*.cu, and the policies' device rules,
# policies/*.cu, which see backend/cuda's internal headers) is in too, in
# its vmm mode by default (driver.cc emulates the driver's VMM calls with
# memfds) and in legacy-IPC mode with KVTRIM_CUDA_SHARE=ipc; the tests
# that fork an importer run in both.
#
# Outside sanitizer builds it also links the same objects (less the
# emulator's own tests) into
#   $(B)/lib/emu/libkvtrim-cuda.so
# the cuda backend on the emulator as a library kvtrimd and libkvtrim can
# dlopen (KVTRIM_CUDA_LIB): `make test` runs the integration suite on it,
# daemon and engines in separate processes sharing emulated device memory
# through memfds (docs/cuda.md).  It exports what the real library does
# (backend/cuda/exports.map) and needs no CUDA library.
#
# The binary runs the full shape list of the GPU run; about 21 s on two
# cores (60 s under ASan).  At run time, KVT_EMU_ORDER=reverse runs a
# block's threads in reverse order (races a forward order hides) and
# KVT_EMU_STACK_KB sets the fiber stack size.

CXX ?= g++

EMU_DIR  := tests/kernels/emu
EMU_KSRC := $(wildcard kernels/cuda/*.cu backend/cuda/*.cu policies/*.cu)
EMU_KOBJ := $(patsubst %.cu,$(B)/obj/emu/%.o,$(EMU_KSRC))
EMU_ROBJ := $(patsubst %.cc,$(B)/obj/%.o,$(wildcard $(EMU_DIR)/*.cc))
EMU_TOBJ := $(patsubst %.c,$(B)/obj/emu/%.o,$(CUDA_KTEST_SRC))

# C++ for the kernels and the emulator, with the warnings nvcc gives its
# host compiler (cuda.mk) less -Wunused-parameter, like the C code; no
# -Wunknown-pragmas, for the kernels' #pragma unroll.
# -fPIC: the objects go into the test binary and into the emulated
# libkvtrim-cuda.so alike (the __shared__ thread_locals take the dynamic TLS
# model, which the linker relaxes to the executable's own in the binary).
EMU_CXXFLAGS := -std=c++17 -D_GNU_SOURCE -Wall -Wextra -fPIC -ffp-contract=off \
                -Wno-unused-parameter -Wno-unknown-pragmas -pthread -MMD -MP \
                -I$(EMU_DIR)/include -Iinclude -Icore -Ibackend -Ikernels/cpu \
                -Ikernels/cuda -Ibackend/cuda -Itests/harness -Iipc \
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
.PRECIOUS: $(B)/obj/emu/%.cc
$(B)/obj/emu/%.cc: %.cu $(EMU_DIR)/wrap.awk
	@mkdir -p $(dir $@)
	$(Q)awk -f $(EMU_DIR)/wrap.awk $< > $@.tmp && mv $@.tmp $@

$(B)/obj/emu/%.o: $(B)/obj/emu/%.cc
	@$(if $(Q),echo "  EMU   $*.cu")
	$(Q)$(CXX) -x c++ -include $(EMU_DIR)/emu.h -iquote . $(EMU_CXXFLAGS) \
	  $(CFLAGS) -c $< -o $@

$(B)/obj/$(EMU_DIR)/%.o: $(EMU_DIR)/%.cc
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CXX   $<")
	$(Q)$(CXX) $(EMU_CXXFLAGS) $(CFLAGS) -c $< -o $@

# The tests as they are, with the stand-in CUDA headers first on the path.
$(EMU_TOBJ): $(B)/obj/emu/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $< (cuda emulator)")
	$(Q)$(CC) -I$(EMU_DIR)/include -Ikernels/cuda $(KVT_CFLAGS) $(CFLAGS) \
	  -c $< -o $@

# Outside ASan the emulator fills its own object's TLS block (the
# executable's, or the emulated library's) before every thread block, so
# that block must hold the __shared__ variables (C++ function-local
# statics, _ZZ...) and nothing else; the link checks $@.tmp, and that
# fiber.cc's tls_anchor opens the block (offset 0): fiber.cc finds the
# block from its address.
EMU_TLS_CHECK = bad=$$(readelf -sW $@.tmp | \
	  awk '$$4 == "TLS" && $$8 !~ /^_ZZ/ {print $$8} \
	       $$4 == "TLS" && $$8 ~ /tls_anchor/ && $$2 !~ /^0+$$/ \
	       {print $$8 " (not at offset 0)"}'); \
	if [ -n "$$bad" ]; then \
	  echo "$@: thread-local variables besides __shared__: $$bad" >&2; \
	  rm -f $@.tmp; exit 1; \
	fi; mv $@.tmp $@

# CUDA_PTEST_SRC (backend/cuda/cuda.mk: test_cuda_attention.c,
# test_cuda_sync_ops.c, the device rules' tests) use no CUDA header: the
# generic rule's objects serve both test binaries.
$(CUDA_EMU_TESTS): $(EMU_TOBJ) $(call obj,$(CUDA_PTEST_SRC)) \
                   $(EMU_KOBJ) $(EMU_ROBJ) \
                   $(B)/obj/tests/harness/runner.o \
                   $(call obj,$(KERNEL_SRC) ipc/handle.c) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CXX) $(KVT_LDFLAGS) $(LDFLAGS) -o $@.tmp $^ $(LDLIBS)
	$(Q)$(EMU_TLS_CHECK)

# The emulated backend library (plain builds only: it is dlopen'd into
# kvtrimd and engines that are not built with the sanitizer runtime).
# `make test` runs the integration suite on it when it is set.
ifeq ($(SANITIZER),)
CUDA_EMU_LIB := $(B)/lib/emu/libkvtrim-cuda.so

all: $(CUDA_EMU_LIB)

$(CUDA_EMU_LIB): $(EMU_KOBJ) $(filter-out %/test_emu.o,$(EMU_ROBJ)) \
                 backend/cuda/exports.map
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CXX) -shared -Wl,--no-undefined $(KVT_LDFLAGS) $(LDFLAGS) \
	  -Wl,--version-script=backend/cuda/exports.map \
	  -Wl,-soname,libkvtrim-cuda.so -o $@.tmp $(filter %.o,$^) \
	  $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas) \
	  -pthread
	$(Q)$(EMU_TLS_CHECK)
else
CUDA_EMU_LIB :=
endif

else
CUDA_EMU_TESTS :=
CUDA_EMU_LIB :=
$(info $(CXX) not found: no kvtrim-cuda-emu-tests)
endif
