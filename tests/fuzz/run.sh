#!/bin/sh
# run.sh — runs the libFuzzer targets (called by `make fuzz`).
#
#   BIN=DIR SECONDS=N JOBS=J MERGE=0|1 sh tests/fuzz/run.sh TARGET...
#
# Each target DIR/fuzz_TARGET runs for SECONDS on a working corpus
# (DIR/work/TARGET, started from tests/fuzz/corpus/TARGET and kept between
# runs), J targets at a time under nice.  Crash, leak, timeout and OOM
# inputs go to DIR/artifacts/TARGET/.  Prints per target: runs, coverage,
# features, corpus size and crashes; exits 1 when any target found
# something or failed to run.  MERGE=1 then minimises each working corpus
# (-merge=1) back into tests/fuzz/corpus/TARGET (what is committed).
set -u
: "${BIN:?}" "${SECONDS_PER_TARGET:=600}" "${JOBS:=1}" "${MERGE:=0}"
SRC=tests/fuzz/corpus
status=0

# Longest input per target.  A GGUF file with a tokenizer cannot be small
# (256 byte tokens and their types alone take 2.5 KB; the seeds made by
# scripts/fixtures/gguf_fuzz_seeds.py are 20-40 KB).
max_len() {
	case $1 in gguf) echo 65536 ;; *) echo 8192 ;; esac
}

run_one() {
	t=$1
	work=$BIN/work/$t art=$BIN/artifacts/$t/ log=$BIN/$t.log
	mkdir -p "$work" "$art"
	# A new run starts from the committed seeds plus what earlier runs
	# kept; old artifacts would be reported again, so they are cleared.
	rm -f "$art"* 2>/dev/null
	[ -d "$SRC/$t" ] && cp -n "$SRC/$t"/* "$work"/ 2>/dev/null
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	nice -n 10 "$BIN/fuzz_$t" "$work" -max_total_time="$SECONDS_PER_TARGET" \
		-timeout=10 -rss_limit_mb=2048 -max_len=$(max_len $t) \
		-print_final_stats=1 -artifact_prefix="$art" >"$log" 2>&1
	echo $? >"$BIN/$t.rc"
}

summary() {
	t=$1 log=$BIN/$t.log
	rc=$(cat "$BIN/$t.rc" 2>/dev/null || echo 99)
	runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	line=$(grep -E '^#[0-9]+' "$log" | tail -1)
	cov=$(echo "$line" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
	ft=$(echo "$line" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
	corp=$(echo "$line" | sed -n 's/.* corp: \([0-9]*\).*/\1/p')
	crashes=$(find "$BIN/artifacts/$t" -type f | wc -l)
	verdict=ok
	if [ "$rc" != 0 ] || [ "$crashes" != 0 ]; then
		verdict=FAIL status=1
	fi
	printf 'fuzz %-8s runs=%s cov=%s ft=%s corpus=%s crashes=%s seconds=%s rc=%s %s\n' \
		"$t" "${runs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes" \
		"$SECONDS_PER_TARGET" "$rc" "$verdict"
	if [ "$verdict" = FAIL ]; then
		grep -E 'ERROR: |SUMMARY: |fuzz_[a-z]+: |^artifact_prefix|Test unit written' \
			"$log" | head -20 | sed 's/^/  /'
		echo "  full log: $log; reproduce: $BIN/fuzz_$t ARTIFACT"
	fi
}

# Runs the targets JOBS at a time (plain sh: background jobs and wait).
set -- "$@"
while [ $# -gt 0 ]; do
	batch=""
	i=0
	while [ $# -gt 0 ] && [ $i -lt "$JOBS" ]; do
		run_one "$1" &
		batch="$batch $1"
		i=$((i + 1))
		shift
	done
	wait
	for t in $batch; do
		summary "$t"
		done_list="${done_list:-} $t"
	done
done

# The committed corpus: the named seeds (tests/fuzz/gen_seeds.c, real config
# files, regression inputs) plus the fewest found inputs that add edge
# coverage beyond them (-use_counters=0 -use_cmp=0: hit-count and
# comparison features would keep hundreds of near-duplicates).
if [ "$MERGE" = 1 ]; then
	for t in $done_list; do
		new=$BIN/merged/$t
		rm -rf "$new"
		mkdir -p "$new"
		for f in "$SRC/$t"/*; do
			n=${f##*/}
			case $n in
			*[!0-9a-f]*) cp "$f" "$new"/ ;;
			*) [ ${#n} = 40 ] || cp "$f" "$new"/ ;; # not a SHA-1
			esac
		done
		nice -n 10 "$BIN/fuzz_$t" -merge=1 -use_counters=0 -use_cmp=0 \
			-timeout=10 -rss_limit_mb=2048 -max_len=$(max_len $t) \
			"$new" "$BIN/work/$t" >"$BIN/$t.merge.log" 2>&1 ||
			{ echo "fuzz $t: merge failed (see $BIN/$t.merge.log)"; status=1; continue; }
		rm -rf "$SRC/$t"
		mkdir -p "$SRC/$t"
		cp "$new"/* "$SRC/$t"/
		echo "fuzz $t: corpus minimised to $(ls "$SRC/$t" | wc -l) files," \
			"$(cat "$SRC/$t"/* | wc -c) bytes in $SRC/$t"
	done
fi
exit $status
