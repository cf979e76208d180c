"""machinery/policy.py: the policy and its engine, placed: train.py's `setup` calls `init_distributed`, then `build`;
and which of its weights train (the top layers, or LoRA adapters on them; sft.py freezes alike).

One process: fp32 weights, the update under torch.autocast. torchrun: FSDP2 over the ranks (NCCL on GPUs, gloo on
the CPU), fp32 masters sharded, compute in --update-dtype, gradients reduced in fp32. The engine decodes with the
policy's own weights where it can, else with its own copy, refreshed after each update (train.push_weights).
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from machinery import engines
from machinery import packing, precision


def init_distributed(device: str) -> str:
    """The device, with torchrun's process group joined (NCCL on GPUs, gloo on CPU) when there is one."""
    device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return device
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return device


def build(args, load, model_dir: str, tokenizer, device: str, world: int, log):
    """The policy (FSDP2 over ranks), the engine, and the reference model for a KL term. load(dtype): a fresh copy
    of the model's weights (data.models.load_model); model_dir: its folder, for SGLang. Returns (policy, ref,
    engine, whether the engine has its own copy of the weights)."""
    c = args.common
    g = args.grpo
    e = args.machinery.engine
    how = args.machinery.update
    # one process: fp32 weights, the update under torch.autocast in --update-dtype; FSDP2: fp32 masters
    # sharded, compute in --update-dtype, gradients reduced in fp32
    policy = load(dtype=torch.float32).to("cpu" if how.offload and world > 1 else device)
    packing.packed_attention(policy)  # packed rows: sdpa sequence by sequence, not over the whole row
    freeze_below(policy, g.train_layers)
    if g.lora_rank:  # adapters before sharding, so FSDP2 shards them with their layer
        add_lora(policy, g.lora_rank, g.lora_alpha, g.train_layers)
    if world > 1:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        kw = dict(mp_policy=MixedPrecisionPolicy(param_dtype=precision.DTYPES[how.update_dtype],
                                                 reduce_dtype=torch.float32))
        if how.offload:
            kw["offload_policy"] = CPUOffloadPolicy()
        for layer in policy.model.layers:
            fully_shard(layer, **kw)
        fully_shard(policy, **kw)
    dtype = precision.DTYPES[e.dtype]
    bf16 = "bfloat16" in (e.dtype, how.update_dtype)
    if torch.device(device).type == "cpu" and bf16 and not precision.native_bf16():
        log("dtype: this CPU has no native bfloat16 (AVX512-BF16 or AMX), so bfloat16 runs slower than "
            "float32 here: pass --update-dtype float32 (and --dtype float32)")
    # The HF engine gets its own copy of the weights, refreshed after each update, in a lower --dtype,
    # under FSDP (which needs whole weights) and with LoRA (the engine takes merged weights); otherwise it
    # reads the policy's own. SGLang (colocated, one engine per rank) holds its own weights and frees its
    # memory in the update.
    gen_model = None
    if e.engine == "hf":
        gen_model = (load(dtype=dtype).to(device).eval()
                     if world > 1 or dtype != torch.float32 or g.lora_rank else policy)
    # SGLang on a CPU: a rank's rollouts of a step at once, each a bounded prompt and its response budget
    in_flight = min(e.engine_batch, max(1, g.prompts_per_step * g.samples_per_prompt // world))
    eng = engines.from_settings(e, tokenizer, model=gen_model, model_path=model_dir, seed=c.seed, device=device,
                                max_batch=in_flight if e.engine == "sglang" else e.engine_batch,
                                max_context=args.data.max_prompt_tokens + args.rollout.max_response_tokens)
    ref = None
    if g.kl_coef > 0:
        ref_dtype = torch.float32 if world == 1 else precision.DTYPES[how.update_dtype]
        ref = load(dtype=ref_dtype).to(device).eval()
        packing.packed_attention(ref)
    return policy, ref, eng, gen_model is not policy


def gather(obj, world: int) -> list:
    """Every rank's obj, in rank order (all_gather_object); [obj] on one process."""
    parts = [obj] if world == 1 else [None] * world
    if world > 1:
        dist.all_gather_object(parts, obj)
    return parts


# ---------------------------------------------------------------------- which weights train

def freeze_below(model: torch.nn.Module, train_layers: int) -> None:
    """Train only the top `train_layers` decoder layers and the final norm (0, or at least as many as the model
    has: everything trains, embeddings included).

    The frozen bottom gets no backward pass at all (its outputs need no grad), so a step costs about
    forward + 2 x (share trained) forwards; the optimizer must be built after this, on the trainable params.
    """
    decoder = model.get_decoder()
    if train_layers > 0 and (not hasattr(decoder, "layers") or not hasattr(decoder, "norm")):
        raise ValueError(f"train_layers={train_layers}: {type(model).__name__} has no decoder .layers/.norm; "
                         "use train_layers=0")
    every = train_layers <= 0 or train_layers >= len(decoder.layers)
    model.requires_grad_(every)
    if every:
        return
    for layer in decoder.layers[-train_layers:]:
        layer.requires_grad_(True)
    decoder.norm.requires_grad_(True)


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_scale(g) -> float:
    """alpha / rank of a config.Grpo, what merges LoRA adapters into their weights (0.0: no adapters)."""
    return g.lora_alpha / g.lora_rank if g.lora_rank else 0.0


def add_lora(model: torch.nn.Module, rank: int, alpha: float, train_layers: int = 0) -> None:
    """LoRA adapters (the peft library) on every linear layer of the top `train_layers` decoder layers (0: all
    layers); only the adapters train. A departure from the paper, which trains all weights: the frozen weights
    get no weight gradient (about a third fewer FLOPs per trained token) and the optimizer keeps state for the
    adapters alone. The adapters start at zero (B = 0), so the policy starts as the warm start. They are
    injected in place: the model keeps its class and its forward, so the engine and the update use it as is;
    `checkpoint.merge_lora` gives plain weights for an engine copy or a saved folder."""
    from peft import LoraConfig, inject_adapter_in_model
    n = len(model.get_decoder().layers)
    layers = list(range(n - train_layers, n)) if 0 < train_layers < n else list(range(n))
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                                       layers_to_transform=layers), model)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
