"""machinery/policy.py: the policy and its engine, placed: train.py's `setup` calls `init_distributed`, then `build`.

One process: fp32 weights, the update under torch.autocast. torchrun: FSDP2 over the ranks (NCCL on GPUs, gloo on
the CPU), fp32 masters sharded, compute in --update-dtype, gradients reduced in fp32. The engine decodes with the
policy's own weights where it can, else with its own copy, refreshed after each update (train.push_weights).
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

import grpo
from data import models
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



def build(args, model_path: str, device: str, world: int, log):
    """The policy (FSDP2 over ranks), the engine, and the reference model for a KL term. Returns (policy,
    ref, engine, whether the engine has its own copy of the weights, tokenizer)."""
    c = args.common
    g = args.grpo
    e = args.machinery.engine
    how = args.machinery.update
    tokenizer = models.load_tokenizer(model_path)
    # one process: fp32 weights, the update under torch.autocast in --update-dtype; FSDP2: fp32 masters
    # sharded, compute in --update-dtype, gradients reduced in fp32
    policy = models.load_model(model_path, dtype=torch.float32).to("cpu" if how.offload and world > 1 else device)
    packing.packed_attention(policy)  # packed rows: sdpa sequence by sequence, not over the whole row
    grpo.freeze_below(policy, g.train_layers)
    if g.lora_rank:  # adapters before sharding, so FSDP2 shards them with their layer
        grpo.add_lora(policy, g.lora_rank, g.lora_alpha, g.train_layers)
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
        gen_model = (models.load_model(model_path, dtype=dtype).to(device).eval()
                     if world > 1 or dtype != torch.float32 or g.lora_rank else policy)
    # SGLang on a CPU: a rank's rollouts of a step at once, each a bounded prompt and its response budget
    in_flight = min(e.engine_batch, max(1, g.prompts_per_step * g.samples_per_prompt // world))
    eng = engines.build_engine(e.engine, tokenizer, model=gen_model,
                               model_path=models.resolve(model_path) if e.engine == "sglang" else None,
                                  max_batch=in_flight if e.engine == "sglang" else e.engine_batch,
                                  deterministic=e.deterministic, lockstep=e.lockstep,
                                  dtype=e.dtype, mem_fraction_static=e.sglang_mem_fraction, seed=c.seed,
                                  server_url=e.sglang_url or None, device=device,
                                  max_context=args.data.max_prompt_tokens + args.rollout.max_response_tokens)
    ref = None
    if g.kl_coef > 0:
        ref_dtype = torch.float32 if world == 1 else precision.DTYPES[how.update_dtype]
        ref = models.load_model(model_path, dtype=ref_dtype).to(device).eval()
        packing.packed_attention(ref)
    return policy, ref, eng, gen_model is not policy, tokenizer


def gather(obj, world: int) -> list:
    """Every rank's obj, in rank order (all_gather_object); [obj] on one process."""
    parts = [obj] if world == 1 else [None] * world
    if world > 1:
        dist.all_gather_object(parts, obj)
    return parts
