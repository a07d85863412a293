#!/usr/bin/env bash
# Regenerates app/ate_devplugin/api/ from proto/, one package per API and version, named as
# the kubelet names them: the device plugin API (deviceplugin/v1beta1), the plugin
# registration API (pluginregistration/v1), the DRA node service (dra/v1, dra/v1beta1), the
# DRA resource health service (drahealth/v1, drahealth/v1alpha1) and the PodResources API
# (podresources/v1). The protobuf packages on the wire are the
# kubelet's (v1beta1, pluginregistration, k8s.io.kubelet.pkg.apis.dra.v1, ...): the
# directories name the API, the .proto files keep the wire names.
# Usage: tools/gen-proto.sh [OUTPUT_ROOT]   (default: app/; the drift test passes a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-app}
api="$out/ate_devplugin/api"
protos=(deviceplugin/v1beta1 pluginregistration/v1 dra/v1 dra/v1beta1 drahealth/v1 drahealth/v1alpha1 podresources/v1)
for dir in "${protos[@]}"; do
  mkdir -p "$api/$dir"
  python -m grpc_tools.protoc -I proto --python_out="$api" --pyi_out="$api" --grpc_python_out="$api" "proto/$dir/api.proto"
  # protoc emits `from <dir> import api_pb2`; make it a package-relative import.
  sed -i "s/^from ${dir//\//\\.} import api_pb2/from . import api_pb2/" "$api/$dir/api_pb2_grpc.py"
  # Every directory down to the version is a package.
  pkg=$api
  for part in ${dir//\// }; do
    pkg=$pkg/$part
    [ -e "$pkg/__init__.py" ] || : > "$pkg/__init__.py"
  done
done
[ -e "$api/__init__.py" ] || : > "$api/__init__.py"
