#!/bin/sh
# gpu-check.sh — the one prepared GPU check of kvtrim (`make gpu-check`),
# under five minutes on an H100/H200:
#   1. builds with USE_CUDA=yes (everything; only the CUDA targets when the
#      rest cannot build on this host);
#   2. runs build/bin/kvtrim-cuda-tests: every CUDA op against its CPU
#      reference, and the cuda backend (VMM and legacy-IPC chunks,
#      interprocess events) across two processes;
#   3. runs the integration tests on the cuda backend (KVTRIM_BACKEND=cuda:
#      pages are device memory, which the tests and the reference engine
#      reach through kvt_memcpy), then two engine processes
#      (kvtrim-loadgen --clients 2 --verify) against one cuda kvtrimd, in
#      both sharing modes;
#   4. runs build/bin/kvtrim-cuda-bench: each benchmark beside its floor
#      measured in the same run (compact, paged attention and the backend's
#      attention op against a device-to-device memcpy, the KVzap MLP and
#      the Fast KVzip gate against bare cuBLAS GEMMs, key_norms against a
#      copy of the same K bytes, the snapkv and expected_attention rules
#      against the logits' SGEMMs); then kvtrim-bench --sync-only and
#      --traffic-only on this GPU: the sync round trip on the cuda backend
#      beside bare nng, and the host <-> device bytes per token;
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
put cuda_build_warnings "$(grep -cE '(kernels/cuda|tests/kernels).*warning' "$LOG")"
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
# A selector with a '/' matches the tests' source files (test.h); a run
# that selects nothing ("0 passed") fails the check.
if [ -x "$B/bin/kvtrim-tests" ]; then
	KVTRIM_BACKEND=cuda KVTRIM_BIN_DIR=$B/bin timeout 150 \
		"$B/bin/kvtrim-tests" tests/integration/ > "$B/gpu-integration.log" 2>&1
	rc=$?
	counts integration_cuda "$B/gpu-integration.log" || status=1
	[ "$rc" -ne 0 ] && status=1
	grep -q '^0 passed' "$B/gpu-integration.log" && status=1
else
	put integration_cuda not_built
	status=1
fi

# ---- 3b. two engine processes on one cuda daemon (loadgen, 2 clients)
# loadgen writes K/V through kvt_kv_ptr; on a cuda tenant those are device
# addresses, so it runs only once loadgen has a device path (it asks
# kvt_memory_kind, moves bytes with kvt_memcpy, and its summary line says
# memory=cuda when its pages were device memory).
# Each run (scripts/loadgen-cuda.sh): one daemon, sharing mode forced by
# KVTRIM_CUDA_SHARE (vmm, or the legacy-IPC fallback), two loadgen
# processes verifying every kept byte after every sync, then kvtrimctl
# check; h2o also exercises the daemon's key staging (read_regions).
if [ -x "$B/bin/kvtrimd" ] && [ -x "$B/bin/kvtrim-loadgen" ]; then
	for run in "streaming streaming:sinks=4,tokens=64 vmm" \
		"h2o h2o:tokens=96 vmm" \
		"ipc_streaming streaming:sinks=4,tokens=64 ipc"; do
		# shellcheck disable=SC2086
		set -- $run
		sh scripts/loadgen-cuda.sh "$B/bin" "$1" "$2" "$3" \
			> "$B/gpu-loadgen-$1.txt" 2> "$B/gpu-loadgen-$1.log" ||
			status=1
		cat "$B/gpu-loadgen-$1.txt" >> "$tmp"
		cat "$B/gpu-loadgen-$1.txt"
	done
	# every other policy, as `make test` runs them on the emulator
	sh scripts/loadgen-policies.sh "$B/bin" > "$B/gpu-loadgen-all.txt" \
		2> "$B/gpu-loadgen-all.log" || status=1
	grep -v share_mode "$B/gpu-loadgen-all.txt" >> "$tmp"
	grep -v share_mode "$B/gpu-loadgen-all.txt"
else
	put loadgen_cuda_2_clients not_built
	status=1
fi

# ---- 4. benchmarks with their floors: every line kvtrim-cuda-bench
# prints goes to the report (--out appends them as they come, so a
# failure keeps the lines before it), the gpu_kvt_attention_*,
# gpu_key_norms_* and gpu_*_select_* lines of the backend's ops included
if [ -x "$B/bin/kvtrim-cuda-bench" ]; then
	timeout 240 "$B/bin/kvtrim-cuda-bench" --out "$tmp" >> "$LOG" 2>&1
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

# ---- 4c. host <-> device bytes, launches and the daemon's CPU per decoded
# token per sequence at the 8B geometry, and launches a sync at 1 and 64
# sequences (target 16), every policy, on this GPU
# (kvtrim-bench --traffic-only with KVTRIM_BENCH_CUDA_LIB; targets: 4096
# bytes and 5 us)
if [ -x "$B/bin/kvtrim-bench" ] && [ -f "$B/lib/libkvtrim-cuda.so" ]; then
	if KVTRIM_BENCH_CUDA_LIB=$(cd "$B/lib" && pwd)/libkvtrim-cuda.so \
		timeout 300 "$B/bin/kvtrim-bench" --bin-dir "$B/bin" \
		--traffic-only --out "$B/gpu-traffic.txt" >> "$LOG" 2>&1; then
		sed -n 's/^cuda_host_bytes_per_token_/gpu_host_bytes_per_token_/p
			s/^cuda_launches_per_token_/gpu_launches_per_token_/p
			s/^cuda_launches_per_sync_/gpu_launches_per_sync_/p
			s/^cuda_daemon_us_per_token_/gpu_daemon_us_per_token_/p
			s/^cuda_daemon_cpu_us_per_token_/gpu_daemon_cpu_us_per_token_/p' \
			"$B/gpu-traffic.txt" | tee -a "$tmp"
	else
		put traffic_bench FAILED
		status=1
	fi
else
	put traffic_bench not_built
	status=1
fi

put gpu_check_seconds $(( $(date +%s) - t0 ))
put gpu_check_status "$status"
mv "$tmp" "$REPORT"
echo "report: $REPORT"
exit "$status"
