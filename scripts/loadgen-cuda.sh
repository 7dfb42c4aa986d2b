#!/bin/sh
# loadgen-cuda.sh BIN_DIR NAME POLICY [SHARE [LOADGEN_ARG...]] — two engine
# processes (kvtrim-loadgen --clients 2 --verify: every kept byte checked
# after every sync) against one kvtrimd on the cuda backend, then
# `kvtrimctl check` (which compares each live tenant's device table with its
# host table) while the daemon runs.  SHARE sets KVTRIM_CUDA_SHARE (vmm,
# ipc; empty or absent: the backend's choice).  LOADGEN_ARGs go to
# kvtrim-loadgen after the defaults (--seqs 4 --steps 200), so
# `--steps 48 --prefill 32` overrides them.  Prints two report lines,
#   loadgen_cuda_2_clients_NAME ok|FAILED
#   loadgen_cuda_share_mode_NAME vmm|ipc|unknown
# and, on failure, the logs to stderr; exits 1 when the run failed.
# Used by scripts/gpu-check.sh on a GPU and by `make test` with
# KVTRIM_CUDA_LIB naming the emulated libkvtrim-cuda.so (docs/cuda.md).
B=${1:?usage: loadgen-cuda.sh BIN_DIR NAME POLICY [SHARE [LOADGEN_ARG...]]}
name=${2:?name}
policy=${3:?policy}
rt=$(mktemp -d)
if [ -n "${4:-}" ]; then
	KVTRIM_CUDA_SHARE=$4
	export KVTRIM_CUDA_SHARE
fi
# what is left in "$@" goes to kvtrim-loadgen
if [ $# -gt 4 ]; then shift 4; else set --; fi
"$B/kvtrimd" --backend cuda --runtime-dir "$rt" --pool-size 1G \
	--log-level info 2> "$rt/daemon.log" &
dpid=$!
# stats.sock is the last socket kvtrimd creates; stop waiting early when
# the daemon exited (its reason is in the log)
i=0
while [ ! -S "$rt/stats.sock" ] && [ $i -lt 100 ] &&
	kill -0 "$dpid" 2>/dev/null; do
	sleep 0.1
	i=$((i + 1))
done
status=0
if timeout 60 "$B/kvtrim-loadgen" --runtime-dir "$rt" --clients 2 \
	--seqs 4 --steps 200 --policy "$policy" --verify "$@" \
	> "$rt/loadgen.log" 2>&1 &&
	grep -q ' memory=cuda' "$rt/loadgen.log" &&
	"$B/kvtrimctl" --runtime-dir "$rt" check >> "$rt/loadgen.log" 2>&1; then
	echo "loadgen_cuda_2_clients_$name ok"
else
	echo "loadgen_cuda_2_clients_$name FAILED"
	cat "$rt/loadgen.log" "$rt/daemon.log" >&2
	status=1
fi
mode=$(sed -n 's/.*backend cuda (\([a-z]*\)).*/\1/p' "$rt/daemon.log" | head -1)
echo "loadgen_cuda_share_mode_$name ${mode:-unknown}"
kill "$dpid" 2>/dev/null
wait "$dpid" 2>/dev/null
rm -rf "$rt"
exit $status
