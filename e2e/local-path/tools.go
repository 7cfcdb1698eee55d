//go:build tools

// Package tools pins Rancher's local-path-provisioner, the dynamic provisioner `cargo xtask
// cluster up` runs for the local cluster's default StorageClass (docs/local-cluster.md).
package tools

import _ "github.com/rancher/local-path-provisioner"
