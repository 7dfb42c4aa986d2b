#!/bin/sh
# loadgen-policies.sh BIN_DIR — kvtrim-loadgen --verify on the cuda backend
# for every policy but the two scripts/loadgen-cuda.sh runs of its own
# callers (streaming, h2o): one vmm run each of 96 steps, budgets small
# enough that each evicts (snapkv, pyramidkv and expected_attention decide
# at the first decode sync, so they prefill 32 tokens first; kvzap's and
# fastkvzip's random seeded weights score around 0, hence kvzap's
# threshold 0; h2o_rule, tova_rule, kvpop_rule, kvzap_rule,
# fastkvzip_rule and fastkvzip_threshold_rule add sinks, a window or a
# short delay, every=3 and a prefill that does not fill the staging ring's
# rows evenly, so syncs that decide nothing and rings that wrap are
# crossed; kvpop runs its scorer alone (window=0,memory=0), kvpop_memory
# memory=16 with trust 8, the _learned runs the learned memory (the
# random weights' decay and readout a layer), kept by its device rule
# too; the _64 runs sync 64 sequences at once, 4 tokens each
# after a prefill of 13 (32 for the prompt-only ones), through the
# batched device rules).  The kept sets must equal an in-process replay of the cpu
# policy.  Prints loadgen-cuda.sh's report lines; exits 1 when a run
# failed.  `make test` runs it with KVTRIM_CUDA_LIB naming the emulated
# library, scripts/gpu-check.sh on a GPU.
B=${1:?usage: loadgen-policies.sh BIN_DIR}
status=0
while read -r name spec args; do
	[ -n "$name" ] || continue
	# shellcheck disable=SC2086
	sh "$(dirname "$0")/loadgen-cuda.sh" "$B" "$name" "$spec" vmm \
		--steps 96 $args || status=1
done <<'RUNS'
full full
h2o_rule h2o:tokens=40,window=8,sinks=2,agg=max,every=3 --prefill 17
random random:tokens=24
snapkv snapkv:window=8,tokens=16 --prefill 32
tova tova:tokens=24
tova_rule tova:tokens=20,window=4,sinks=2,every=3 --prefill 16
kvzap kvzap:threshold=0,window=8
kvzap_rule kvzap:threshold=0,window=5,sinks=2 --prefill 17
fastkvzip fastkvzip:window=8,every=16
fastkvzip_rule fastkvzip:window=4,sinks=2,every=3,tokens=6 --prefill 17
fastkvzip_threshold fastkvzip:window=8,every=16,threshold=0.5
fastkvzip_threshold_rule fastkvzip:window=4,sinks=2,every=3,threshold=0.5 --prefill 17
kvpop kvpop:tokens=24,delay=8,window=0,memory=0
kvpop_rule kvpop:tokens=20,delay=3,sinks=2,window=8,every=3 --prefill 17
kvpop_memory kvpop:tokens=20,delay=3,sinks=2,window=8,memory=16,trust=8,every=3 --prefill 17
kvpop_learned kvpop:tokens=20,delay=3,sinks=2,window=8,memory=learned,every=3 --prefill 17
knorm knorm:tokens=24
pyramidkv pyramidkv:window=8,tokens=16 --prefill 32
expected_attention expected_attention:window=8,tokens=16 --prefill 32
observed_attention observed_attention:tokens=24,every=3 --prefill 17
h2o_64 h2o:tokens=20,window=4,sinks=2,agg=max,every=3 --seqs 64 --steps 40 --prefill 13 --sync-every 4
tova_64 tova:tokens=20,window=4,sinks=2,every=2 --seqs 64 --steps 40 --prefill 13 --sync-every 4
kvpop_64 kvpop:tokens=20,delay=3,sinks=2,window=6,every=3 --seqs 64 --steps 40 --prefill 13 --sync-every 4
kvpop_learned_64 kvpop:tokens=20,delay=3,sinks=2,window=6,memory=learned,every=3 --seqs 64 --steps 40 --prefill 13 --sync-every 4
observed_attention_64 observed_attention:tokens=20,every=2 --seqs 64 --steps 40 --prefill 13 --sync-every 4
kvzap_64 kvzap:threshold=0,window=8 --seqs 64 --steps 40 --prefill 13 --sync-every 4
fastkvzip_64 fastkvzip:window=8,every=16 --seqs 64 --steps 40 --prefill 13 --sync-every 4
fastkvzip_threshold_64 fastkvzip:window=4,sinks=2,every=2,threshold=0.5 --seqs 64 --steps 40 --prefill 13 --sync-every 4
snapkv_64 snapkv:window=8,tokens=16 --seqs 64 --steps 48 --prefill 32 --sync-every 4
pyramidkv_64 pyramidkv:window=8,tokens=16 --seqs 64 --steps 48 --prefill 32 --sync-every 4
expected_attention_64 expected_attention:window=8,tokens=16 --seqs 64 --steps 48 --prefill 32 --sync-every 4
streaming_rule streaming:tokens=20,sinks=2 --prefill 17
streaming_64 streaming:ratio=0.5,sinks=3 --seqs 64 --steps 40 --prefill 13 --sync-every 4
knorm_rule knorm:tokens=20,window=4,sinks=2,every=3 --prefill 17
knorm_64 knorm:tokens=20,window=4,sinks=2 --seqs 64 --steps 40 --prefill 13 --sync-every 4
random_rule random:tokens=20,window=4,sinks=2,seed=5,every=3 --prefill 17
random_64 random:tokens=20,window=4,sinks=2,seed=9 --seqs 64 --steps 40 --prefill 13 --sync-every 4
RUNS
exit $status
