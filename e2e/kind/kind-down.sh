#!/usr/bin/env bash
# Deletes the kind cluster created by kind-up.sh.
set -euo pipefail
kind delete cluster --name kubevirt-rs
