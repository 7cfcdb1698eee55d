//go:build tools

package tools

import _ "kubevirt.io/kubevirt/cmd/virtctl"
