#!/usr/bin/env bash
# Regenerates app/ate_devplugin/api/ from proto/: the device plugin API (v1beta1), the
# plugin registration API (pluginregistration), the DRA node service (dra/v1, dra/v1beta1)
# and the kubelet's PodResources API (podresources/v1).
# Usage: tools/gen-proto.sh [OUTPUT_ROOT]   (default: app/; the drift test passes a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-app}
api="$out/ate_devplugin/api"
for proto in v1beta1/api.proto pluginregistration/api.proto dra/v1/api.proto dra/v1beta1/api.proto podresources/v1/api.proto; do
  dir=$(dirname "$proto")
  mkdir -p "$api/$dir"
  python -m grpc_tools.protoc -I proto --python_out="$api" --pyi_out="$api" --grpc_python_out="$api" "proto/$proto"
  # protoc emits `from <dir> import api_pb2`; make it a package-relative import.
  sed -i "s/^from ${dir//\//\\.} import api_pb2/from . import api_pb2/" "$api/$dir/api_pb2_grpc.py"
done
for pkg in "$api/dra" "$api/dra/v1" "$api/dra/v1beta1" "$api/pluginregistration" "$api/podresources"; do
  [ -e "$pkg/__init__.py" ] || : > "$pkg/__init__.py"
done
