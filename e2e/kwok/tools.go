//go:build tools

// Package tools pins KWOK's controller, the fake kubelet of `cargo xtask bench scale`
// (docs/benchmarks.md).
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
