#!/bin/sh
# make demo: start kvtrimd on a scratch runtime directory, drive it with
# several loadgen tenants (different policies, verifying every entry), show
# the daemon's view while they run, check the pool invariants, stop cleanly.
set -eu
B=${B:-build}
BIN=$B/bin
DIR=$(mktemp -d /tmp/kvtrim-demo-XXXXXX)
export KVTRIM_RUNTIME_DIR=$DIR
cleanup() { [ -n "${DPID:-}" ] && kill "$DPID" 2>/dev/null || true; rm -rf "$DIR"; }
trap cleanup EXIT

echo "== kvtrimd --runtime-dir $DIR --backend cpu --pool-size 256M"
$BIN/kvtrimd --runtime-dir "$DIR" --backend cpu --pool-size 256M 2>"$DIR/kvtrimd.log" &
DPID=$!
i=0
while [ ! -S "$DIR/ctl.ipc" ] || [ ! -S "$DIR/fd.sock" ]; do
	i=$((i + 1)); [ $i -gt 500 ] && { cat "$DIR/kvtrimd.log"; exit 1; }
	sleep 0.01
done

echo "== three engines: streaming (4 procs), streaming ratio (2 procs), full (2 procs)"
$BIN/kvtrim-loadgen --runtime-dir "$DIR" --clients 4 --seqs 8 --steps 600 \
	--policy streaming:sinks=4,tokens=128 --sync-every 4 --dtype f16 --step-us 1500 --verify --name chat &
L1=$!
$BIN/kvtrim-loadgen --runtime-dir "$DIR" --clients 2 --seqs 4 --steps 600 \
	--policy streaming:ratio=0.75 --sync-every 8 --dtype bf16 --step-us 1500 --verify --name summarize &
L2=$!
$BIN/kvtrim-loadgen --runtime-dir "$DIR" --clients 2 --seqs 4 --steps 300 \
	--policy full --step-us 3000 --verify --name reference &
L3=$!
# The reference engine on a real model, as one more tenant, with a learned
# policy (Fast KVzip's gate at 75% compression).  Weights: those of
# `make weights` when present, else a quick training run (seconds).
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
	SPEC="fastkvzip:model=$W/fastkvzip.safetensors,ratio=0.75,window=16,sinks=4,every=16"
	echo "== kvtrim-engine ($MODEL) generating with $SPEC"
	$BIN/kvtrim-engine --model "$MODEL" --runtime-dir "$DIR" --tenant engine \
		--policy "$SPEC" --stats generate --prompt "The kernel" --steps 400 >"$DIR/engine.out" 2>&1 &
	ENG=$!
else
	echo "== no model at $MODEL: the engine tenant is skipped"
fi
sleep 0.5
echo "== kvtrimctl tenants (while running)"
$BIN/kvtrimctl tenants || true
echo "== kvtrimctl stats (while running)"
$BIN/kvtrimctl stats | grep -E '^(pool_bytes|chunks|tenants|sequences|entries|syncs_total|kv_bytes)' || true
rc=0
wait $L1 || rc=1
wait $L2 || rc=1
wait $L3 || rc=1
if [ -n "$ENG" ]; then
	wait $ENG || rc=1
	echo "== engine output (greedy text; the daemon's accounting of its tenant)"
	cat "$DIR/engine.out"
fi
echo "== kvtrimctl check (after the engines left)"
$BIN/kvtrimctl check || rc=1
echo "== kvtrimctl stats (after)"
$BIN/kvtrimctl stats | grep -E '^(pool_bytes|chunks_used|syncs_total|entries_appended_total|entries_evicted_total|sync_us_total)'
echo "== stopping kvtrimd (SIGTERM)"
kill -TERM "$DPID"
if wait "$DPID"; then echo "kvtrimd exited 0"; else echo "kvtrimd exit status $?"; rc=1; fi
DPID=
exit $rc
