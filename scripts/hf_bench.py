#!/usr/bin/env python3
"""hf_bench.py -- SmolLM2-135M-Instruct through Hugging Face transformers:
decode ms/step and KV bytes of transformers' DynamicCache (the floor),
kvtrim (full, kvzap and streaming evicting 75 %) and kvpress 0.5.5
(DMSPress(KVzapPress) with kvtrim's trained KVzap weights,
StreamingLLMPress), on the same model and prompts (`make bench-python`).

  hf_bench.py [--quick] [--sizes 4096,8192] [--batch 4] [--steps 16]
              [--out FILE]

Runs in the environment of scripts/python_venv.sh with kvtrim importable
(`make bench-python` installs this checkout's package into build/pyenv and
puts it first on PYTHONPATH).  Progress (what, how far, elapsed, ETA) on
stderr; results on stdout (and in --out) as `name value` lines, like
build/bench.txt.  A variant that cannot be measured prints `# NAME failed:
WHY` and the script exits 1; goals missed are reported, not failures.

What is measured, per context size T (--sizes; 4K and 8K by default,
256 and 512 with --quick) and a batch of B = 4 prompts:

- Model: the GGUF of `make models` loaded into transformers, dequantized to
  float32 (as python/tests/test_hf.py loads it), eval mode, no_grad, one
  torch thread (--threads: kvtrim's attention runs on one thread too, and
  on a shared machine one thread keeps the medians stable).
- Prompts: B rows of T + warmup + steps tokens each, consecutive slices of
  the held-out text ../shared/models/bytes2m-valid.txt tokenized by
  kvtrim.hf.load_tokenizer (without ../shared: examples/demo-document.txt
  repeated).  The first T tokens are the context; the decode steps are
  teacher-forced with the next tokens of the same text, so every variant
  does the same work on the same ids.
- Prefill (not what is measured; one per size, shared by every variant):
  one forward of the B x T context with transformers' own attention
  ("sdpa") into a DynamicCache, logits of the last position only, under
  `with press(model)` of kvpress's DMS KVzap press (below): that press
  scores and records masks, and leaves the cache's tensors as they are
  without it (checked bit for bit).  A pre-hook on each layer's self_attn
  keeps x (its input hidden states, what kvtrim.hf stages for the policy).
- dynamic: that DynamicCache, decoded with "sdpa" (DMS's masks set aside).
  Its logits are kept to check kvtrim full against them; the cache is then
  cropped back to T.
- kvtrim_full / kvtrim_kvzap / kvtrim_streaming: a kvtrim.hf.KVTrimCache
  (one kvtrim sequence per row) on a private kvtrimd; the prefilled K/V are
  moved into the sequences with the binding's bulk writes, in chunks of
  --chunk tokens: per chunk, per layer and row, K (permuted from
  transformers' rotate-half layout into kvtrim's pairs, as kvtrim.hf
  does) and V go in with Seq.write_kv and x with Seq.stage, then one
  kvt_sync of all rows as a prefill (the last with headroom 1, for
  decoding), so the policy decides as in a chunked prefill through
  kvtrim.hf.  The KVTrimCache's counters are set to the T tokens seen;
  then it decodes through the "kvtrim" attention function (kvt_attend over
  the page lists, x staged, one kvt_sync per step, where the policy may
  evict).  kvzap: kvzap:model=weights/smollm2/kvzap-mlp,threshold=<its 0.75
  calibration>,window=32,sinks=4; streaming: sinks=4,tokens=T/4.
- kvpress_streaming: StreamingLLMPress(compression_ratio=0.75, n_sink=4).
  Its prefill hook (press.forward_hook on each layer's self_attn, with
  that layer's x and a DynamicCache holding the prefill's K/V) is run on
  a copy of the shared prefill's cache: what `with press(model):
  model(context)` runs at the end of each layer's attention (the pruned
  cache is the same bit for bit; the press changes no hidden state of the
  forward).  Decoded without the press, position ids from T (kvpress's
  pipeline).
- kvpress_kvzap: kvpress's DMSPress(KVzapPress("mlp"), threshold=<the
  same>, sliding_window_size=32, decoding=True), its KVzap model loaded
  from weights/smollm2/kvzap-mlp (kvpress's checkpoint layout) instead of
  the hub; its prefill masks put back, decoded under the press (kvpress's
  pipeline does so when decoding=True), last (its masking writes fake
  keys into the cache).  It masks evicted keys: its cache keeps every
  entry.
- decode ms/step: wall time of one model forward of one token per row
  (B tokens), median over --steps steps after --warmup steps.
- KV bytes at the end of the decode: kvtrim from the daemon's stats
  (kv_bytes = pages held x page bytes, headroom pages included);
  DynamicCache and kvpress from the cache tensors' nbytes.
- Ratios: hf_decode_ratio_V = decode ms of V / of dynamic (lower is
  faster); hf_kv_ratio_V = KV bytes of V / of dynamic.  hf_kept_V: the
  fraction of entries kept (kvtrim: entries_kept / entries_appended;
  kvpress DMS: 1 - its masked fraction; StreamingLLM: kept / T).
- hf_logit_maxdiff_kvtrim_full: the largest |logit| difference of
  kvtrim full's decode steps against dynamic's (the bulk load is lossless).

Goals (reported, never faked): kvtrim full within 1.3x of the
DynamicCache's decode step; at 8K, kvtrim evicting 75 % holds at most 0.3x
the DynamicCache's KV bytes and decodes at least 1.5x faster.
"""
import argparse
import gc
import math
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")   # the GGUF loader's bar

T0 = time.time()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VALID = os.path.join(ROOT, "..", "shared", "models", "bytes2m-valid.txt")
DEMO = os.path.join(ROOT, "examples", "demo-document.txt")
KVZAP_DIR = os.path.join(ROOT, "weights", "smollm2", "kvzap-mlp")
CALIBRATION = os.path.join(ROOT, "weights", "smollm2", "calibration.txt")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
VARIANTS = ["dynamic", "kvtrim_full", "kvtrim_kvzap", "kvtrim_streaming",
            "kvpress_kvzap", "kvpress_streaming"]


class Progress:
    """Progress lines on stderr: elapsed, what, and an ETA from the work
    units done so far (a prefill of T tokens costs about T / 1024 (1 + T /
    4096) units, a decode step about (1 + T / 1024) / 100: a quiet machine's
    ratio, one thread)."""

    def __init__(self, total):
        self.total, self.done = total, 0.0

    def log(self, msg):
        el = time.time() - T0
        eta = ""
        if 0 < self.done < self.total:
            eta = f", ETA {el / self.done * (self.total - self.done):.0f}s"
        print(f"hf_bench [{el:6.1f}s{eta}]: {msg}", file=sys.stderr,
              flush=True)

    def add(self, units):
        self.done += units


def prefill_units(T):
    return T / 1024 * (1 + T / 4096)


def step_units(T):
    return (1 + T / 1024) / 100


def size_name(T):
    return f"{T // 1024}k" if T % 1024 == 0 else str(T)


def tau(target=0.75):
    with open(CALIBRATION) as f:
        for line in f:
            w = line.split()
            if len(w) == 3 and w[0] == "kvzap-mlp" and \
                    float(w[1]) == target:
                return float(w[2])
    raise SystemExit(f"no kvzap-mlp {target} in {CALIBRATION}")


def prompts(tok, B, n):
    """B rows of n token ids: consecutive slices of the held-out text, or
    of the demo document repeated."""
    import torch
    need = B * n
    if os.path.exists(VALID):
        src = VALID
        with open(VALID, encoding="utf-8", errors="replace") as f:
            text = f.read(need * 8)
    else:
        src = DEMO + " (repeated)"
        with open(DEMO, encoding="utf-8") as f:
            doc = f.read()
        text = doc * max(1, math.ceil(need * 8 / len(doc)))
    ids = tok(text)["input_ids"]
    while len(ids) < need:
        ids = ids + ids
    return torch.tensor(ids[:need]).view(B, n), src


def kv_nbytes(cache):
    return sum(la.keys.nbytes + la.values.nbytes for la in cache.layers)


class Bench:
    def __init__(self, a):
        self.a = a
        self.results = []         # (name, value)
        self.failed = []          # (name, why)

    def put(self, name, value, fmt="{:.3f}"):
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(name, f"not finite ({value})")
            return
        s = str(value) if isinstance(value, int) else fmt.format(value)
        self.results.append((name, s))
        print(f"{name} {s}", flush=True)

    def fail(self, name, why):
        why = " ".join(str(why).split())[:300]
        self.failed.append((name, why))
        print(f"# {name} failed: {why}", flush=True)


def decode(model, cache, toks, T, a, prog, what, keep_logits=False,
           press=None):
    """warmup + steps single-token forwards (teacher-forced, position ids
    from T); returns (median ms over the steps, [last logits per step])."""
    import contextlib
    import torch
    B = toks.shape[0]
    times, logits = [], []
    n = a.warmup + a.steps
    ctx = press(model) if press is not None else contextlib.nullcontext()
    with ctx:
        for i in range(n):
            pos = torch.full((B, 1), T + i, dtype=torch.long)
            t0 = time.perf_counter()
            out = model(input_ids=toks[:, T + i:T + i + 1], position_ids=pos,
                        past_key_values=cache, use_cache=True,
                        logits_to_keep=1)
            dt = time.perf_counter() - t0
            if i >= a.warmup:
                times.append(dt)
            if keep_logits:
                logits.append(out.logits[:, -1].clone())
            prog.add(step_units(T))
            if i == n - 1 or (i + 1) % max(1, n // 4) == 0:
                prog.log(f"{what}: decode step {i + 1}/{n}, "
                         f"{dt * 1e3:.1f} ms")
    return statistics.median(times) * 1e3, logits


def sdpa_prefill(model, ctx, press):
    """One forward of the context with "sdpa" into a new DynamicCache,
    under `with press(model)` (kvpress's DMS press: it scores and masks,
    the cache's tensors stay as without it); x per layer, captured by a
    pre-hook on each self_attn as kvtrim.hf captures it."""
    import contextlib
    import torch
    from transformers import DynamicCache
    model.set_attn_implementation("sdpa")
    xs = [None] * model.config.num_hidden_layers
    hooks = []

    def grab(i):
        def hook(module, args, kwargs):
            xs[i] = kwargs.get("hidden_states", args[0] if args else None)
        return hook
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.register_forward_pre_hook(
            grab(i), with_kwargs=True))
    dc = DynamicCache()
    try:
        with torch.no_grad(), (press(model) if press is not None
                               else contextlib.nullcontext()):
            model(input_ids=ctx, past_key_values=dc, use_cache=True,
                  logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    return dc, xs


def masks(model, saved=None):
    """Takes (saved None) or puts back kvpress's per-layer masks
    (self_attn.masked_key_indices, set by DMSPress)."""
    attn = [layer.self_attn for layer in model.model.layers]
    if saved is None:
        saved = [getattr(m, "masked_key_indices", None) for m in attn]
        for m in attn:
            m.masked_key_indices = None
        return saved
    for m, v in zip(attn, saved):
        m.masked_key_indices = v
    return saved


def streaming_prefill(model, dc, xs, T, press):
    """kvpress's StreamingLLMPress applied as its prefill hook applies it:
    press.forward_hook on each layer's self_attn, with that layer's
    prefill input and a cache holding the prefill's K/V, exactly what
    `with press(model): model(context)` runs at the end of each layer's
    attention.  The prefill itself is the shared one (the press changes
    no hidden state of the forward: a layer's pruned cache is read by
    later forwards only)."""
    import torch
    from transformers import DynamicCache
    cache = DynamicCache()
    press.post_init_from_model(model)
    pos = torch.arange(T)
    for i, layer in enumerate(model.model.layers):
        la = dc.layers[i]
        cache.update(la.keys[:, :, :T], la.values[:, :, :T], i)
        kw = {"hidden_states": xs[i], "past_key_values": cache,
              "cache_position": pos}
        press.forward_hook(layer.self_attn, (), kw, (None, None))
    return cache


def load_kvtrim(cache, dc, xs, T, chunk):
    """Moves the prefilled K/V (and x, when the policy reads it) of the
    DynamicCache into the KVTrimCache's sequences: per chunk of tokens,
    per layer and row, Seq.write_kv and Seq.stage, then one sync of every
    row as a prefill (the policy decides); the last chunk's sync leaves
    headroom 1 for decoding.  Sets the cache's counters to T seen."""
    import torch
    if cache.inputs & {"q", "lse"}:
        raise ValueError(f"the bulk load stages x only; this policy reads "
                         f"{sorted(cache.inputs)}")
    L = cache.n_layers
    perm = cache.perm
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        if e == T:
            for seq in cache.seqs:
                seq.headroom(1)
        for layer in range(L):
            K, V = dc.layers[layer].keys, dc.layers[layer].values
            k = K[:, :, s:e]
            if perm is not None:
                k = k.index_select(-1, perm)
            k = k.to(cache.dtype).contiguous()
            v = V[:, :, s:e].to(cache.dtype).contiguous()
            for b, seq in enumerate(cache.seqs):
                seq.write_kv(layer, k[b], v[b])
                if "x" in cache.inputs:
                    seq.stage(layer, s, x=xs[layer][b, s:e].to(
                        torch.float32).contiguous())
        cache.client.sync([(seq, e - s, "prefill") for seq in cache.seqs])
    B = len(cache.seqs)
    # what KVTrimCache's attention function counts after a prefill of T
    # tokens ending with headroom 1 (kvtrim/hf.py: seen, room, columns)
    cache.seen = [T] * B
    cache.room = [1] * B
    cache.columns = T


def run_size(model, tok, daemon, a, T, prog, bench):
    """Every variant at context size T on one shared prefill; returns
    {variant: (decode ms, KV bytes, kept fraction)}."""
    import torch
    import kvtrim.hf
    B, S = a.batch, size_name(T)
    n = T + a.warmup + a.steps
    toks, src = prompts(tok, B, n)
    ctx = toks[:, :T]
    prog.log(f"T={T}: {B} prompts of {n} tokens from {src}")
    z = tau(0.75)
    res = {}

    # -- the one prefill: sdpa, under kvpress's DMS KVzap press
    dms = None
    if a.kvpress_ok:
        try:
            dms = kvpress_press("kvpress_kvzap", z)[0]
        except Exception as e:
            bench.fail(f"hf_decode_ms_kvpress_kvzap_{S}",
                       f"{type(e).__name__}: {e}")
    t0 = time.time()
    dc, xs = sdpa_prefill(model, ctx, dms)
    bench.put(f"hf_prefill_s_sdpa_{S}", time.time() - t0, "{:.1f}")
    prog.add(prefill_units(T))
    prog.log(f"T={T}: sdpa prefill done in {time.time() - t0:.1f}s")
    dms_masks = masks(model)

    # -- dynamic: the floor
    with torch.no_grad():
        ms, ref = decode(model, dc, toks, T, a, prog, f"T={T} dynamic",
                         keep_logits=True)
    res["dynamic"] = (ms, kv_nbytes(dc), 1.0)
    dc.crop(T)

    # -- kvtrim: the same prefill moved into kvtrimd, decoded through it
    specs = {
        "kvtrim_full": "full",
        "kvtrim_kvzap": (f"kvzap:model={KVZAP_DIR},threshold={z},"
                         "window=32,sinks=4"),
        "kvtrim_streaming": f"streaming:sinks=4,tokens={T // 4}",
    }
    chunk = min(a.chunk, T)
    for name, spec in specs.items():
        if a.only and name not in a.only:
            continue
        try:
            model.set_attn_implementation("kvtrim")
            with kvtrim.hf.KVTrimCache(
                    model, policy=spec, runtime_dir=daemon.runtime_dir,
                    batch_size=B, chunk=chunk, max_tokens=n + 1,
                    quota_bytes=a.pool) as c, torch.no_grad():
                t0 = time.time()
                load_kvtrim(c, dc, xs, T, chunk)
                st = c.stats()
                bench.put(f"hf_load_s_{name}_{S}", time.time() - t0,
                          "{:.1f}")
                prog.log(f"T={T} {name}: loaded in {time.time() - t0:.1f}s,"
                         f" kept {st['entries_kept']} of "
                         f"{st['entries_appended']} entries")
                ms, lg = decode(model, c, toks, T, a, prog, f"T={T} {name}",
                                keep_logits=name == "kvtrim_full")
                st = c.stats()
                res[name] = (ms, st["kv_bytes"],
                             st["entries_kept"] / st["entries_appended"])
                if lg:
                    d = max((x - y).abs().max().item()
                            for x, y in zip(lg, ref))
                    bench.put(f"hf_logit_maxdiff_kvtrim_full_{S}", d,
                              "{:.2e}")
        except Exception as e:      # report it and go on with the others
            bench.fail(f"hf_decode_ms_{name}_{S}", f"{type(e).__name__}: {e}")
    del ref
    model.set_attn_implementation("sdpa")

    # -- kvpress StreamingLLM: its prefill hook on a copy of the prefill
    name = "kvpress_streaming"
    if a.kvpress_ok and (not a.only or name in a.only):
        try:
            press, _ = kvpress_press(name, z)
            t0 = time.time()
            cache = streaming_prefill(model, dc, xs, T, press)
            prog.log(f"T={T} {name}: pruned in {time.time() - t0:.1f}s")
            with torch.no_grad():
                ms, _ = decode(model, cache, toks, T, a, prog,
                               f"T={T} {name}")
            res[name] = (ms, kv_nbytes(cache),
                         cache.layers[0].keys.shape[2] / n)
            del cache
        except Exception as e:
            bench.fail(f"hf_decode_ms_{name}_{S}", f"{type(e).__name__}: {e}")
    del xs
    gc.collect()

    # -- kvpress DMS KVzap: its masks back, decoded under the press (last:
    # its masking writes fake keys into the cache it decodes)
    name = "kvpress_kvzap"
    if dms is not None and (not a.only or name in a.only):
        try:
            press = dms
            masks(model, dms_masks)
            with torch.no_grad():
                ms, _ = decode(model, dc, toks, T, a, prog, f"T={T} {name}",
                               press=press)
            res[name] = (ms, kv_nbytes(dc), 1 - press.compression_ratio)
        except Exception as e:
            bench.fail(f"hf_decode_ms_{name}_{S}", f"{type(e).__name__}: {e}")
        finally:
            masks(model)
    del dc
    gc.collect()

    base_ms, base_b, _ = res["dynamic"]
    for name in VARIANTS:
        if name not in res:
            continue
        ms, nb, kept = res[name]
        bench.put(f"hf_decode_ms_{name}_{S}", ms, "{:.1f}")
        bench.put(f"hf_kv_bytes_{name}_{S}", int(nb))
        if name != "dynamic":
            bench.put(f"hf_decode_ratio_{name}_{S}", ms / base_ms, "{:.3f}")
            bench.put(f"hf_kv_ratio_{name}_{S}", nb / base_b, "{:.3f}")
            bench.put(f"hf_kept_{name}_{S}", kept, "{:.3f}")
    return res


def kvpress_press(name, z):
    """(press, whether it also runs during decoding)."""
    from kvpress import DMSPress, KVzapPress, StreamingLLMPress
    from kvpress.presses.kvzap_press import KVzapModel
    if name == "kvpress_streaming":
        return StreamingLLMPress(compression_ratio=0.75, n_sink=4), False

    class KVzapLocal(KVzapPress):
        def post_init_from_model(self, model):
            if getattr(self, "kvzap_model", None) is None:
                self.kvzap_model = KVzapModel.from_pretrained(
                    KVZAP_DIR).eval()
                self.kvzap_model_name = KVZAP_DIR

    press = DMSPress(press=KVzapLocal(model_type="mlp"), threshold=z,
                     sliding_window_size=32, decoding=True)
    return press, True


def goals(bench, res_by_size, sizes):
    """The goals as comment lines, met or not."""
    out = []
    for T in sizes:
        res = res_by_size.get(T, {})
        S = size_name(T)
        if "dynamic" not in res:
            continue
        base_ms, base_b, _ = res["dynamic"]
        if "kvtrim_full" in res:
            r = res["kvtrim_full"][0] / base_ms
            out.append(f"# goal {S}: kvtrim full decode within 1.3x of "
                       f"DynamicCache: {r:.2f}x, "
                       f"{'met' if r <= 1.3 else 'NOT met'}")
        if T != 8192:
            continue
        for v in ("kvtrim_kvzap", "kvtrim_streaming"):
            if v not in res:
                continue
            ms, nb, _ = res[v]
            kb, sp = nb / base_b, base_ms / ms
            out.append(f"# goal {S}: {v} KV bytes <= 0.3x DynamicCache: "
                       f"{kb:.3f}x, {'met' if kb <= 0.3 else 'NOT met'}; "
                       f"decode >= 1.5x faster: {sp:.2f}x, "
                       f"{'met' if sp >= 1.5 else 'NOT met'}")
    if 8192 not in sizes:
        out.append("# goal 8k: eviction's KV bytes and decode speed-up not "
                   "measured (no 8192 in --sizes)")
    for line in out:
        print(line, flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="sizes 256,512, 4 decode steps (under 2 minutes)")
    ap.add_argument("--sizes", help="context sizes, comma-separated "
                    "(default 4096,8192; --quick 256,512)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, help="measured decode steps "
                    "(default 16; --quick 6)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=512,
                    help="tokens per bulk-load sync into kvtrimd")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: kvtrim's attention "
                    "runs on one, and a shared machine's medians stay "
                    "stable; 0 = torch's default)")
    ap.add_argument("--only", help="variants to run besides dynamic, "
                    "comma-separated: " + ",".join(VARIANTS[1:]))
    ap.add_argument("--gguf", default=os.path.join(
        os.environ.get("KVTRIM_MODELS") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or
            os.path.expanduser("~/.cache"), "kvtrim", "models"), GGUF))
    ap.add_argument("--out", help="also write the result lines here")
    a = ap.parse_args()
    a.sizes = [int(x) for x in (a.sizes or ("256,512" if a.quick else
                                            "4096,8192")).split(",")]
    a.steps = a.steps or (6 if a.quick else 16)
    a.only = set(a.only.split(",")) if a.only else None
    os.chdir(ROOT)
    bench = Bench(a)
    if not os.path.exists(a.gguf):
        bench.fail("hf_bench", f"no model at {a.gguf} (make models)")
        return 1

    import torch
    import transformers
    # kvpress patches every attention function registered when it is
    # imported (its head-wise masking): imported before kvtrim.hf registers
    # "kvtrim", so that only transformers' own functions carry the patch
    # (sdpa's costs a shape test per call while no mask is set)
    a.kvpress_ok, kvpress_version = False, None
    try:
        import importlib.metadata
        import kvpress  # noqa: F401
        kvpress_version = importlib.metadata.version("kvpress")
        a.kvpress_ok = True
    except Exception as e:
        for T in a.sizes:
            for v in ("kvpress_kvzap", "kvpress_streaming"):
                bench.fail(f"hf_decode_ms_{v}_{size_name(T)}",
                           f"import kvpress: {type(e).__name__}: {e}")
    from transformers import AutoModelForCausalLM
    import kvtrim
    import kvtrim.hf

    if a.threads:
        torch.set_num_threads(a.threads)
    total = sum(prefill_units(T) + 6 * (a.warmup + a.steps) *
                step_units(T) for T in a.sizes)
    prog = Progress(total)
    prog.log(f"torch {torch.__version__} ({torch.get_num_threads()} "
             f"threads), transformers {transformers.__version__}, kvpress "
             f"{kvpress_version}, kvtrim from {kvtrim.__file__}")
    transformers.utils.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    d, f = os.path.split(os.path.abspath(a.gguf))
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f,
                                                 dtype=torch.float32)
    model.eval()
    tok = kvtrim.hf.load_tokenizer(a.gguf)
    prog.log(f"model loaded ({type(model).__name__})")

    # the pool holds kvtrim full at the largest size with room to spare
    # (below the daemon's high watermark, where it would tighten policies)
    cfg = model.config
    Tm = max(a.sizes) + a.warmup + a.steps + a.chunk
    full = (a.batch * cfg.num_hidden_layers * cfg.num_key_value_heads *
            math.ceil(Tm / 16) * 2 * 16 * cfg.head_dim * 4)
    a.pool = (int(full * 1.5) // (2 << 20) + 64) * (2 << 20)
    print(f"# hf_bench: SmolLM2-135M-Instruct (GGUF, float32), batch "
          f"{a.batch}, sizes {a.sizes}, {a.steps} decode steps (median, "
          f"after {a.warmup}), torch {torch.__version__} "
          f"{torch.get_num_threads()} threads, transformers "
          f"{transformers.__version__}, kvpress {kvpress_version}; kvtrim: "
          f"sdpa prefill moved into kvtrimd by write_kv/stage, {a.chunk} "
          f"tokens per sync", flush=True)
    res_by_size = {}
    with kvtrim.Daemon(pool_size=a.pool,
                       args=["--default-quota", a.pool,
                             "--expected-tenants", 1]) as daemon:
        for T in a.sizes:
            try:
                res_by_size[T] = run_size(model, tok, daemon, a, T, prog,
                                          bench)
            except Exception as e:
                bench.fail(f"hf_bench_{size_name(T)}",
                           f"{type(e).__name__}: {e}")
            gc.collect()
    lines = goals(bench, res_by_size, a.sizes)
    if a.out:
        with open(a.out, "w") as fo:
            for name, v in bench.results:
                fo.write(f"{name} {v}\n")
            for name, why in bench.failed:
                fo.write(f"# {name} failed: {why}\n")
            for line in lines:
                fo.write(line + "\n")
    prog.log(f"done: {len(bench.results)} results, {len(bench.failed)} "
             f"failed")
    return 1 if bench.failed else 0


if __name__ == "__main__":
    sys.exit(main())
