# backend/cuda/cuda.mk — the CUDA backend (backend/cuda/) and kernels
# (kernels/cuda/), included by the top-level Makefile.  Built only when nvcc
# is found (HAVE_CUDA=1; USE_CUDA=yes|no|auto decides), into:
#   $(B)/lib/libkvtrim-cuda.so    kernels + the backend (dlopen'd by kvtrimd;
#                                 exports kvt_cuda_backend_v1 and *_cuda only)
#   $(B)/bin/kvtrim-cuda-tests    CPU-vs-CUDA kernel and backend tests
#                                 (tests/kernels/test_cuda_*.c; skip
#                                 without GPU)
#   $(B)/bin/kvtrim-cuda-bench    GPU benchmarks against their floors
# kvtrimd and libkvtrim never link CUDA; `make gpu-check` runs
# scripts/gpu-check.sh on a GPU host.
#
# The policies' device rules (policies/*.cu, beside their host rules) go
# into the library too, seeing backend/cuda's internal headers; their
# objects are policies/<name>.cu.o, beside the C policies' <name>.o.
#
#   CUDA_ARCHS="80 90"   SASS for each, plus PTX of the last (JIT for newer)
#   NVCCFLAGS=...        the user's extra nvcc flags

CUDA_ARCHS ?= 80 90
NVCCFLAGS  ?=
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_INC   := $(CUDA_HOME)/include
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib) $(CUDA_HOME)/lib64)

CUDA_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
# The host compiler sees the same warnings as the C code; -Werror is left to
# the user (NVCCFLAGS=-Werror=all-warnings).
KVT_NVCCFLAGS := -std=c++17 -O3 $(CUDA_GENCODE) \
                 -Xcompiler -Wall,-Wextra,-fPIC \
                 -Iinclude -Icore -Ibackend -Ikernels/cpu -Ikernels/cuda

CUDA_SRC   := $(wildcard kernels/cuda/*.cu backend/cuda/*.cu)
CUDA_RULE_SRC := $(wildcard policies/*.cu)
CUDA_OBJ   := $(patsubst %.cu,$(B)/obj/%.o,$(CUDA_SRC)) \
              $(patsubst %.cu,$(B)/obj/%.cu.o,$(CUDA_RULE_SRC))
CUDA_SO    := $(B)/lib/libkvtrim-cuda.so
CUDA_TESTS := $(B)/bin/kvtrim-cuda-tests
CUDA_BENCH := $(B)/bin/kvtrim-cuda-bench
CUDA_RPATH := -Wl,-rpath,'$$ORIGIN/../lib' -Wl,-rpath,$(CUDA_LIBDIR)

# The kernel, backend and device-rule tests that use no CUDA header
# (tests/kernels/test_cuda_*.c less CUDA_KTEST_SRC; a new rule's test is
# picked up here): the generic rule's objects serve kvtrim-cuda-tests and
# kvtrim-cuda-emu-tests alike.
CUDA_PTEST_SRC := $(filter-out $(CUDA_KTEST_SRC),\
                  $(wildcard tests/kernels/test_cuda_*.c))

# The backend test belongs to the normal suite whatever USE_CUDA says: it
# checks that backend_open fails cleanly without the library or a device.
$(TESTS): $(B)/obj/tests/kernels/test_backend.o

.PHONY: gpu-check
gpu-check:
	sh scripts/gpu-check.sh

ifeq ($(HAVE_CUDA),1)

all: $(CUDA_SO) $(CUDA_TESTS) $(if $(SANITIZER),,$(CUDA_BENCH))

$(B)/obj/kernels/cuda/%.o: kernels/cuda/%.cu
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(KVT_NVCCFLAGS) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(B)/obj/backend/cuda/%.o: backend/cuda/%.cu
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(KVT_NVCCFLAGS) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(B)/obj/policies/%.cu.o: policies/%.cu
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(KVT_NVCCFLAGS) -Ibackend/cuda -Ipolicies $(NVCCFLAGS) \
	  -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(B)/obj/tests/kernels/bench_cuda.o $(B)/obj/tests/kernels/bench_cuda_ops.o: \
$(B)/obj/tests/kernels/%.o: tests/kernels/%.cu
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(KVT_NVCCFLAGS) -Ipolicies $(NVCCFLAGS) -MMD -MP \
	  -MF $(@:.o=.d) -c $< -o $@

$(CUDA_SO): $(CUDA_OBJ) backend/cuda/exports.map
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(NVCC) -shared -cudart shared -o $@ $(CUDA_OBJ) \
	  -Xlinker --version-script=backend/cuda/exports.map \
	  -Xlinker -soname,libkvtrim-cuda.so \
	  -Xlinker -rpath,$(CUDA_LIBDIR) -lcublas

# C test, compiled by the generic rule with the CUDA headers added.
$(call obj,$(CUDA_KTEST_SRC)): KVT_CFLAGS += -isystem $(CUDA_INC) -Ikernels/cuda

$(CUDA_TESTS): $(call obj,$(CUDA_KTEST_SRC) $(CUDA_PTEST_SRC)) \
               $(B)/obj/tests/harness/runner.o \
               $(call obj,$(KERNEL_SRC) ipc/handle.c) $(CORE_OBJ) | $(CUDA_SO)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(KVT_LDFLAGS) $(LDFLAGS) -o $@ $^ -L$(B)/lib -lkvtrim-cuda \
	  -L$(CUDA_LIBDIR) -lcublas -lcudart $(CUDA_RPATH) $(LDLIBS)

$(CUDA_BENCH): $(B)/obj/tests/kernels/bench_cuda.o \
               $(B)/obj/tests/kernels/bench_cuda_ops.o \
               $(call obj,kernels/cpu/compact.c) | $(CUDA_SO)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(NVCC) -cudart shared -o $@ $^ -L$(B)/lib -lkvtrim-cuda -lcublas \
	  -Xlinker -rpath,'$$ORIGIN/../lib' -Xlinker -rpath,$(CUDA_LIBDIR)

endif
