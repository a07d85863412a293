#!/usr/bin/env bash
# Regenerates app/ate_devplugin/api/v1beta1/ from proto/v1beta1/api.proto.
# Usage: tools/gen-proto.sh [OUTPUT_ROOT]   (default: app/; the drift test passes a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-app}
mkdir -p "$out/ate_devplugin/api/v1beta1"
python -m grpc_tools.protoc -I proto \
  --python_out="$out/ate_devplugin/api" --pyi_out="$out/ate_devplugin/api" \
  --grpc_python_out="$out/ate_devplugin/api" proto/v1beta1/api.proto
# protoc emits `from v1beta1 import api_pb2`; make it a package-relative import.
sed -i 's/^from v1beta1 import api_pb2/from . import api_pb2/' "$out/ate_devplugin/api/v1beta1/api_pb2_grpc.py"
