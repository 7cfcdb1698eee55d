//go:build tools

// Package tools pins Prometheus, which `cargo xtask cluster up --prometheus` builds and runs
// in the local cluster to scrape kubevirt-rs (docs/local-cluster.md).
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
