# mk/fuzz.mk — the libFuzzer targets, included by the top-level Makefile;
# not part of `make test`.
#
#   make fuzz [FUZZ_SECONDS=600] [FUZZ_JOBS=1] [FUZZ_MERGE=0]
#       libFuzzer targets (clang, ASan + UBSan + LeakSanitizer) for the
#       message codec, the config parser, the safetensors loader, the GGUF
#       reader with the tokenizer, and nng's SP wire as kvtrimd parses it,
#       each run FUZZ_SECONDS on its corpus (tests/fuzz/corpus/<target>),
#       FUZZ_JOBS at a time; prints runs, coverage and crashes per target and
#       fails on any crash, leak or timeout.  FUZZ_MERGE=1 minimises the
#       grown corpora back into tests/fuzz/corpus.  Installs clang and its
#       fuzzer runtime when they are missing (the normal build does not
#       need them).
#   make fuzz-build    only builds the targets (build/fuzz/fuzz_<target>)
#   make fuzz-seeds    regenerates the seed inputs (build/fuzz/seeds)
# The inputs the targets found bugs with are replayed by every `make test`
# (tests/fuzz/regress_test.c).
FUZZ_SECONDS ?= 600
FUZZ_JOBS    ?= 1
FUZZ_MERGE   ?= 0
FUZZ_CC      ?= clang
FUZZ_TARGETS := codec config weights gguf spwire
FUZZ_B       := build/fuzz
FUZZ_CFLAGS  := -std=c11 -D_GNU_SOURCE -g -O1 $(WARN) -fno-omit-frame-pointer \
                -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
                -Iinclude -Icore -Iipc -Idaemon -Ipolicies -Ikernels/cpu -Iengine
FUZZ_HDRS    := $(filter-out %_fixture.h,$(wildcard include/*.h core/*.h ipc/*.h \
                  daemon/config.h daemon/log.h daemon/spwire.h \
                  policies/weights.h kernels/cpu/kernels.h engine/gguf.h \
                  engine/tokenizer.h))
CODEC_SRC        := ipc/codec.c ipc/codec_decode.c ipc/codec_encode.c \
                    ipc/codec_scan.c ipc/codec_row.c
FUZZ_SRC_codec   := tests/fuzz/fuzz_codec.c $(CODEC_SRC) core/errors.c
FUZZ_LIB_codec   := -lmsgpackc
FUZZ_SRC_config  := tests/fuzz/fuzz_config.c daemon/config.c daemon/log.c \
                    core/errors.c core/now.c
FUZZ_LIB_config  :=
FUZZ_SRC_weights := tests/fuzz/fuzz_weights.c policies/weights.c \
                    core/dtype.c core/errors.c
FUZZ_LIB_weights := -lcjson -lm
FUZZ_SRC_gguf    := tests/fuzz/fuzz_gguf.c $(call src,engine/gguf*.c) \
                    engine/tokenizer.c engine/unicode.c core/dtype.c \
                    core/errors.c
FUZZ_LIB_gguf    := -lm
FUZZ_SRC_spwire  := tests/fuzz/fuzz_spwire.c daemon/spwire.c
FUZZ_LIB_spwire  :=
FUZZ_BINS := $(addprefix $(FUZZ_B)/fuzz_,$(FUZZ_TARGETS))

.PHONY: fuzz fuzz-deps fuzz-build fuzz-seeds
fuzz-deps:
	@if ! command -v $(FUZZ_CC) >/dev/null 2>&1 || \
	    ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' | \
	      $(FUZZ_CC) -x c -fsanitize=fuzzer -o /dev/null - >/dev/null 2>&1; then \
	  echo "installing: clang libclang-rt-14-dev (libFuzzer)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    $$SUDO apt-get install -y -qq clang libclang-rt-14-dev; \
	fi

$(FUZZ_B)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_HDRS) Makefile mk/fuzz.mk
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FUZZ  $@")
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $(FUZZ_SRC_$*) $(FUZZ_LIB_$*)
$(FUZZ_B)/fuzz_codec: $(FUZZ_SRC_codec)
$(FUZZ_B)/fuzz_config: $(FUZZ_SRC_config)
$(FUZZ_B)/fuzz_weights: $(FUZZ_SRC_weights)
$(FUZZ_B)/fuzz_gguf: $(FUZZ_SRC_gguf)
$(FUZZ_B)/fuzz_spwire: $(FUZZ_SRC_spwire)

$(FUZZ_B)/gen_seeds: tests/fuzz/gen_seeds.c $(CODEC_SRC) policies/weights.c \
                     core/dtype.c core/errors.c $(FUZZ_HDRS)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) -std=c11 -D_GNU_SOURCE -g $(WARN) -Iinclude -Icore -Iipc -Ipolicies \
	  -Ikernels/cpu -o $@ $(filter %.c,$^) -lmsgpackc -lcjson -lm

fuzz-build: fuzz-deps
	@$(MAKE) --no-print-directory $(FUZZ_BINS)

fuzz-seeds: $(FUZZ_B)/gen_seeds
	rm -rf $(FUZZ_B)/seeds && $(FUZZ_B)/gen_seeds $(FUZZ_B)/seeds
	@echo "seeds in $(FUZZ_B)/seeds (committed corpora: tests/fuzz/corpus)"

fuzz: fuzz-build
	BIN=$(FUZZ_B) SECONDS_PER_TARGET=$(FUZZ_SECONDS) JOBS=$(FUZZ_JOBS) \
	  MERGE=$(FUZZ_MERGE) sh tests/fuzz/run.sh $(FUZZ_TARGETS)
