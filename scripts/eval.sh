#!/bin/sh
# eval.sh — `make eval`: for every shared model present, trains its learned
# scorers when build/weights/<model>/ lacks them (kvtrim-train, seed 1),
# then runs kvtrim-eval, which merges its rows into docs/results/quality.csv
# and regenerates quality.md / quality.png.  The training fit table is
# copied beside them as fit-<model>.txt.  Then SmolLM2, when the model
# cache holds it (verified by `make models`: the .sha256 stamp, the rule of
# engine/model_files.h): the scorers that ship in weights/smollm2/, checked
# against their SHA256SUMS, as any directory that has one (`make
# weights-check` shows that `make weights` trains those bytes; the
# committed tables name those paths in their specs), or SMOL_WEIGHTS=DIR
# (kvtrim-train's output, e.g. build/weights/smollm2 after `make
# weights`); kvtrim-eval's protocol 1 (about 20 minutes, then its needle
# and copy tasks, about 25) into OUT/smollm2/ (quality.csv / .md / .png,
# specs, fit.txt), then its protocol 2 (decoding-time compression, about
# 20 minutes on two cores, then the decoding-time needle, about 22)
# beside it (protocol2.csv / .md / .png, specs-smollm2-protocol2.txt,
# needle-decoding.csv / .md).
#
# Environment: B (build dir, default build), MODELS_DIR (default
# ../shared/models), OUT (default docs/results), EVAL_ARGS (extra
# kvtrim-eval arguments, e.g. --quick), SMOL_WEIGHTS (default
# weights/smollm2).
set -eu
B=${B:-build}
MODELS_DIR=${MODELS_DIR:-../shared/models}
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
ran=0
# kvtrim-train with OpenBLAS's Haswell kernels, as `make weights` runs it
# (the Makefile's TRAIN_BLAS: other kernels round differently)
train() { OPENBLAS_CORETYPE=Haswell "$B/bin/kvtrim-train" "$@"; }
for m in bytes2m stories260K; do
	f="$MODELS_DIR/$m.bin"
	if [ ! -r "$f" ]; then
		echo "eval: $f not found, skipped"
		continue
	fi
	w="$B/weights/$m"
	if [ ! -e "$w/kvpop.safetensors" ] || [ ! -e "$w/kvzap-mlp/config.json" ]; then
		train --model "$f" --out "$w" --seed 1
	fi
	[ -e "$w/fit.txt" ] && cp "$w/fit.txt" "$OUT/fit-$m.txt"
	# shellcheck disable=SC2086
	"$B/bin/kvtrim-eval" --model "$f" --out "$OUT" --weights "$w" ${EVAL_ARGS:-}
	ran=$((ran + 1))
done
d=${KVTRIM_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtrim/models}
if [ -r "$d/SmolLM2-135M-Instruct.Q4_1.gguf.sha256" ]; then
	w=${SMOL_WEIGHTS:-weights/smollm2}
	if [ -e "$w/SHA256SUMS" ]; then
		# shipped scorers changed by hand would otherwise regenerate
		# tables that no command can reproduce
		(cd "$w" && sha256sum --quiet -c SHA256SUMS) || {
			echo "eval: $w differs from its SHA256SUMS" >&2
			exit 1
		}
	elif [ ! -e "$w/kvpop.safetensors" ] || [ ! -e "$w/kvzap-mlp/config.json" ]; then
		echo "eval: $w lacks the SmolLM2 scorers (make weights)" >&2
		exit 1
	fi
	mkdir -p "$OUT/smollm2"
	[ -e "$w/fit.txt" ] && cp "$w/fit.txt" "$OUT/smollm2/fit.txt"
	# shellcheck disable=SC2086
	"$B/bin/kvtrim-eval" --model smollm2 --out "$OUT/smollm2" --weights "$w" ${EVAL_ARGS:-}
	# shellcheck disable=SC2086
	"$B/bin/kvtrim-eval" --model smollm2 --protocol 2 --out "$OUT/smollm2" --weights "$w" ${EVAL_ARGS:-}
	ran=$((ran + 1))
else
	echo "eval: SmolLM2 not in $d (make models), skipped"
fi
[ "$ran" -gt 0 ] || echo "eval: no model found in $MODELS_DIR"
