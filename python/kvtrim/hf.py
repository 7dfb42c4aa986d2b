"""kvtrim.hf: a transformers causal LM keeps its KV cache in kvtrimd.

    import kvtrim, kvtrim.hf
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="kvtrim")
    cache = kvtrim.hf.KVTrimCache(model, policy="kvzap:model=weights/smollm2/kvzap-mlp,threshold=-2.4361")
    out = model.generate(**inputs, past_key_values=cache, max_new_tokens=32)
    print(cache.stats()["kv_bytes"])

Importing this module registers the attention function "kvtrim" with
transformers' AttentionInterface.  A forward then goes, per layer:
KVTrimCache.update() hands the step's new keys and values through (it
keeps no tensor of its own); the "kvtrim" attention function writes them
straight into each sequence's pages (kvt_write_kv: one call per sequence
and layer, zero copy from the model's own tensors when their rows are
contiguous), attends over the per-head page lists with kvt_attention, and
stages what the tenant's policy reads (x, the layer's attention input,
captured by a forward pre-hook on self_attn; q; lse: kvt_stage).  After
the last layer one kvt_sync commits every sequence's new tokens and lets
the policy evict; freed pages go back to the pool.  No contiguous copy of
the cache exists at any time.

Rows of a batch are sequences of the tenant (one kvt_seq each).  Padding
(left, as generate pads decoder-only models) is never appended: a row's
real tokens are those its 2-D attention mask marks, and kvtrimd's
positions are the count of real tokens, which is what generate's position
ids give.  get_seq_length() counts the columns processed (tokens seen,
padding included, as DynamicCache does), not the entries kept: eviction
never moves positions.

The causal mask is the attention itself (token k of n new ones sees the
first len + k + 1 entries of its lists), so no 4-D mask is built: the mask
function registered for "kvtrim" hands the 2-D padding mask through.
Every row of a batch attends in one kvt_attend call, with the module's own
softmax scale.  Requirements: a decoder whose attention module has
layer_idx and scaling (llama, mistral, qwen2, smollm ...), no
sliding-window layers.
"""
import threading

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache
from transformers.masking_utils import AttentionMaskInterface

import kvtrim

__all__ = ["KVTrimCache", "attention", "load_tokenizer", "ATTN_IMPLEMENTATION"]

ATTN_IMPLEMENTATION = "kvtrim"
_TORCH_DTYPE = {torch.float32: "f32", torch.float16: "f16",
                torch.bfloat16: "bf16"}
_active = threading.local()  # the cache whose update() ran last here


def _decoder_layers(model):
    """The decoder layers of a causal LM (model.model.layers)."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: no decoder layers found "
                        "(model.model.layers)")
    return layers


class KVTrimCache(Cache):
    """A transformers Cache whose entries live in kvtrimd: one tenant
    (kvtrim.Client) for the model, one kvtrim sequence per batch row.

    policy: the tenant's policy spec (kvtrimd --list-policies), learned
    ones with model= weight files (relative paths are made absolute).
    runtime_dir: the daemon's (None: libkvtrim's default; a
    kvtrim.Daemon's .runtime_dir).  batch_size: rows of the batch.
    max_tokens: most entries a list may hold.  chunk: most tokens one
    forward appends (a prefill longer than that must be fed in chunks).
    rope_layout: how the model lays out a head's rotated dimensions,
    "rotate_half" (transformers' models: K and q are stored and staged
    permuted into llama.cpp's adjacent pairs, kvtrim's layout, which
    policies that undo RoPE assume) or "pairs" (as they are).  forks: how
    many copies of the batch fork() may hold open at once.  The other
    arguments go to kvtrim.Client.  close() (or leaving a `with` block)
    ends the tenant; its pages return to the pool."""

    def __init__(self, model, *, policy="full", runtime_dir=None,
                 tenant=None, batch_size=1, max_tokens=4096, chunk=512,
                 page_tokens=16, stage_tokens=None, quota_bytes=0,
                 timeout_ms=60000, rope_layout="rotate_half", forks=0):
        super().__init__(layers=[])
        cfg = model.config
        self.n_layers = cfg.num_hidden_layers
        H = cfg.num_attention_heads
        KV = getattr(cfg, "num_key_value_heads", None) or H
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
        if model.dtype not in _TORCH_DTYPE:
            raise TypeError(f"model dtype {model.dtype}: kvtrim pages are "
                            "float32, float16 or bfloat16")
        self.dtype = model.dtype
        self.chunk = int(chunk)
        self.client = kvtrim.Client(
            runtime_dir=runtime_dir, tenant=tenant, n_layers=self.n_layers,
            n_heads=H, n_kv_heads=KV, head_dim=hd, d_model=cfg.hidden_size,
            dtype=_TORCH_DTYPE[model.dtype], page_tokens=page_tokens,
            max_seqs=batch_size * (1 + int(forks)), max_tokens=max_tokens,
            headroom=self.chunk,
            stage_tokens=(stage_tokens if stage_tokens is not None
                          else self.chunk + 128),
            policy=policy, quota_bytes=quota_bytes, timeout_ms=timeout_ms)
        self.inputs = self.client.policy_inputs
        # rotate-half (transformers) to adjacent pairs (kvtrim): dimension
        # 2i of a head is i, 2i + 1 is i + head_dim / 2
        self.perm = None
        if rope_layout == "rotate_half":
            half = hd // 2
            self.perm = torch.stack([torch.arange(half),
                                     torch.arange(half) + half],
                                    dim=1).flatten()
        elif rope_layout != "pairs":
            raise ValueError(f"rope_layout {rope_layout!r}: 'rotate_half' "
                             "or 'pairs'")
        self.seqs = [self.client.open_seq() for _ in range(batch_size)]
        self.seen = [0] * batch_size    # real tokens appended per row
        self.room = [self.chunk] * batch_size  # headroom in force
        self.columns = 0                # columns processed (with padding)
        self._x = [None] * self.n_layers
        self._new = [None] * batch_size  # this forward's appended per row
        self._hooks = []
        self._base = None               # the cache fork() copied
        if "x" in self.inputs:
            for i, layer in enumerate(_decoder_layers(model)):
                self._hooks.append(layer.self_attn.register_forward_pre_hook(
                    self._capture_x(i), with_kwargs=True))

    # -- transformers' Cache interface
    def update(self, key_states, value_states, layer_idx,
               cache_kwargs=None):
        """Hands the step's keys and values to the "kvtrim" attention
        function, which writes them into the pages: nothing is kept
        here."""
        _active.cache = self
        return key_states, value_states

    def get_seq_length(self, layer_idx=0):
        return self.columns

    def get_mask_sizes(self, cache_position, layer_idx=0):
        return self.columns + cache_position.shape[0], 0

    def get_max_cache_shape(self, layer_idx=0):
        return -1

    @property
    def is_compileable(self):
        return False

    @property
    def is_initialized(self):
        return True

    @property
    def is_sliding(self):
        return [False] * self.n_layers

    @property
    def max_batch_size(self):
        return len(self.seqs)

    def __len__(self):
        return self.n_layers

    def reset(self):
        """Closes and reopens every sequence: an empty cache."""
        for i, s in enumerate(self.seqs):
            s.close()
            self.seqs[i] = self.client.open_seq()
        self.seen = [0] * len(self.seqs)
        self.room = [self.chunk] * len(self.seqs)
        self.columns = 0

    def crop(self, max_length):
        raise NotImplementedError("kvtrim cannot crop: evicted entries "
                                  "are gone")

    def reorder_cache(self, beam_idx):
        raise NotImplementedError("beam search is not supported by "
                                  "KVTrimCache")

    # -- kvtrim
    def stats(self):
        """The daemon's accounting of the tenant (kvtrim.Client.stats)."""
        return self.client.stats()

    def kept(self):
        """Entries kept per row: the length of each row's layer-0 KV-head-0
        list (lists may differ under per-head policies)."""
        return [s.list(0, 0)[0] for s in self.seqs]

    def fork(self):
        """A cache holding a copy of every row as the last forward left it
        (kvt_seq_fork: the same entries, positions and policy state), in
        the same tenant: kvpress's question-about-a-context pipeline
        prefills and compresses the context once, then answers each
        question on a fork and closes it.  The copy's pages count against
        the tenant (make room with forks=N); close() frees only them."""
        new = object.__new__(KVTrimCache)
        Cache.__init__(new, layers=[])
        for k in ("n_layers", "dtype", "chunk", "client", "inputs", "perm",
                  "_x", "columns"):
            setattr(new, k, getattr(self, k))
        new.seqs = []
        try:
            for s in self.seqs:
                new.seqs.append(s.fork())
        except kvtrim.Error:
            for s in new.seqs:
                s.close()
            raise
        new.seen = list(self.seen)
        new.room = [self.chunk] * len(self.seqs)  # the registration's
        new._new = [None] * len(self.seqs)
        new._hooks = []  # the x hooks are the base's; _x is shared
        new._base = self
        return new

    def close(self):
        if self._base is not None:
            if not self.client.closed:
                for s in self.seqs:
                    s.close()
            self.seqs = []
            return
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if not self.client.closed:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _capture_x(self, layer):
        def hook(module, args, kwargs):
            hs = kwargs.get("hidden_states", args[0] if args else None)
            self._x[layer] = hs
        return hook

    def _prepare(self, b, m):
        """Headroom for m new entries of row b: what the last sync left
        (1 after a prefill, for decoding) grows on demand
        (kvt_seq_reserve)."""
        if m > self.chunk:
            raise ValueError(f"{m} tokens in one forward: at most chunk="
                             f"{self.chunk} (feed longer prompts in "
                             "chunks)")
        if m > self.room[b]:
            self.seqs[b].reserve(self.chunk)
            self.room[b] = self.chunk

    def _commit(self, phase):
        """One kvt_sync of every row that appended: the headroom drops to
        1 (decoding follows; kvt_seq_reserve grows it when a longer chunk
        comes), so lists hold ceil((len + 1) / page_tokens) pages, not a
        chunk's worth."""
        items = []
        for b, m in enumerate(self._new):
            if m:
                if self.room[b] != 1:
                    self.seqs[b].headroom(1)
                items.append((self.seqs[b], m, phase))
        if items:
            self.client.sync(items)
        for b, m in enumerate(self._new):
            if m:
                self.seen[b] += m
                self.room[b] = 1
        self._new = [None] * len(self.seqs)


def attention(module, query, key, value, attention_mask, scaling=None,
              dropout=0.0, **kwargs):
    """The "kvtrim" attention function (transformers' AttentionInterface):
    query [B][H][n][hd], key and value [B][KV][n][hd] (the step's new
    tokens only, from KVTrimCache.update), attention_mask the 2-D padding
    mask [B][columns] or None.  Returns ([B][n][H][hd], None)."""
    # update() of this layer set it just before; taken, so that a forward
    # without the cache never finds a stale one
    cache = _active.__dict__.pop("cache", None)
    if not isinstance(cache, KVTrimCache):
        raise RuntimeError("attn_implementation='kvtrim' needs "
                           "past_key_values=kvtrim.hf.KVTrimCache(model, ...)")
    c = cache.client
    layer = module.layer_idx
    B, H, n, hd = query.shape
    if B != len(cache.seqs):
        raise ValueError(f"a batch of {B} rows on a KVTrimCache of "
                         f"{len(cache.seqs)} sequences")
    out = torch.zeros((B, n, H, hd), dtype=query.dtype,
                      device=query.device)
    x = cache._x[layer]
    rows, items, qs = [], [], []
    for b in range(B):
        s = cache.seqs[b]
        if attention_mask is not None and attention_mask.dim() == 2:
            real = attention_mask[b, -n:].nonzero().flatten()
            m = int(real.numel())
        else:
            real, m = None, n
        cache._new[b] = m
        if m == 0:
            continue
        if layer == 0:
            cache._prepare(b, m)
        whole = real is None or m == n
        kb, vb, qb = key[b], value[b], query[b]
        if not whole:
            kb, vb, qb = kb[:, real], vb[:, real], qb[:, real]
        if cache.perm is not None:
            # transformers rotates halves; kvtrim's pages and staged q hold
            # llama.cpp's adjacent pairs (what policies that undo RoPE,
            # expected_attention, compute with): the same permutation of
            # every head's dimensions for K and q leaves q . k, and so the
            # attention, unchanged
            kb = kb.index_select(-1, cache.perm)
            qb = qb.index_select(-1, cache.perm)
        dt = cache.dtype
        kb = kb.to(dt) if kb.dtype != dt else kb
        vb = vb.to(dt) if vb.dtype != dt else vb
        if kb.stride() != vb.stride() or kb.stride(-1) != 1:
            # RoPE leaves K in a layout of its own: one layout for both
            # (a copy of the step's new rows, never of the cache)
            kb, vb = kb.contiguous(), vb.contiguous()
        s.write_kv(layer, kb, vb)
        q32 = qb.transpose(0, 1).to(torch.float32).contiguous()
        rows.append((b, real if not whole else None, m))
        items.append((s, layer, q32, scaling))
        qs.append(q32)
    # every row of the batch in one kvt_attend
    res = c.attend(items) if items else []
    for (b, real, m), q32, (ob, lb) in zip(rows, qs, res):
        s = cache.seqs[b]
        if cache.inputs & {"x", "q", "lse"}:
            xb = None
            if "x" in cache.inputs:
                xb = x[b] if real is None else x[b][real]
                xb = xb.to(torch.float32).contiguous()
            s.stage(layer, cache.seen[b], x=xb,
                    q=q32 if "q" in cache.inputs else None,
                    lse=lb if "lse" in cache.inputs else None)
        if real is None:
            out[b] = ob.to(query.dtype)
        else:
            out[b, real] = ob.to(query.dtype)
    if layer == cache.n_layers - 1:
        cache.columns += n
        cache._commit("decode" if n == 1 else "prefill")
    return out, None


def load_tokenizer(gguf_path):
    """transformers' tokenizer of a GGUF file, mended where transformers
    5.2 builds it unlike the file says (and unlike llama.cpp and kvtrim's
    C engine tokenize): for tokenizer.ggml.pre "smollm" digits are split
    one by one before the byte-level split; with add_bos_token false no
    post-processor prepends a token (5.2 prepends <|im_start|> to every
    encode); eos and pad are tokenizer.ggml.eos_token_id and
    padding_token_id (5.2 makes eos <|im_start|>, so generate never stops
    at the end of a turn)."""
    import os
    from gguf import GGUFReader
    from tokenizers import pre_tokenizers, processors
    from transformers import AutoTokenizer

    d, f = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    fields = GGUFReader(gguf_path).fields

    def meta(key, default=None):
        fl = fields.get(key)
        return default if fl is None else fl.contents()

    bt = tok.backend_tokenizer
    if meta("tokenizer.ggml.pre") == "smollm":
        bt.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True),
             bt.pre_tokenizer])
    if not meta("tokenizer.ggml.add_bos_token", False):
        bt.post_processor = processors.ByteLevel(trim_offsets=False)
    eos = meta("tokenizer.ggml.eos_token_id")
    if eos is not None:
        tok.eos_token = tok.convert_ids_to_tokens(int(eos))
    pad = meta("tokenizer.ggml.padding_token_id")
    if pad is not None:
        tok.pad_token = tok.convert_ids_to_tokens(int(pad))
    return tok


def padding_mask(batch_size=None, cache_position=None, kv_length=None,
                 kv_offset=0, mask_function=None, attention_mask=None,
                 **kwargs):
    """The "kvtrim" mask function (AttentionMaskInterface): the 2-D
    padding mask [B][columns] (bool) as given, or None; causality is the
    attention's own."""
    return attention_mask


AttentionInterface.register(ATTN_IMPLEMENTATION, attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, padding_mask)
