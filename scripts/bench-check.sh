#!/bin/sh
# bench-check.sh FILE [EXPECTED]: checks what kvtrim-bench wrote (FILE, its
# --out) against the lines it must hold (EXPECTED, default
# tests/bench/expected-quick.txt: one name a line, "floor" after the name
# of a floor).  Fails, naming each offence, when
#   - a phase wrote "# ... failed",
#   - a value is not a finite number (nan, inf, empty; the one text value,
#     cuda_daemon_cpu_backend, aside),
#   - an expected line is missing, unless its phase says it was skipped
#     for a stated reason ("# smollm2 lines skipped: ...": every smollm2_
#     line; "# smollm2 learned policies skipped: ...": the kvzap, fastkvzip
#     and kvpop ones; "# cuda traffic lines skipped: ...": every cuda_
#     line),
#   - a floor is not above 0 (it could not be measured).
# .ci/run runs it after `kvtrim-bench --quick`.
set -eu
FILE=$1
EXPECTED=${2:-tests/bench/expected-quick.txt}
[ -r "$FILE" ] || { echo "bench-check: cannot read $FILE" >&2; exit 1; }
[ -r "$EXPECTED" ] || { echo "bench-check: cannot read $EXPECTED" >&2; exit 1; }
awk -v file="$FILE" '
FNR == NR {                     # EXPECTED
	if ($0 ~ /^#/ || NF == 0) next
	want[$1] = 1; floor[$1] = ($2 == "floor"); order[++nw] = $1
	next
}
/^# .* failed/ { print "bench-check: " substr($0, 3); bad++; next }
/^# smollm2 lines skipped/ { skip_smol = 1; next }
/^# smollm2 learned policies skipped/ { skip_learned = 1; next }
/^# cuda traffic lines skipped/ { skip_cuda = 1; next }
/^#/ || NF == 0 { next }
{
	name = $1; val = $2; seen[name] = 1
	if (name == "cuda_daemon_cpu_backend") next
	if (NF != 2 || val !~ /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/) {
		print "bench-check: " name " is not a finite number: " $0; bad++
		next
	}
	if ((name in floor) && floor[name] && val + 0 <= 0) {
		print "bench-check: the floor " name " could not be measured: " val
		bad++
	}
}
END {
	for (i = 1; i <= nw; i++) {
		n = order[i]
		if (n in seen) continue
		if (skip_smol && n ~ /^smollm2_/) continue
		if (skip_learned && n ~ /^smollm2_.*_(kvzap|fastkvzip|kvpop)_/) continue
		if (skip_cuda && n ~ /^cuda_/) continue
		print "bench-check: missing line " n; bad++
	}
	if (bad) { print "bench-check: " file ": " bad " problem(s)"; exit 1 }
	print "bench-check: " file ": every expected line (" nw ") present and finite"
}' "$EXPECTED" "$FILE"
