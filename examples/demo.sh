#!/bin/sh
# make demo: start kvtrimd on a scratch runtime directory; SmolLM2-135M-
# Instruct (from `make models`) reads a long document and answers a
# question about it, first with the full cache, then with SnapKV evicting
# 75% of the cache as one more tenant beside several loadgen tenants
# (different policies, verifying every entry); show the daemon's view while
# they run, print both answers with what each cost in the pool, check the
# pool invariants, stop cleanly.
#
# The document, examples/demo-document.txt, is about 2000 tokens of the
# project's own docs (the README's introduction and "Running the daemon",
# the protocol's registration, messages and connection limits) with one
# planted sentence the docs do not hold: "The first kvtrimd ever started
# ran on a test machine named Marigold."  The question asks for that name.
# SnapKV (policies/snapkv.c) compresses once, at the end of prefill, keeping
# per KV head the prompt entries the last 64 prompt positions (the question
# and the chat template's tail) attend to most: the kind of eviction built
# for answering a question about a prompt.
#
# Without the model in the cache (offline, `make models` could not fetch
# it) the question part is skipped with the reason and the rest runs.
# Nothing here needs ../shared; where ../shared/models/bytes2m.bin is
# present the bytes2m engine tenant runs beside the others as before.
#
# Time: the two prefills of about 2000 tokens dominate (about 85 s of CPU
# each); the whole demo took 193 s on a shared 2-core machine (load about
# 4), 390 s under load 6.
set -eu
B=${B:-build}
BIN=$B/bin
DIR=$(mktemp -d /tmp/kvtrim-demo-XXXXXX)
export KVTRIM_RUNTIME_DIR=$DIR
DOC=${KVTRIM_DEMO_DOC:-examples/demo-document.txt}
QUESTION="What was the name of the test machine the first kvtrimd ran on?"
FACT=Marigold
SNAPKV=snapkv:ratio=0.75
cleanup() { [ -n "${DPID:-}" ] && kill "$DPID" 2>/dev/null || true; rm -rf "$DIR"; }
trap cleanup EXIT
T0=$(date +%s)

# 512M: the full cache of the 2000-token answer is about 115 MiB (f32, 30
# layers x 3 KV heads); a default quota of 256M lets one tenant hold it
# (the fair share would be 512M / 4 = 128M, too tight with the headroom).
echo "== kvtrimd --runtime-dir $DIR --backend cpu --pool-size 512M --default-quota 256M"
$BIN/kvtrimd --runtime-dir "$DIR" --backend cpu --pool-size 512M \
	--default-quota 256M 2>"$DIR/kvtrimd.log" &
DPID=$!
i=0
while [ ! -S "$DIR/ctl.ipc" ] || [ ! -S "$DIR/fd.sock" ]; do
	i=$((i + 1)); [ $i -gt 500 ] && { cat "$DIR/kvtrimd.log"; exit 1; }
	sleep 0.01
done
rc=0

# qa TENANT POLICY: SmolLM2 answers the question about the document as
# tenant TENANT; the answer in $DIR/TENANT.out, the engine's --summary
# line (key=value) in $DIR/TENANT.err.
qa() {
	$BIN/kvtrim-engine --model smollm2 --runtime-dir "$DIR" --tenant "$1" \
		--policy "$2" --summary chat --prompt-file "$DOC" \
		--question "$QUESTION" --max-tokens 48 \
		>"$DIR/$1.out" 2>"$DIR/$1.err"
}
# val KEY FILE: the value of KEY in the summary line of FILE.
val() { sed -n "s/^summary:.* $1=\([^ ]*\).*/\1/p" "$2"; }

SMOL=
if $BIN/kvtrim-engine --model smollm2 info >"$DIR/info" 2>&1; then
	SMOL=1
	echo "== SmolLM2-135M-Instruct reads $DOC (about 2000 tokens, one fact"
	echo "   planted in it) and is asked: $QUESTION"
	echo "== 1/2: full cache, tenant qa-full, alone (the prefill takes a while)"
	qa qa-full full || { cat "$DIR/qa-full.err"; rc=1; }
	printf '   answer: %s\n' "$(cat "$DIR/qa-full.out")"
else
	echo "== SmolLM2 is not in the model cache: the question-answering part is skipped"
	sed 's/^/   /' "$DIR/info"
fi

QA=
if [ -n "$SMOL" ]; then
	echo "== 2/2: SmolLM2 again, tenant qa-snapkv, $SNAPKV (75% evicted), beside the engines below"
	qa qa-snapkv "$SNAPKV" &
	QA=$!
fi
# The reference engine on bytes2m (where ../shared has it), as one more
# tenant, with a learned policy (Fast KVzip's gate at 75% compression).
# Weights: those of `make weights` when present, else a quick training run
# (seconds).
MODEL=${KVTRIM_MODEL:-../shared/models/bytes2m.bin}
ENG=
if [ -r "$MODEL" ] && [ -x "$BIN/kvtrim-engine" ]; then
	W=$B/weights/bytes2m
	if [ ! -e "$W/fastkvzip.safetensors" ]; then
		W=$DIR/weights
		echo "== kvtrim-train --quick (no build/weights yet; make weights trains the full scorers)"
		$BIN/kvtrim-train --model "$MODEL" --out "$W" --seed 1 --quick >"$DIR/train.log" 2>&1 ||
			{ cat "$DIR/train.log"; exit 1; }
	fi
	ENG=1
else
	echo "== no model at $MODEL: the bytes2m engine tenant is skipped"
fi
# The loadgen tenants last a couple of seconds: start them once qa-snapkv
# (which loads the model first) has registered, so the snapshot below
# shows them side by side.
i=0
while [ -n "$QA" ] && kill -0 "$QA" 2>/dev/null && [ $i -lt 300 ] &&
	! $BIN/kvtrimctl tenants 2>/dev/null | grep -q qa-snapkv; do
	i=$((i + 1)); sleep 0.1
done
echo "== three loadgen engines: streaming (4 procs), streaming ratio (2 procs), full (2 procs)"
$BIN/kvtrim-loadgen --runtime-dir "$DIR" --clients 4 --seqs 8 --steps 600 \
	--policy streaming:sinks=4,tokens=128 --sync-every 4 --dtype f16 --step-us 1500 --verify --name chat &
L1=$!
$BIN/kvtrim-loadgen --runtime-dir "$DIR" --clients 2 --seqs 4 --steps 600 \
	--policy streaming:ratio=0.75 --sync-every 8 --dtype bf16 --step-us 1500 --verify --name summarize &
L2=$!
$BIN/kvtrim-loadgen --runtime-dir "$DIR" --clients 2 --seqs 4 --steps 300 \
	--policy full --step-us 3000 --verify --name reference &
L3=$!
if [ -n "$ENG" ]; then
	SPEC="fastkvzip:model=$W/fastkvzip.safetensors,ratio=0.75,window=16,sinks=4,every=16"
	echo "== kvtrim-engine ($MODEL) generating with $SPEC"
	$BIN/kvtrim-engine --model "$MODEL" --runtime-dir "$DIR" --tenant engine \
		--policy "$SPEC" --stats generate --prompt "The kernel" --steps 400 >"$DIR/engine.out" 2>&1 &
	ENG=$!
fi
sleep 0.5
echo "== kvtrimctl tenants (while running)"
$BIN/kvtrimctl tenants || true
echo "== kvtrimctl stats (while running)"
$BIN/kvtrimctl stats | grep -E '^(pool_bytes|chunks|tenants|sequences|entries|syncs_total|kv_bytes)' || true
wait $L1 || rc=1
wait $L2 || rc=1
wait $L3 || rc=1
if [ -n "$ENG" ]; then
	wait $ENG || rc=1
	echo "== bytes2m engine output (greedy text; the daemon's accounting of its tenant)"
	cat "$DIR/engine.out"
fi
if [ -n "$QA" ]; then
	echo "== waiting for qa-snapkv (its prefill)"
	wait $QA || { cat "$DIR/qa-snapkv.err"; rc=1; }
	printf '   answer: %s\n' "$(cat "$DIR/qa-snapkv.out")"
fi

if [ -n "$SMOL" ]; then
	echo "== SmolLM2's answers (the daemon's accounting at the end of each run:"
	echo "   KV = pages held x page bytes, kept = entries kept / entries appended)"
	printf '%-20s %-8s %10s %16s %14s %14s  %s\n' policy correct "KV MiB" \
		"kept/appended" "prefill tok/s" "decode tok/s" answer
	for t in qa-full qa-snapkv; do
		[ -s "$DIR/$t.err" ] && grep -q '^summary:' "$DIR/$t.err" || continue
		p=full; [ $t = qa-snapkv ] && p=$SNAPKV
		ok=no; grep -q "$FACT" "$DIR/$t.out" && ok=yes
		printf '%-20s %-8s %10s %16s %14s %14s  %s\n' "$p" "$ok" \
			"$(awk "BEGIN { printf \"%.1f\", $(val kv_bytes "$DIR/$t.err") / 1048576 }")" \
			"$(val kept_fraction "$DIR/$t.err")" \
			"$(val prefill_tokens_per_s "$DIR/$t.err")" \
			"$(val decode_tokens_per_s "$DIR/$t.err")" \
			"$(tr '\n' ' ' <"$DIR/$t.out")"
	done
	for t in qa-full qa-snapkv; do
		[ -s "$DIR/$t.err" ] && echo "   $t: $(grep '^summary:' "$DIR/$t.err" | cut -c10-)"
	done
fi
echo "== kvtrimctl check (after the engines left)"
$BIN/kvtrimctl check || rc=1
echo "== kvtrimctl stats (after)"
$BIN/kvtrimctl stats | grep -E '^(pool_size_bytes|pool_bytes|pool_chunks_used|syncs_total|entries_appended_total|entries_evicted_total|sync_us_total)'
echo "== stopping kvtrimd (SIGTERM)"
kill -TERM "$DPID"
if wait "$DPID"; then echo "kvtrimd exited 0"; else echo "kvtrimd exit status $?"; rc=1; fi
DPID=
echo "== demo done in $(($(date +%s) - T0)) s"
exit $rc
