"""machinery/packing.py: the update's micro-batches: packed rows, their log-probs, and the sdpa that reads them.

The paper's trainer (veRL) removes padding too (`use_remove_padding`, flash-attention's varlen kernels). This
is ours, which also runs on a CPU; it changes what a forward and backward pass cost, not the loss or gradient.
grpo.py calls `micro_batches` and `token_logprobs` (the log-probs of a packed row, lm_head applied in chunks);
train.py and sft.py call `packed_attention` on their models; sft.py packs its conversations with `pack`.

A micro-batch is one packed row: several trajectories concatenated, position_ids restarting at 0 for each,
attention_mask None. transformers (5.x) detects the packing from position_ids
(`masking_utils.find_packed_sequence_indices`) and builds a block-diagonal causal mask for sdpa/eager;
flash-attention uses varlen kernels, so there is no padding at all. Under that mask sdpa still computes every
query against every key of the row, (row length)^2 work, most of it masked away: `packed_attention` gives a
model an sdpa that runs each sequence of a packed row alone, as flash-attention does.

A GRPO group's samples share their prompt. With share (and `packed_attention`), consecutive trajectories with
the same prompt are packed behind one copy of it: the first whole, each other one from its first response
token on, its positions going on from the prompt's length, and its queries attending to that prompt and to
itself (a tree, as in prefix-sharing trainers). Prompt tokens carry no loss, so this is the same loss and
gradient, up to float rounding, for fewer tokens.

Rows are planned by first-fit-decreasing bin packing under a token budget. Under torch.distributed every rank
runs as many micro-batches as the rank with the most (bins are split, then empty ones added, which run as
zero-weight dummies), since every forward pass of an FSDP model has collectives.

The trajectories are anything with grpo.TrainSeq's fields (input_ids, loss_mask, advantage, old_logp,
is_weight, ref_logp); this module imports no project module.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from machinery import precision

PACKED_SDPA = "sdpa_packed"  # the attention implementation name `packed_attention` registers


@dataclass
class MicroBatch:
    """One packed row, N slots. Every per-token tensor is (1, N), entry t belonging to the token in slot t."""
    input_ids: torch.Tensor  # (1, N) long
    position_ids: torch.Tensor  # (1, N) long: restarting at 0 for each trajectory; a shared one's go on
    seq_ids: torch.Tensor  # (1, N): which trajectory of the micro-batch each slot holds
    loss_mask: torch.Tensor  # (1, N) bool
    old_logp: torch.Tensor  # (1, N) float32, 0 where old_known is False
    old_known: torch.Tensor  # (1, N) bool: the trajectory came with old_logp
    adv: torch.Tensor  # (1, N) float32
    is_weight: torch.Tensor | None  # (1, N) float32
    ref_logp: torch.Tensor | None  # (1, N) float32
    lengths: list[int]  # each trajectory's tokens
    n_slots: int  # N: the tokens run, a shared prompt once
    shared: list[int] | None = None  # with share: the prompt tokens each trajectory shares (`shared_prompts`)
    index: list[int] | None = None  # from `micro_batches`: which trajectories it holds; [] for a dummy

    @property
    def dummy(self) -> bool:
        """An empty bin, run (on trajectory 0) only so that every rank runs as many forward passes."""
        return self.index == []

    def per_sequence(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-token values x (1, N) back to one (L_i,) tensor per trajectory (a shared prompt's positions, which
        carry no loss, as 0)."""
        if not self.shared:
            return list(x[0].split(self.lengths))
        parts = x[0].split([n - s for n, s in zip(self.lengths, self.shared)])
        return [torch.cat([p.new_zeros(s), p]) for p, s in zip(parts, self.shared)]


def micro_batches(trajs: Sequence, max_tokens: int, device: torch.device, *, share: bool = False) -> list[MicroBatch]:
    """The micro-batches of `trajs`, each one packed row of at most max_tokens tokens (first-fit decreasing;
    with share, each run of a group's samples behind one copy of its prompt), as many as on the rank with the
    most (the missing ones as dummies), on `device`."""
    lengths = [len(t.input_ids) for t in trajs]
    out = []
    for idx in _plan(lengths, max_tokens, device, shared_prompts(trajs) if share else None):
        mb = collate([trajs[i] for i in (idx or [0])], device=device, share=share)
        mb.index = idx
        out.append(mb)
    return out


# ----------------------------------------------------------------------------- planning

def pack(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """First-fit-decreasing bin packing: indices into lengths, each bin summing to <= max_tokens."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] > max_tokens:
            raise ValueError(f"trajectory {i} has {lengths[i]} tokens, more than max_tokens_per_micro="
                             f"{max_tokens}; raise it to at least the longest trajectory")
        for b in range(len(bins)):
            if room[b] >= lengths[i]:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(max_tokens - lengths[i])
    return bins


def shared_prompts(trajs: Sequence) -> list[int]:
    """How many leading tokens each trajectory shares with the first of its run (0: it starts a run). A run is
    consecutive trajectories with the same prompt, its first's tokens before its first loss token, outside the
    loss in each of them too (a GRPO group's samples, as train.py orders them)."""
    out, first, P = [], None, 0
    for t in trajs:
        ids = torch.as_tensor(t.input_ids)
        if (first is not None and len(ids) > P and torch.equal(ids[:P], first[:P])
                and not torch.as_tensor(t.loss_mask[:P]).any()):
            out.append(P)
            continue
        first, m = ids, torch.as_tensor(t.loss_mask).nonzero()
        P = int(m[0, 0]) if m.numel() else len(ids)
        out.append(0)
    return out


def _pack_runs(lengths: Sequence[int], shared: Sequence[int], max_tokens: int) -> list[list[int]]:
    """`pack`, with each run of shared-prompt trajectories kept together, costing its tokens behind one prompt
    (a run over max_tokens is cut into consecutive pieces, each with its own copy of the prompt)."""
    units, cost = [], []
    for i, (n, s) in enumerate(zip(lengths, shared)):
        if s and units and cost[-1] + n - s <= max_tokens:
            units[-1].append(i)
            cost[-1] += n - s
        else:
            units.append([i])
            cost.append(n)
    return [[i for u in b for i in units[u]] for b in pack(cost, max_tokens)]


def _split_to(bins: list[list[int]], k: int, lengths: Sequence[int]) -> list[list[int]]:
    # FSDP ranks must run the same number of forwards: split the heaviest multi-item bins
    # (never exceeding the budget), then add empty bins, which run as zero-weight dummies.
    bins = [list(b) for b in bins]
    while len(bins) < k:
        splittable = [b for b in bins if len(b) > 1]
        if not splittable:
            bins.append([])
            continue
        b = max(splittable, key=lambda b: sum(lengths[i] for i in b))
        bins.append(b[len(b) // 2:])
        del b[len(b) // 2:]
    return bins


def _plan(lengths: Sequence[int], max_tokens: int, device: torch.device,
          shared: Sequence[int] | None = None) -> list[list[int]]:
    bins = _pack_runs(lengths, shared, max_tokens) if shared and any(shared) else pack(lengths, max_tokens)
    return _split_to(bins, int(precision.over_ranks(float(len(bins)), "max", device)), lengths)


# ----------------------------------------------------------------------------- one row

def _field(t, name: str, i: int) -> torch.Tensor | None:
    v = getattr(t, name)
    if v is None:
        return None
    v = torch.as_tensor(v, dtype=torch.float32).flatten().cpu()
    if v.numel() != len(t.input_ids):
        raise ValueError(f"trajectory {i}: {name} has {v.numel()} entries, input_ids has {len(t.input_ids)}")
    return v


def collate(trajs: Sequence, *, device: torch.device | str = "cpu", share: bool = False) -> MicroBatch:
    """One micro-batch: the trajectories in a single packed (1, N) row. share: a trajectory that shares its run's
    prompt (`shared_prompts`) enters from its first token after it."""
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in ("ids", "pos", "seq", "mask", "old", "known", "adv", "isw",
                                                           "ref")}
    has_isw = any(t.is_weight is not None for t in trajs)
    has_ref = all(t.ref_logp is not None for t in trajs)
    shared = shared_prompts(trajs) if share else [0] * len(trajs)
    for k, (t, s) in enumerate(zip(trajs, shared)):
        n = len(t.input_ids)
        cols["ids"].append(torch.tensor(t.input_ids, dtype=torch.long)[s:])
        cols["pos"].append(torch.arange(s, n))
        cols["seq"].append(torch.full((n - s,), k))
        cols["mask"].append(torch.tensor(t.loss_mask, dtype=torch.bool)[s:])
        old = _field(t, "old_logp", k)
        cols["old"].append(old[s:] if old is not None else torch.zeros(n - s))
        cols["known"].append(torch.full((n - s,), old is not None))
        cols["adv"].append(torch.full((n - s,), float(t.advantage)))
        isw = _field(t, "is_weight", k)
        cols["isw"].append(isw[s:] if isw is not None else torch.ones(n - s))
        ref = _field(t, "ref_logp", k)
        cols["ref"].append(ref[s:] if ref is not None else torch.zeros(n - s))
    out = {k: torch.cat(v)[None].to(device, non_blocking=True) for k, v in cols.items()}  # (1, N)
    return MicroBatch(
        input_ids=out["ids"], position_ids=out["pos"], seq_ids=out["seq"], loss_mask=out["mask"],
        old_logp=out["old"], old_known=out["known"], adv=out["adv"], is_weight=out["isw"] if has_isw else None,
        ref_logp=out["ref"] if has_ref else None, lengths=[len(t.input_ids) for t in trajs],
        n_slots=out["ids"].numel(), shared=shared if any(shared) else None)


# ----------------------------------------------------------------------------- log-probs

def _chunk_logprobs(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    targets: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = F.linear(h, weight, bias).float() / temperature  # (C, V): one chunk only
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, *,
                   attention_mask: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                   chunk_size: int = 1024, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs (B, T) float32 of a Hugging Face causal LM, differentiable.

    input_ids, position_ids: (B, T); a packed row has position_ids restarting at 0 for each
    sequence and attention_mask None; padded rows are right-padded with attention_mask (B, T).
    out[b, t] = log p(input_ids[b, t] | the earlier tokens of its sequence); 0 at sequence starts
    (position 0) and, if mask (B, T) is given, wherever mask is 0 (not computed at all).
    The decoder body runs once; lm_head is applied chunk_size tokens at a time under activation
    checkpointing, so no (T, vocab) logits tensor exists, in forward or backward.
    """
    # The full model is called (not model.model) so FSDP2's root hooks gather lm_head/embeddings;
    # logits_to_keep=1 makes its own lm_head call cost one row, and a hook takes the hidden states.
    captured = {}
    hook = model.get_decoder().register_forward_hook(lambda mod, args, out: captured.__setitem__("h", out[0]))
    try:
        model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
              use_cache=False, logits_to_keep=1)
    finally:
        hook.remove()
    h = captured["h"]  # (B, T, H)
    want = position_ids > 0
    if mask is not None:
        want = want & mask.bool()
    rows, cols = want.nonzero(as_tuple=True)  # (M,), (M,)
    # (M, H): the state before token t predicts token t (a shared-prompt branch's first: the prompt's last)
    h_prev = h[rows, _predecessors(position_ids)[rows, cols]]
    targets = input_ids[rows, cols]  # (M,)
    head = model.get_output_embeddings()
    parts = []
    for s in range(0, targets.numel(), chunk_size):
        args = (h_prev[s:s + chunk_size], head.weight, head.bias, targets[s:s + chunk_size], temperature)
        if torch.is_grad_enabled():
            # Backward recomputes this chunk's logits instead of keeping them.
            parts.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(*args))
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    if not parts:
        return out + 0.0 * h.sum()  # keeps the graph connected (FSDP backward must still run)
    return out.index_put((rows, cols), torch.cat(parts))


def _predecessors(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T): the index of the token before each one in its sequence: t - 1, except for the first
    token of a shared-prompt branch (its position is not one more than the previous token's), whose
    predecessor is the prompt's last token, at (the index where its run's first position 0 is) + position - 1."""
    T = position_ids.shape[1]
    idx = torch.arange(T, device=position_ids.device).expand_as(position_ids)
    run = torch.cummax(torch.where(position_ids == 0, idx, 0), dim=1).values  # (B, T): where each run starts
    jump = torch.ones_like(position_ids, dtype=torch.bool)
    jump[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    return torch.where(jump & (position_ids > 0), run + position_ids - 1, idx - 1)


# ----------------------------------------------------------------------------- attention

def _packed_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, position_ids=None, **kwargs):
    """transformers attention function: sdpa, but a packed row (batch 1, no cache, position_ids starting at 0 and
    jumping somewhere) runs one sdpa per segment, without the row's block-diagonal mask. A segment starting at
    position 0 is a sequence, causal on itself; one starting at position p > 0 is a shared-prompt branch, whose
    queries see the first p tokens of the last sequence (the prompt) and, causally, themselves. Anything else
    (padded rows, prefill, decode with its cache) goes to transformers' own sdpa unchanged.
    query (1, H, T, D), key/value (1, Hkv, T, D) -> (1, T, H, D)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    T = query.shape[2]
    cuts = None
    if (query.shape[0] == 1 and T > 1 and key.shape[2] == T and position_ids is not None
            and position_ids.dim() == 2 and getattr(module, "sliding_window", None) is None
            and kwargs.get("softcap") is None and kwargs.get("position_bias") is None and position_ids[0, 0] == 0):
        pos = position_ids[0]
        cuts = ((pos[1:] != pos[:-1] + 1).nonzero()[:, 0] + 1).tolist()  # where segments start, after the first
    if not cuts:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      position_ids=position_ids, **kwargs)
    gqa = query.shape[1] != key.shape[1]
    bounds, firsts = [0] + cuts + [T], [0] + pos[cuts].tolist()  # segment starts, and their first positions
    out, run = [], 0  # run: where the last sequence (position 0) starts
    for a, b, p in zip(bounds, bounds[1:], firsts):
        if p == 0:
            run = a
            out.append(F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b],
                                                      dropout_p=dropout, scale=scaling, is_causal=True,
                                                      enable_gqa=gqa))  # (1, H, b - a, D)
            continue
        k = torch.cat([key[:, :, run:run + p], key[:, :, a:b]], 2)  # (1, Hkv, p + b - a, D): prompt, then branch
        v = torch.cat([value[:, :, run:run + p], value[:, :, a:b]], 2)
        see = torch.ones(b - a, p + b - a, dtype=torch.bool, device=query.device).tril(p)  # the prompt, causal after
        out.append(F.scaled_dot_product_attention(query[:, :, a:b], k, v, attn_mask=see, dropout_p=dropout,
                                                  scale=scaling, enable_gqa=gqa))
    return torch.cat(out, 2).transpose(1, 2).contiguous(), None


def packed_attention(model: torch.nn.Module) -> bool:
    """Switch a transformers model that uses "sdpa" to `_packed_sdpa` (the same sdpa, sequence by sequence in
    packed rows). Why: sdpa under the block-diagonal mask of a packed row computes all (row length)^2 query-key
    pairs; one sequence at a time computes only the pairs inside each. Returns whether the model was switched
    (other implementations, e.g. flash-attention's varlen kernels, are left alone)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(PACKED_SDPA, _packed_sdpa)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)  # padded rows and decode keep sdpa's masks
    model.set_attn_implementation(PACKED_SDPA)
    return True
