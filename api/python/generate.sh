#!/usr/bin/env bash
# Regenerates the Python stubs of proto/ into api/python/kvpool/v1 with
# Debian's protoc and grpc_python_plugin (packages protobuf-compiler and
# protobuf-compiler-grpc). CI runs it and fails when the committed stubs
# differ. The proto package kvpool.v1 lands as the subpackage kvpool.v1 of
# the client, so the generated imports ("from kvpool.v1 import ...") resolve.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=api/python
rm -f "$out"/kvpool/v1/*_pb2*.py
protoc -I proto --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" \
  proto/kvpool/v1/kvpool.proto proto/kvpool/v1/admin.proto
