#!/bin/sh
# gpu-check.sh — the one prepared GPU check of kvtrim (`make gpu-check`),
# under five minutes on an H100/H200:
#   1. builds with USE_CUDA=yes (everything; only the CUDA targets when the
#      rest cannot build on this host);
#   2. runs build/bin/kvtrim-cuda-tests: every CUDA op against its CPU
#      reference, and the cuda backend (VMM and legacy-IPC chunks,
#      interprocess events) across two processes;
#   3. runs the integration tests on the cuda backend (KVTRIM_BACKEND=cuda:
#      pages are device memory, which the tests and the tinyllm engine
#      reach through kvt_memcpy), then two engine processes
#      (kvtrim-loadgen --clients 2 --verify) against one cuda kvtrimd, in
#      both sharing modes;
#   4. runs build/bin/kvtrim-cuda-bench: each benchmark beside its floor
#      measured in the same run (compact and paged attention against a
#      device-to-device memcpy, the KVzap MLP against bare cuBLAS GEMMs),
#      then the sync round trip on the cuda backend beside bare nng;
# and writes build/gpu-report.txt as "name value" lines.  Details go to
# build/gpu-check.log and build/gpu-tests.log.  Exit status 0 when
# everything that ran passed.
#
# Environment: B (build dir, default build), JOBS (make -j), CUDA_ARCHS.
set -u
cd "$(dirname "$0")/.." || exit 2
B=${B:-build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
REPORT=$B/gpu-report.txt
LOG=$B/gpu-check.log
TLOG=$B/gpu-tests.log
mkdir -p "$B"
: > "$LOG"
tmp=$REPORT.tmp
: > "$tmp"
t0=$(date +%s)
status=0

put() {
	echo "$1 $2" >> "$tmp"
	echo "$1 $2"
}

# "N passed, N failed, N skipped" of a runner log -> three report lines
counts() { # prefix log
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$2" | tail -1)
	if [ -z "$line" ]; then
		put "$1_result" no_summary_line
		return 1
	fi
	# shellcheck disable=SC2086
	set -- "$1" $line
	put "$1_passed" "$2"
	put "$1_failed" "$4"
	put "$1_skipped" "$6"
}

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total \
	--format=csv,noheader 2>/dev/null | head -1 | tr -s ' ,' '_')
put gpu "${gpu:-unknown}"
[ -n "${CUDA_ARCHS:-}" ] && export CUDA_ARCHS

# ---- 1. build
tb=$(date +%s)
if make -j"$JOBS" USE_CUDA=yes all >> "$LOG" 2>&1; then
	put build ok
elif make -j"$JOBS" USE_CUDA=yes "$B/lib/libkvtrim-cuda.so" \
	"$B/bin/kvtrim-cuda-tests" "$B/bin/kvtrim-cuda-bench" >> "$LOG" 2>&1; then
	put build cuda_only
	echo "full build failed on this host; see $LOG" >&2
else
	put build FAILED
	status=1
fi
put build_seconds $(( $(date +%s) - tb ))
put cuda_build_warnings "$(grep -E '(kernels/cuda|tests/kernels).*warning' "$LOG" | wc -l)"
if [ -x "$B/bin/kvtrimd" ]; then
	put daemon_links_cuda "$(ldd "$B/bin/kvtrimd" | grep -c -E 'libcuda|libcudart|libcublas')"
fi

# ---- 2. CPU-vs-CUDA kernel tests and the backend
if [ -x "$B/bin/kvtrim-cuda-tests" ]; then
	timeout 240 "$B/bin/kvtrim-cuda-tests" > "$TLOG" 2>&1
	rc=$?
	counts cuda_tests "$TLOG" || status=1
	[ "$rc" -ne 0 ] && status=1
	mode=$(sed -n 's/^ *sharing mode: //p' "$TLOG" | head -1)
	put cuda_share_mode "${mode:-unknown}"
	grep -E '^FAIL ' "$TLOG" | while read -r _ name _; do
		put "cuda_test_failed_$name" 1
	done
else
	put cuda_tests not_built
	status=1
fi

# ---- 3. integration on the cuda backend
if [ -x "$B/bin/kvtrim-tests" ] && grep -q KVTRIM_BACKEND tests/harness/*.c 2>/dev/null; then
	KVTRIM_BACKEND=cuda KVTRIM_BIN_DIR=$B/bin timeout 150 \
		"$B/bin/kvtrim-tests" integration > "$B/gpu-integration.log" 2>&1
	rc=$?
	counts integration_cuda "$B/gpu-integration.log" || status=1
	[ "$rc" -ne 0 ] && status=1
else
	put integration_cuda not_wired
fi

# ---- 3b. two engine processes on one cuda daemon (loadgen, 2 clients)
# loadgen writes K/V through kvt_kv_ptr; on a cuda tenant those are device
# addresses, so it runs only once loadgen has a device path (it asks
# kvt_memory_kind, moves bytes with kvt_memcpy, and its summary line says
# memory=cuda when its pages were device memory).
# Each run: one daemon (sharing mode forced by KVTRIM_CUDA_SHARE: vmm, or
# the legacy-IPC fallback), two loadgen processes verifying every kept byte
# after every sync; h2o also exercises the daemon's key staging
# (read_regions), streaming only compaction.  Then kvtrimctl check (the
# audit compares each live tenant's device table with its host table) and
# the pool must be empty again.
loadgen_run() { # name share policy
	rt=$(mktemp -d)
	KVTRIM_CUDA_SHARE=$2 "$B/bin/kvtrimd" --backend cuda --runtime-dir "$rt" \
		--pool-size 1G --log-level info 2> "$B/gpu-loadgen-$1-daemon.log" &
	dpid=$!
	# stats.sock is the last socket kvtrimd creates; stop waiting early
	# when the daemon exited (its reason is in the log)
	i=0
	while [ ! -S "$rt/stats.sock" ] && [ $i -lt 100 ] &&
		kill -0 "$dpid" 2>/dev/null; do
		sleep 0.1
		i=$((i + 1))
	done
	if timeout 60 "$B/bin/kvtrim-loadgen" --runtime-dir "$rt" --clients 2 \
		--seqs 4 --steps 200 --policy "$3" \
		--verify > "$B/gpu-loadgen-$1.log" 2>&1 &&
		grep -q ' memory=cuda' "$B/gpu-loadgen-$1.log" &&
		"$B/bin/kvtrimctl" --runtime-dir "$rt" check \
			>> "$B/gpu-loadgen-$1.log" 2>&1; then
		put "loadgen_cuda_2_clients_$1" ok
	else
		put "loadgen_cuda_2_clients_$1" FAILED
		status=1
	fi
	mode=$(sed -n 's/.*backend cuda (\([a-z]*\)).*/\1/p' \
		"$B/gpu-loadgen-$1-daemon.log" | head -1)
	put "loadgen_cuda_share_mode_$1" "${mode:-unknown}"
	kill "$dpid" 2>/dev/null
	wait "$dpid" 2>/dev/null
	rm -rf "$rt"
}
if [ -x "$B/bin/kvtrimd" ] && [ -x "$B/bin/kvtrim-loadgen" ]; then
	loadgen_run streaming vmm streaming:sinks=4,tokens=64
	loadgen_run h2o vmm h2o:tokens=96
	loadgen_run ipc_streaming ipc streaming:sinks=4,tokens=64
else
	put loadgen_cuda_2_clients not_built
	status=1
fi

# ---- 4. benchmarks with their floors
if [ -x "$B/bin/kvtrim-cuda-bench" ]; then
	timeout 150 "$B/bin/kvtrim-cuda-bench" --out "$tmp" >> "$LOG" 2>&1
	rc=$?
	if [ "$rc" -eq 77 ]; then
		put bench skipped_no_device
		status=1
	elif [ "$rc" -ne 0 ]; then
		put bench FAILED
		status=1
	fi
else
	put bench not_built
	status=1
fi

# ---- 4b. the sync round trip on the cuda backend, beside bare nng and a
# raw Unix socket measured in the same run (kvtrim-bench --sync-only)
if [ -x "$B/bin/kvtrim-bench" ]; then
	if timeout 90 "$B/bin/kvtrim-bench" --bin-dir "$B/bin" --backend cuda \
		--sync-only --out "$B/gpu-sync.txt" >> "$LOG" 2>&1; then
		cat "$B/gpu-sync.txt" >> "$tmp"
		cat "$B/gpu-sync.txt"
	else
		put sync_bench FAILED
		status=1
	fi
else
	put sync_bench not_built
	status=1
fi

put gpu_check_seconds $(( $(date +%s) - t0 ))
put gpu_check_status "$status"
mv "$tmp" "$REPORT"
echo "report: $REPORT"
exit "$status"
