#!/bin/sh
# soak.sh — `make soak`: kvtrimd under memory pressure and engine crashes.
#
# Starts kvtrimd on a scratch runtime directory with a pool too small for
# what the engines would hold (so use crosses high_watermark, budgets are
# tightened and requests park or get KVT_EPOOLFULL), then 16 verifying
# loadgen engines (8 sequences x 2000 steps each) in four groups:
# streaming:tokens=64, h2o:tokens=64, kvzap (generated weights) and full.
# Every engine runs with --verify --tolerate-pressure --retry-full
# --expect-kills: a refused request backs off and retries, evictions beyond
# the policy's are accepted only where pressure explains them, and every
# entry kept is checked byte for byte after every sync.  Meanwhile a killer
# SIGKILLs a random engine process every 0.5-1.5 s (SOAK_KILLS of them);
# loadgen replaces each killed engine with a fresh tenant (--respawn).
#
# Passes when: every loadgen exits 0 (all surviving engines verified), the
# daemon is still up, `kvtrimctl check` is ok, pool_bytes_used is back to 0
# once the engines have gone, and pressure really happened.  Prints syncs
# per second, sync latency p50/p99 (daemon histogram and loadgen), kills
# survived and the pressure actions taken.
#
# Environment (defaults): B=build SOAK_ENGINES=16 (multiple of 8)
# SOAK_SEQS=8 SOAK_STEPS=2000 SOAK_POOL=32M SOAK_KILLS=24 SOAK_SEED=1
set -u
B=${B:-build}
BIN=$B/bin
ENGINES=${SOAK_ENGINES:-16}
SEQS=${SOAK_SEQS:-8}
STEPS=${SOAK_STEPS:-2000}
POOL=${SOAK_POOL:-32M}
KILLS=${SOAK_KILLS:-24}
SEED=${SOAK_SEED:-1}

DIR=$(mktemp -d /tmp/kvtrim-soak-XXXXXX)
DPID= KPID= MPID= LPIDS=
cleanup() {
	for p in $KPID $MPID $LPIDS; do kill "$p" 2>/dev/null; done
	[ -n "$DPID" ] && kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
	rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ctl() { "$BIN/kvtrimctl" --runtime-dir "$DIR" "$@"; }
stat_of() { ctl stats | awk -v k="$1" '$1 == k { print $2 }'; }
fail=0
bad() { echo "soak: FAIL: $*"; fail=1; }

# The default pool (16 chunks) holds one chunk per engine: every engine
# that grows beyond it (kvzap, full) needs pages another must give up first.
# Pressure from half the pool; a parked request waits at most 250 ms, so
# engines see KVT_EPOOLFULL and must back off; a tenant may hold at most
# 12 MiB (full engines need about 8).  Every engine runs as this one uid,
# the pool's only user, so its share is the whole pool (each process's
# stays half of it, more than the quota).
"$BIN/kvtrimd" --runtime-dir "$DIR" --backend cpu --pool-size "$POOL" \
	--high-watermark 0.5 --pressure-deadline-ms 250 --default-quota 12M \
	--uid-pool-share 1 --log-level warning 2>"$DIR/kvtrimd.log" &
DPID=$!
i=0
while [ ! -S "$DIR/ctl.ipc" ] || [ ! -S "$DIR/fd.sock" ]; do
	i=$((i + 1))
	if [ $i -gt 500 ] || ! kill -0 "$DPID" 2>/dev/null; then
		echo "soak: kvtrimd did not start"; cat "$DIR/kvtrimd.log"; exit 1
	fi
	sleep 0.01
done
echo "soak: kvtrimd pool $POOL, high_watermark 0.5, pressure_deadline_ms 250," \
	"default_quota 12M; $ENGINES engines x $SEQS seqs x $STEPS steps," \
	"$KILLS kills"

# Four groups: streaming 3/8, h2o 2/8, kvzap 2/8, full 1/8 of the engines.
n8=$((ENGINES / 8))
[ "$n8" -ge 1 ] || n8=1
COMMON="--runtime-dir $DIR --seqs $SEQS --steps $STEPS --verify --tolerate-pressure
	--retry-full --expect-kills --respawn $KILLS --seed $SEED"
t0=$(date +%s.%N)
for g in "stream:$((3 * n8)):streaming:tokens=64:f16" \
	"h2o:$((2 * n8)):h2o:tokens=64:f32" \
	"kvzap:$((2 * n8)):kvzap:bf16" \
	"full:$n8:full:f32"; do
	name=${g%%:*}; rest=${g#*:}
	n=${rest%%:*}; rest=${rest#*:}
	dt=${rest##*:}; pol=${rest%:*}
	# shellcheck disable=SC2086
	"$BIN/kvtrim-loadgen" $COMMON --name "soak-$name" --clients "$n" \
		--policy "$pol" --dtype "$dt" >"$DIR/lg-$name.out" 2>"$DIR/lg-$name.err" &
	LPIDS="$LPIDS $!"
done

# Samples pool use and pressure every 0.5 s (the peaks go in the summary).
(
	while :; do
		ctl stats 2>/dev/null | awk '$1 == "pool_use_ratio" || $1 == "pressure_level" ||
			$1 == "backpressure_parked_requests" || $1 == "tenants" { printf "%s=%s ", $1, $2 } END { print "" }'
		sleep 0.5
	done
) >"$DIR/samples" &
MPID=$!

# The killer: a random engine (a child of one of the loadgens) every
# 0.5-1.5 s.  Engines, not loadgens: the loadgen parents collect reports.
(
	k=0 r=$SEED
	while [ $k -lt "$KILLS" ]; do
		r=$(( (r * 1103515245 + 12345) % 2147483648 ))
		ms=$(( 500 + r % 1000 ))
		sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
		kids=""
		for lp in $LPIDS; do
			kids="$kids $(ps -o pid= --ppid "$lp" 2>/dev/null)"
		done
		set -- $kids
		[ $# -gt 0 ] || break
		r=$(( (r * 1103515245 + 12345) % 2147483648 ))
		shift $(( r % $# ))
		if kill -KILL "$1" 2>/dev/null; then
			k=$((k + 1))
			echo "kill $1"
		fi
	done
) >"$DIR/kills" &
KPID=$!

lg_fail=0
for p in $LPIDS; do
	wait "$p" || lg_fail=1
done
t1=$(date +%s.%N)
LPIDS=
kill "$KPID" "$MPID" 2>/dev/null
wait "$KPID" "$MPID" 2>/dev/null
KPID= MPID=
kills=$(grep -c '^kill' "$DIR/kills")

for f in "$DIR"/lg-*.out; do
	sed 's/^/  /' "$f"
done
if [ "$lg_fail" != 0 ]; then
	bad "a loadgen failed (verify or errors):"
	grep -v '^$' "$DIR"/lg-*.err | head -20 | sed 's/^/  /'
fi
if ! kill -0 "$DPID" 2>/dev/null; then
	bad "kvtrimd died"; tail -20 "$DIR/kvtrimd.log"; exit 1
fi

# Dead engines' tenants are reclaimed as their connections close; give the
# daemon a moment, then everything must be back in the pool.
i=0
while [ "$(stat_of pool_bytes_used)" != 0 ] && [ $i -lt 50 ]; do
	sleep 0.1; i=$((i + 1))
done
used=$(stat_of pool_bytes_used)
if out=$(ctl check); then :; else bad "kvtrimctl check: $out"; fi
[ "$used" = 0 ] || bad "pool_bytes_used is $used after all engines exited (pages leaked)"
[ "$(stat_of tenants)" = 0 ] || bad "tenants left registered: $(stat_of tenants)"

ctl metrics >"$DIR/metrics" || bad "kvtrimctl metrics failed"
ctl stats >"$DIR/stats"
s() { awk -v k="$1" '$1 == k { print $2 }' "$DIR/stats"; }
# p-quantile from the Prometheus histogram: the upper bound of the bucket
# where the cumulative count reaches p of the total.
hq() {
	awk -v p="$1" '
	/^kvtrim_sync_latency_seconds_bucket/ {
		match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5)
		n++; les[n] = le; cum[n] = $2 }
	/^kvtrim_sync_latency_seconds_count/ { total = $2 }
	END {
		if (!total) { print "n/a"; exit }
		for (i = 1; i <= n; i++) if (cum[i] >= p * total) {
			if (les[i] == "+Inf") print "> " les[i - 1] * 1e3 " ms";
			else printf "<= %g ms\n", les[i] * 1e3; exit }
	}' "$DIR/metrics"
}
pk() { awk -v k="$1" '{ for (i = 1; i <= NF; i++) { split($i, a, "="); if (a[1] == k && a[2] + 0 > m) m = a[2] + 0 } } END { print m + 0 }' "$DIR/samples"; }
lgq() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" "$DIR"/lg-*.out | sort -n | tail -1; }

secs=$(echo "$t0 $t1" | awk '{ printf "%.1f", $2 - $1 }')
syncs=$(s syncs_total)
tight=$(s pressure_tightenings_total)
waits=$(s backpressure_waits_total)
resumed=$(s backpressure_resumed_total)
timeouts=$(s backpressure_timeouts_total)
retries=$(sed -n 's/.* full_retries=\([0-9]*\).*/\1/p' "$DIR"/lg-*.out | awk '{ t += $1 } END { print t + 0 }')
pevict=$(sed -n 's/.* pressure_evicted=\([0-9]*\).*/\1/p' "$DIR"/lg-*.out | awk '{ t += $1 } END { print t + 0 }')
respawned=$(sed -n 's/.* respawned=\([0-9]*\).*/\1/p' "$DIR"/lg-*.out | awk '{ t += $1 } END { print t + 0 }')
if [ "${tight:-0}" = 0 ] && [ "${waits:-0}" = 0 ]; then
	bad "the pool never came under pressure (raise the load or lower SOAK_POOL)"
fi
[ "$kills" -gt 0 ] || bad "no engine was killed"

echo "soak: summary"
echo "  duration            ${secs} s (load phase)"
echo "  syncs               $syncs ($(echo "$syncs $secs" | awk '{ printf "%.0f", $1 / $2 }')/s), error_replies_total $(s error_replies_total)"
echo "  sync latency        daemon p50 $(hq 0.5), p99 $(hq 0.99); loadgen worst group p50 $(lgq sync_p50_us) us, p99 $(lgq sync_p99_us) us (incl. backoff)"
echo "  kills survived      $kills (engines respawned $respawned, tenants reclaimed $(s tenants_reclaimed_total))"
echo "  pressure            peak pool use $(pk pool_use_ratio), peak level $(pk pressure_level), tightenings $tight"
echo "  backpressure        parked $waits, resumed $resumed, EPOOLFULL after deadline $timeouts, peak parked $(pk backpressure_parked_requests); engine retries $retries"
echo "  verify              extra evictions under pressure accepted $pevict; mismatches $(sed -n 's/.* mismatches=\([0-9]*\).*/\1/p' "$DIR"/lg-*.out | awk '{ t += $1 } END { print t + 0 }')"
echo "  after exit          pool_bytes_used $used, check $(ctl check 2>&1), chunks created/released $(s chunks_created_total)/$(s chunks_released_total)"
if [ $fail = 0 ]; then echo "soak: PASS"; else echo "soak: FAIL"; fi
exit $fail
