#!/usr/bin/env bash
# Brings up a kind cluster for kubevirt-rs and loads locally built OCI archives into it.
# For machines with Docker; on machines without, use `cargo xtask cluster up`.
#
# Usage: e2e/kind/kind-up.sh [ARCHIVE.oci.tar ...]
#   KUBECONFIG_OUT  where to write the kubeconfig (default: target/cluster/kind.kubeconfig)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
kubeconfig="${KUBECONFIG_OUT:-$root/target/cluster/kind.kubeconfig}"
name=kubevirt-rs

for tool in docker kind kubectl; do
	command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done

if ! kind get clusters 2>/dev/null | grep -qx "$name"; then
	kind create cluster --config "$here/kind-config.yaml" --wait 120s
fi
mkdir -p "$(dirname "$kubeconfig")"
kind get kubeconfig --name "$name" >"$kubeconfig"

# Images come as OCI archives (buildah push IMG oci-archive:FILE:IMG), as for our own cluster.
for archive in "$@"; do
	kind load image-archive "$archive" --name "$name"
done

kubectl --kubeconfig "$kubeconfig" wait --for=condition=Ready node --all --timeout=120s
echo "export KUBECONFIG=$kubeconfig"
