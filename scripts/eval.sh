#!/bin/sh
# eval.sh — `make eval`: for every shared model present, trains its learned
# scorers when build/weights/<model>/ lacks them (kvtrim-train, seed 1),
# then runs kvtrim-eval, which merges its rows into docs/results/quality.csv
# and regenerates quality.md / quality.png.  The training fit table is
# copied beside them as fit-<model>.txt.
#
# Environment: B (build dir, default build), MODELS_DIR (default
# ../shared/models), OUT (default docs/results), EVAL_ARGS (extra
# kvtrim-eval arguments, e.g. --quick).
set -eu
B=${B:-build}
MODELS_DIR=${MODELS_DIR:-../shared/models}
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
ran=0
for m in bytes2m stories260K; do
	f="$MODELS_DIR/$m.bin"
	if [ ! -r "$f" ]; then
		echo "eval: $f not found, skipped"
		continue
	fi
	w="$B/weights/$m"
	if [ ! -e "$w/kvpop.safetensors" ] || [ ! -e "$w/kvzap-mlp/config.json" ]; then
		"$B/bin/kvtrim-train" --model "$f" --out "$w" --seed 1
	fi
	[ -e "$w/fit.txt" ] && cp "$w/fit.txt" "$OUT/fit-$m.txt"
	# shellcheck disable=SC2086
	"$B/bin/kvtrim-eval" --model "$f" --out "$OUT" --weights "$w" ${EVAL_ARGS:-}
	ran=$((ran + 1))
done
[ "$ran" -gt 0 ] || echo "eval: no model found in $MODELS_DIR"
