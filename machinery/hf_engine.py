"""HFEngine: the interface of machinery/engine.py on a Hugging Face model, decoded by the engine's own loop.

Continuous batching, a prefix cache and oneDNN-packed weights on CPU (machinery/engine.py's docstring has the
conventions both backends keep). Apart from SGLang's adapter, which shares none of its code, so that each backend
reads alone; machinery/engines.py builds it.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from machinery.engine import GenOutput, SamplingParams, check_params, check_score_start


@dataclass
class _Req:
    """One pending or running request of HFEngine."""
    kind: str                    # "gen" or "score"
    ids: list[int]
    params: SamplingParams | None
    start: int                   # score(): first position to score
    loop: asyncio.AbstractEventLoop
    fut: asyncio.Future
    gen: torch.Generator | None = None
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    stop_window: int = 0         # how many trailing tokens to decode when matching stop strings


def _arrival_free(r: _Req) -> tuple:
    """Lockstep's admission order: by the request's tokens, then its seed."""
    return r.ids, -1 if r.params is None or r.params.seed is None else r.params.seed


class HFEngine:
    """Continuous-batching generation with transformers on CPU.

    The forward passes run in the event loop that awaits `generate`, one step at a time
    between its other tasks (a step takes milliseconds; the sandbox calls run in their own
    processes meanwhile), not in a thread of their own: on a CPU a second torch thread is a
    second OpenMP team, more threads than cores, and libgomp then lets a waiting thread spin
    only briefly before it sleeps, which slowed a decode step (docs/speed.md). Each
    decode step feeds one token per running row. The batch cache is one zeroed buffer, rows
    x positions, that grows in steps and is never rebuilt per step: row b holds its tokens at positions
    [0, len_b), so a token's cache column is its position and a step writes every row's
    new KV in place; a new request is prefilled alone straight into the next free row; a
    finished row's place is taken by the last row. Per step the time goes to the matrix
    products, which read every weight once (what bounds a 135M model on a CPU), so the
    weights are packed for oneDNN rather than the step compiled (docs/speed.md profiles it).

    deterministic=True runs every request alone (batch of 1) with its own seeded generator
    and no prefix-cache reuse, so its tokens depend only on (weights, input_ids, params).

    lockstep=True: a step decodes only while every live trajectory of `track`'s waits on the engine, and
    queued requests join in the order of their tokens and seeds, not of their arrival. Which rows share a
    step, and so a matmul's last bits, then follow the tokens and not the clock (how long a sandbox call
    took, what else ran on the machine); a sandbox call pauses decoding instead of overlapping it.
    """

    def __init__(self, model, tokenizer, *, max_batch: int = 16, device=None, deterministic: bool = False,
                 eos_token_ids=None, prefix_cache_tokens: int = 32768, pack: bool = True, lockstep: bool = False):
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        if getattr(cfg, "use_sliding_window", False) or "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
            raise ValueError("HFEngine supports full-attention models only (this config uses sliding-window "
                             "layers, which its decoder loop does not model)")
        layer = getattr(getattr(model, "model", None), "layers", [None])[0]
        if not all(hasattr(getattr(layer, "self_attn", None), n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            raise ValueError(f"HFEngine decodes Llama-shaped models (Llama, Qwen2, Qwen3, Mistral: model.layers[i]"
                             f".self_attn.q_proj ...), not {type(model).__name__}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        if next(model.parameters()).device != self.device:
            model.to(self.device)
        self.max_batch = 1 if deterministic else max_batch
        self.deterministic = deterministic
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_len = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        if eos_token_ids is None:
            eos = model.generation_config.eos_token_id if model.generation_config is not None else None
            eos = [eos] if isinstance(eos, int) else list(eos or [])
            if tokenizer is not None and tokenizer.eos_token_id is not None:
                eos.append(tokenizer.eos_token_id)
            eos_token_ids = eos
        self.eos_token_ids = sorted({int(t) for t in eos_token_ids})
        self.prefix_cache_tokens = 0 if deterministic else prefix_cache_tokens
        self._n_layers, self._n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
        self._n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self._head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.pack = pack
        self._pack()
        self._prefix = OrderedDict()  # tuple(token ids) -> (array, KV (2, L, H_kv, n, D)); LRU order
        self._prefix_size = 0
        self.stats = {"decode_steps": 0, "prefills": 0, "generated_tokens": 0, "max_rows": 0,
                      "joined_running_batch": 0, "prefix_hit_tokens": 0, "cache_rebuilds": 0}
        self._queue: list[_Req] = []
        self.lockstep = lockstep
        self._tracked: list[asyncio.Task] = []  # lockstep: the trajectories whose turns the engine waits for
        self._wake: asyncio.Event | None = None  # set by a submission or a finished trajectory
        self._closed = False
        self._driver: asyncio.Task | None = None  # the task that runs the forward passes, in a caller's loop
        # running batch state (the driver's only)
        self._rows: list[_Req] = []
        self._kv = None  # the batch cache: keys and values (2, layers, rows, H_kv, C, D); row b's positions [0, lens[b])
        self._lens = torch.zeros(0, dtype=torch.long)  # (B,) tokens in each running row's cache
        self._last = torch.zeros(0, dtype=torch.long)  # (B,) token to feed next

    # ---- public API

    async def generate(self, input_ids: list[int], params: SamplingParams) -> GenOutput:
        check_params(params)
        ids = self._check_ids(input_ids, "generate")
        if params.max_new_tokens == 0:
            return GenOutput([], [], "length")
        return await self._submit(_Req("gen", ids, params, 0, None, None))

    async def score(self, input_ids: list[int], start: int) -> list[float]:
        ids = self._check_ids(input_ids, "score")
        check_score_start(ids, start)
        if start == len(ids):
            return []
        return await self._submit(_Req("score", ids, None, start, None, None))

    def update_weights(self, named_tensors) -> None:
        """Copy (name, tensor) pairs into the model. Tensors that already *are* the model's
        (the trainer shares this module) are skipped. Packs the weights again and flushes the
        prefix cache, as flush_cache does: KV computed by the old weights must never be reused."""
        params = self.model.state_dict(keep_vars=True)  # includes tied names (lm_head.weight)
        with torch.no_grad():
            for name, t in named_tensors:
                p = params.get(name)
                if p is None:
                    raise KeyError(f"update_weights: the model has no parameter named {name!r}")
                if p is t or (p.data_ptr() == t.data_ptr() and p.shape == t.shape):
                    continue
                if p.shape != t.shape:
                    raise ValueError(f"update_weights: {name} has shape {tuple(p.shape)} in the model, "
                                     f"got {tuple(t.shape)}")
                p.copy_(t.detach())
            self._pack()
            self._flush_prefix()

    def flush_cache(self) -> None:
        """Forget every cached KV, and pack the weights again: call it whenever they changed (a trainer that
        shares the module calls it after each optimizer step)."""
        self._pack()
        self._flush_prefix()

    def track(self, tasks: list) -> None:
        """Lockstep: the asyncio tasks of live trajectories (rollout.rollout_batch's), each with at most one
        request in the engine at a time; the engine waits, before each step, until every live one has one."""
        self._tracked += tasks
        for t in tasks:
            t.add_done_callback(lambda _: self._wake and self._wake.set())

    def release_memory(self) -> None:  # nothing to give back on CPU
        pass

    def resume_memory(self) -> None:
        pass

    def shutdown(self) -> None:
        self._closed = True  # the driver fails what is left at its next step
        if self._wake is not None:
            self._wake.set()

    # ---- submission (any event loop; every caller in one thread, as the forward passes run in it)

    def _check_ids(self, input_ids, what: str) -> list[int]:
        ids = [int(t) for t in input_ids]
        if not ids:
            raise ValueError(f"{what}(): input_ids is empty")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{what}(): token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        if len(ids) >= self.max_len:
            raise ValueError(f"{what}(): {len(ids)} input tokens exceed the model's context of {self.max_len}")
        return ids

    async def _submit(self, req: _Req):
        req.loop = asyncio.get_running_loop()
        req.fut = req.loop.create_future()
        if req.kind == "gen":
            p = req.params
            if p.seed is not None:
                req.gen = torch.Generator().manual_seed(int(p.seed))  # on CPU: draws are tiny
            if p.stop:
                # A stop string of n characters spans at most 4n byte-level tokens (UTF-8).
                req.stop_window = 4 * max(len(s) for s in p.stop) + 4
        if self._closed:
            raise RuntimeError("engine is shut down")
        self._queue.append(req)
        if self._wake is not None:
            self._wake.set()
        d = self._driver  # a driver whose loop has stopped (its run_until_complete returned) serves no one
        if d is None or d.done() or (d.get_loop() is not req.loop and not d.get_loop().is_running()):
            self._driver = req.loop.create_task(self._drive())
        return await req.fut

    @staticmethod
    def _resolve(req: _Req, value=None, error: BaseException | None = None):
        def put():
            if req.fut.done():  # cancelled by the caller (e.g. asyncio.wait_for timeout)
                return
            if error is not None:
                req.fut.set_exception(error)
            else:
                req.fut.set_result(value)
        try:
            req.loop.call_soon_threadsafe(put)
        except RuntimeError:  # the caller's loop is closed; nobody is waiting
            pass

    # ---- the driver: one task in the caller's event loop

    async def _drive(self):
        """Serve the queue, one step at a time, between the loop's other tasks (rollouts, sandbox results),
        until it is empty. A newer driver (started in another loop while this one's was stopped) replaces it."""
        me = asyncio.current_task()
        self._wake = asyncio.Event()
        while True:
            if self._driver is not me:
                return
            if self._closed:
                pending, self._queue, self._rows, self._driver = self._queue + self._rows, [], [], None
                break
            if not (self._queue or self._rows):
                self._driver = None
                return
            if self._tracked:
                self._tracked = [t for t in self._tracked if not t.done()]
                if len(self._queue) + len(self._rows) < len(self._tracked):  # some trajectory is in the sandbox
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                self._queue.sort(key=_arrival_free)
            free = self.max_batch - len(self._rows)
            scores = [r for r in self._queue if r.kind == "score"]
            gens = [r for r in self._queue if r.kind == "gen"][:max(free, 0)]
            taken = set(map(id, scores + gens))
            self._queue = [r for r in self._queue if id(r) not in taken]
            try:
                with torch.inference_mode():
                    for r in scores:
                        self._do_score(r)
                    for r in gens:
                        self._admit(r)
                    self._drop_cancelled()
                    if self._rows:
                        self._decode_step()
            except Exception as e:  # a broken forward must not leave callers hanging
                for r in self._rows + gens + scores:
                    self._resolve(r, error=e)
                self._rows, self._kv = [], None
                self._lens = self._lens[:0]
                self._last = self._last[:0]
            await asyncio.sleep(0)
        err = RuntimeError("engine shut down before this request finished")
        for r in pending:
            self._resolve(r, error=err)

    def _do_score(self, r: _Req):
        if r.fut.done():
            return
        ids = torch.tensor([r.ids], device=self.device)  # (1, T)
        n = len(r.ids)
        logits = self.model(input_ids=ids, use_cache=False, logits_to_keep=n - r.start + 1).logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[0, r.start:, None])[:, 0]
        self._resolve(r, lp.tolist())

    def _admit(self, r: _Req) -> None:
        """Prefill one request alone into the next free cache row (reusing a cached prefix if any) and sample its
        first token; the row joins the running batch unless that token already finishes it."""
        if r.fut.done():
            return
        n, slot = len(r.ids), len(self._rows)
        self._room(slot + 1, n + 1)
        hit = self._prefix_lookup(r.ids, slot)
        ids = torch.tensor([r.ids[hit:]], device=self.device)  # (1, n - hit)
        pos = torch.arange(hit, n, device=self.device)[None]   # (1, n - hit)
        logits = self._run(ids, pos, slot, n)  # (1, V)
        self.stats["prefills"] += 1
        self.stats["prefix_hit_tokens"] += hit
        self._prefix_put(tuple(r.ids), slot, n)  # the prompt's KV
        tok, lp = self._sample(logits, [r])
        if self._append(r, int(tok[0]), float(lp[0])):
            return
        # counts joins into rows that are already decoding (continuous batching at work)
        self.stats["joined_running_batch"] += any(len(x.out) > 1 for x in self._rows)
        self._rows.append(r)
        self._lens = torch.cat([self._lens, torch.tensor([n])])
        self._last = torch.cat([self._last, torch.tensor([r.out[-1]])])

    def _decode_step(self):
        B = len(self._rows)
        self.stats["max_rows"] = max(self.stats["max_rows"], B)
        T = int(self._lens.max()) + 1
        self._room(B, T)
        logits = self._run(self._last[:, None].to(self.device), self._lens[:, None].to(self.device), 0, T)  # (B, V)
        self._lens = self._lens + 1
        self.stats["decode_steps"] += 1
        toks, lps = self._sample(logits, self._rows)
        self._last = toks.cpu()  # one device-to-host copy per step, not one per row
        keep = []
        for i, (r, tok, lp) in enumerate(zip(self._rows, self._last.tolist(), lps.tolist())):
            if self._append(r, tok, lp):  # finished: keep its KV for a later turn
                self._prefix_put(tuple(r.ids + r.out[:-1]), i, int(self._lens[i]))
            else:
                keep.append(i)
        if len(keep) < B:
            self._select(keep)

    def _drop_cancelled(self):
        keep = [i for i, r in enumerate(self._rows) if not r.fut.done()]
        if len(keep) < len(self._rows):
            self._select(keep)

    def _select(self, keep: list[int]):
        """Keep rows `keep`. A leaving row's cache row takes the batch's last row: one row is copied, not the batch."""
        idx = list(range(len(self._rows)))  # cache row -> the row it held before
        for g in sorted(set(idx) - set(keep), reverse=True):  # rows after g that leave are gone already
            last = len(idx) - 1
            if g != last:
                n = int(self._lens[idx[last]])
                self._kv[:, :, g, :, :n] = self._kv[:, :, last, :, :n]
                idx[g] = idx[last]
            idx.pop()
        self._rows = [self._rows[i] for i in idx]
        self._lens, self._last = self._lens[idx], self._last[idx]
        if not self._rows:
            self._kv = None  # the memory goes back between bursts

    def _room(self, rows: int, cols: int):
        """Grow the batch cache to hold `rows` rows of `cols` positions (rows to a power of two, up to max_batch;
        positions to a multiple of 256), keeping what it holds. Zeros, not garbage: a masked position's value
        still enters the attention product, and 0 * NaN is NaN."""
        kv = self._kv
        if kv is not None and rows <= kv.shape[2] and cols <= kv.shape[4]:
            return
        R = min(self.max_batch, 1 << (max(rows, 0 if kv is None else kv.shape[2]) - 1).bit_length())
        C = -(-max(cols, 0 if kv is None else kv.shape[4]) // 256) * 256
        w = self.model.get_output_embeddings().weight
        new = torch.zeros(2, self._n_layers, R, self._n_kv, C, self._head_dim, dtype=w.dtype, device=self.device)
        if kv is not None:
            new[:, :, :kv.shape[2], :, :kv.shape[4]] = kv
            self.stats["cache_rebuilds"] += 1
        self._kv = new

    def _run(self, ids, pos, row: int, T: int):
        """The decoder over the batch cache. ids, pos: (B, t) new tokens and their positions, written to cache rows
        row .. row + B - 1 (a prefill: B = 1, a decode step: t = 1); each attends to its row's positions <= its own,
        of the first T. Returns the last position's logits (B, V), float32. The model's own modules compute the
        embedding, norms, rotary and activation; its linear layers are _pack's fused copies (q|k|v, gate|up)."""
        m, B, t, D = self.model.model, ids.shape[0], ids.shape[1], self._head_dim
        G = self._n_heads // self._n_kv  # query heads per KV head
        x = m.embed_tokens(ids)                # (B, t, E)
        cos, sin = m.rotary_emb(x, pos)        # (B, t, D)
        cos, sin = cos[:, :, None], sin[:, :, None]
        rows = torch.arange(row, row + B, device=self.device)[:, None]  # (B, 1)
        # the G query heads of a KV head attend together as G * t queries, so no KV head is copied G times
        mask = torch.arange(T, device=self.device)[None, None] <= pos[:, :, None]     # (B, t, T)
        mask = mask[:, None].expand(B, G, t, T).reshape(B, 1, G * t, T)
        H, Hkv = self._n_heads, self._n_kv
        for i, layer in enumerate(m.layers):
            a, K, V = layer.self_attn, self._kv[0, i], self._kv[1, i]  # K, V: (rows, H_kv, C, D)
            qkv_w, o_w, gate_up_w, down_w = self._w[i]
            qkv = self._mm(layer.input_layernorm(x), qkv_w).view(B, t, H + 2 * Hkv, D)
            qk = qkv[:, :, :H + Hkv]
            if hasattr(a, "q_norm"):  # Qwen3
                qk = torch.cat([a.q_norm(qk[:, :, :H]), a.k_norm(qk[:, :, H:])], 2)
            qk = qk * cos + _rotate_half(qk) * sin  # (B, t, H + H_kv, D)
            K[rows, :, pos], V[rows, :, pos] = qk[:, :, H:], qkv[:, :, H + Hkv:]
            q = qk[:, :, :H].reshape(B, t, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * t, D)
            o = F.scaled_dot_product_attention(q, K[row:row + B, :, :T], V[row:row + B, :, :T], attn_mask=mask,
                                               scale=a.scaling)
            o = o.view(B, Hkv, G, t, D).permute(0, 3, 1, 2, 4).reshape(B, t, H * D)
            x = x + self._mm(o, o_w)
            gate, up = self._mm(layer.post_attention_layernorm(x), gate_up_w).chunk(2, -1)
            x = x + self._mm(layer.mlp.act_fn(gate) * up, down_w)
        return self._mm(m.norm(x[:, -1]), self._head).float()

    def _mm(self, x, w):
        """x @ w.T + bias, w = (weight, bias) from _pack."""
        if self._packed:
            return torch.ops.mkldnn._linear_pointwise(x, w[0], w[1], "none", [], "")
        return F.linear(x, *w)

    def _pack(self):
        """The decoder's weights, copied: per layer q|k|v and gate|up as one matrix each, so a layer makes four
        matrix products, not seven; on CPU in oneDNN's packed layout, whose products for the few rows of a decode
        step stream the weights faster than nn.Linear's (docs/speed.md). A copy, so it is rebuilt after
        every weight push."""
        p = self.model.lm_head.weight
        self._packed = (self.pack and self.device.type == "cpu" and torch.backends.mkldnn.is_available()
                        and p.dtype in (torch.float32, torch.bfloat16))

        def mat(*mods):  # (out, in) weight and its bias
            w = torch.cat([mod.weight for mod in mods]) if len(mods) > 1 else mods[0].weight
            b = None if mods[0].bias is None else torch.cat([mod.bias for mod in mods]) if len(mods) > 1 else mods[0].bias
            return (torch.ops.mkldnn._reorder_linear_weight(w, self.max_batch) if self._packed else w), b
        with torch.no_grad():
            self._w = [(mat(a.q_proj, a.k_proj, a.v_proj), mat(a.o_proj), mat(f.gate_proj, f.up_proj), mat(f.down_proj))
                       for a, f in ((layer.self_attn, layer.mlp) for layer in self.model.model.layers)]
            self._head = mat(self.model.lm_head)

    def _sample(self, logits, rows: list[_Req]):
        """Per-row temperature / top-k / top-p sampling. logits: (B, V) float32.
        Returns tokens (B,) and their log-probs under softmax(logits / T) before truncation.
        Each sampling row draws one uniform number from its own generator and inverts its
        CDF, so a row's draw never depends on the other rows."""
        temps = torch.tensor([r.params.temperature or 1.0 for r in rows], device=logits.device)
        logp = torch.log_softmax(logits / temps[:, None], -1)  # (B, V)
        toks = logp.argmax(-1)
        samp = [i for i, r in enumerate(rows) if r.params.temperature > 0]
        if samp:
            w = logp[samp]  # (S, V)
            for j, i in enumerate(samp):
                p = rows[i].params
                if p.top_k != -1 and p.top_k < w.shape[1]:
                    kth = torch.topk(w[j], p.top_k).values[-1]
                    w[j] = w[j].masked_fill(w[j] < kth, float("-inf"))
                if p.top_p < 1.0:
                    srt, order = torch.sort(w[j], descending=True)
                    probs = srt.softmax(-1)
                    drop = (probs.cumsum(-1) - probs) >= p.top_p  # mass before the token already >= top_p
                    w[j] = w[j].scatter(0, order, srt.masked_fill(drop, float("-inf")))
            cdf = w.softmax(-1).double().cumsum(-1)  # (S, V); float64 so the tail of a 150k vocab stays exact
            u = torch.stack([torch.rand((), generator=rows[i].gen, dtype=torch.float64) for i in samp])
            u = (u.to(cdf.device) * cdf[:, -1])[:, None]  # (S, 1)
            # right=True: the first token whose cdf exceeds u, never a zero-probability one
            toks[samp] = torch.searchsorted(cdf, u, right=True)[:, 0].clamp(max=w.shape[1] - 1)
        lps = logp.gather(-1, toks[:, None])[:, 0]
        return toks, lps

    def _append(self, r: _Req, tok: int, lp: float) -> bool:
        """Record a sampled token; resolve the request and return True if it is finished."""
        r.out.append(tok)
        r.lps.append(lp)
        self.stats["generated_tokens"] += 1
        p = r.params
        reason = None
        if tok in self.eos_token_ids or tok in p.stop_token_ids:
            reason = "stop"
        elif p.stop and self.tokenizer is not None:
            tail = self.tokenizer.decode(r.out[-r.stop_window:], skip_special_tokens=False)
            if any(s in tail for s in p.stop):
                reason = "stop"
        if reason is None and (len(r.out) >= p.max_new_tokens or len(r.ids) + len(r.out) >= self.max_len):
            reason = "length"
        if reason is None:
            return False
        self._resolve(r, GenOutput(list(r.out), list(r.lps), reason))
        return True

    # ---- prefix cache: KV of earlier prompts/turns, reused when a new prompt extends them

    def _prefix_lookup(self, ids: list[int], row: int) -> int:
        """Copy into cache row `row` the KV of the cached entry sharing the longest common prefix with ids, cut so
        that at least one token is left to prefill (we need its logits). Returns that length (0: none)."""
        if not self._prefix:
            return 0
        a = np.asarray(ids[:-1])
        best, best_key = 0, None
        for key, (arr, _) in self._prefix.items():
            m = min(len(arr), len(a))
            if m <= best or arr[0] != a[0]:
                continue
            diff = np.flatnonzero(arr[:m] != a[:m])
            lcp = int(diff[0]) if diff.size else m
            if lcp > best:
                best, best_key = lcp, key
        if best_key is None:
            return 0
        self._prefix.move_to_end(best_key)
        self._kv[:, :, row, :, :best] = self._prefix[best_key][1][:, :, :, :best]
        return best

    def _prefix_put(self, key: tuple, row: int, n: int):
        """Keep a copy of the KV of `key`: the first n positions of cache row `row`."""
        if key in self._prefix or len(key) > self.prefix_cache_tokens:  # a GRPO group shares its prompt
            return
        kv = self._kv[:, :, row, :, :n].clone()  # (2, L, H_kv, n, D)
        arr = np.asarray(key)
        # An entry that the new one extends can never be the longest match again: drop it, or a
        # multi-turn trajectory would hold one copy of its context per turn and evict the others'.
        for old in [k for k, (a, _) in self._prefix.items() if len(a) < len(arr) and (a == arr[:len(a)]).all()]:
            del self._prefix[old]
            self._prefix_size -= len(old)
        self._prefix[key] = (arr, kv)
        self._prefix_size += len(key)
        while self._prefix_size > self.prefix_cache_tokens:
            old, _ = self._prefix.popitem(last=False)
            self._prefix_size -= len(old)

    def _flush_prefix(self):
        self._prefix.clear()
        self._prefix_size = 0


def _rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)
