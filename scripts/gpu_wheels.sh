#!/usr/bin/env bash
# Download the wheels thermik's core path needs beyond what the GPU machine's image holds (docs/gpu.md): MCP, pydantic,
# jsonschema and their dependencies, at the versions of requirements/main.txt, for CPython 3.12 on x86-64 Linux.
# They travel with `scripts/gpu_check.sh --wheels .whl` (about 10 MB; the device tool carries at most 64 MiB).
#
#     bash scripts/gpu_wheels.sh            # into .whl/ (ignored by git: add `/.whl/` to .git/info/exclude)
#     bash scripts/gpu_wheels.sh DIR        # into DIR
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
# Absent from the image (torch 2.11, transformers 5.17, tokenizers, safetensors, numpy, matplotlib, rich, httpx,
# attrs, click, jinja2 are there); typing-extensions, anyio, idna and h11 travel too: the image's may be older than
# pydantic and mcp need. mcp's server imports cryptography (mcp/server/request_state.py; with cffi, pycparser).
names=(
  mcp mcp-types pydantic pydantic-core annotated-types typing-inspection typing-extensions pydantic-settings
  python-dotenv jsonschema jsonschema-specifications referencing rpds-py starlette sse-starlette uvicorn httpx2
  httpcore2 truststore opentelemetry-api pyjwt python-multipart anyio idna h11 cryptography cffi pycparser
)
pins=()
for name in "${names[@]}"; do
  pin=$(grep -i -m1 "^${name}==" requirements/main.txt || true)
  if [[ -z $pin ]]; then
    echo "gpu_wheels: $name is not pinned in requirements/main.txt" >&2
    exit 1
  fi
  pins+=("$pin")
done
mkdir -p "$dest"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" "${pins[@]}"
ls "$dest"
du -sh "$dest"
