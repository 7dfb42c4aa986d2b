# mk/test.mk — the test runs, included by the top-level Makefile after
# backend/cuda/cuda.mk and tests/kernels/emu/emu.mk (the emulator's
# variables decide which steps run).
#
#   make test          (or make check) builds everything, then runs, in order:
#     1. kvtrim-tests: the unit tests (<module>_test.c beside each module)
#        and the integration tests (tests/integration/) on the cpu backend;
#     2. kvtrim-cuda-emu-tests: the CUDA kernels and the cuda backend
#        against the CPU references on the emulator (emu.mk, docs/cuda.md);
#     3. the integration tests (the runner's selector tests/integration/)
#        twice more, on the cuda backend under the emulator: in vmm mode
#        (the default there, as on an H100/H200), then with
#        KVTRIM_CUDA_SHARE=ipc and the emulator's host functions deferred
#        (KVT_EMU_HOSTFN_DELAY_US), so syncs that wait for an engine's GPU
#        writes take the parking path (tests/integration/test_device.c);
#     4. kvtrim-loadgen --verify for every policy on the emulated cuda
#        backend: streaming and h2o in both sharing modes (200 steps), and
#        one vmm run of each other policy, and 64-sequence syncs of the
#        batched device rules (scripts/loadgen-policies.sh);
#     5. the Python package's tests (scripts/python_tests.sh), where the
#        environment of scripts/python_venv.sh exists (else skipped,
#        naming that command).
#   Step 2 needs a C++ compiler; steps 3 and 4 the emulated library, which
#   plain builds have and sanitizer builds do not.  SANITIZER=address runs
#   the same recipe against build/san-address (what .ci/run does last).
#   make soak [SOAK_ARGS=...]
#       scripts/soak.sh: 16 verifying engines under memory pressure with
#       random SIGKILLs; see the script.  Not part of `make test`.
#
# deps first, then a fresh make: on a new machine the pkg-config flags of
# the Makefile only exist once deps has installed the packages.

# kvtrim-tests, run from the tree (KVTRIM_BIN_DIR: where its tests find
# kvtrimd and the tools).
RUN_TESTS := KVTRIM_BIN_DIR=$(B)/bin $(TESTS)
# The emulated cuda backend, for every process a step starts (kvtrimd,
# engines, libkvtrim dlopen it).
EMU_LIB_ENV := KVTRIM_CUDA_LIB=$(abspath $(CUDA_EMU_LIB))
# The tests' own daemons on it (step 3).
EMU_BACKEND_ENV := KVTRIM_BACKEND=cuda KVTRIM_CUDA_EMU=1
# The emulator's host functions deferred by 1 ms (the parking path).
EMU_DEFER_ENV := KVT_EMU_HOSTFN_DELAY_US=1000

.PHONY: test check soak
test check: deps models-if-reachable
	@$(MAKE) --no-print-directory all
	$(RUN_TESTS)
	$(CUDA_EMU_TESTS)
ifneq ($(CUDA_EMU_LIB),)
	$(EMU_BACKEND_ENV) $(EMU_LIB_ENV) $(RUN_TESTS) tests/integration/
	$(EMU_BACKEND_ENV) KVTRIM_CUDA_SHARE=ipc $(EMU_DEFER_ENV) $(EMU_LIB_ENV) $(RUN_TESTS) tests/integration/
	$(EMU_LIB_ENV) sh scripts/loadgen-cuda.sh $(B)/bin streaming streaming:sinks=4,tokens=64
	$(EMU_LIB_ENV) sh scripts/loadgen-cuda.sh $(B)/bin h2o h2o:tokens=96
	$(EMU_LIB_ENV) sh scripts/loadgen-cuda.sh $(B)/bin ipc_streaming streaming:sinks=4,tokens=64 ipc
	$(EMU_LIB_ENV) $(EMU_DEFER_ENV) sh scripts/loadgen-cuda.sh $(B)/bin ipc_h2o h2o:tokens=96 ipc
	$(EMU_LIB_ENV) sh scripts/loadgen-policies.sh $(B)/bin
endif
	SANITIZER=$(SANITIZER) sh scripts/python_tests.sh

soak: deps
	@$(MAKE) --no-print-directory all
	B=$(B) sh scripts/soak.sh $(SOAK_ARGS)
