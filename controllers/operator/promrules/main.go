// Prints KubeVirt's PrometheusRule as JSON, built by KubeVirt's own code
// (kubevirt.io/kubevirt/pkg/monitoring/rules), for virt-operator's build script to embed:
// the recording rules and alerts are Go code upstream, so running that code is the only way
// to take them as they are rather than retyped.
//
// Usage: go run . <install namespace>
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"kubevirt.io/kubevirt/pkg/monitoring/rules"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: promrules <install namespace>")
		os.Exit(2)
	}
	namespace := os.Args[1]
	if err := rules.SetupRules(namespace); err != nil {
		fmt.Fprintf(os.Stderr, "registering KubeVirt's rules: %v\n", err)
		os.Exit(1)
	}
	rule, err := rules.BuildPrometheusRule(namespace)
	if err != nil {
		fmt.Fprintf(os.Stderr, "building KubeVirt's PrometheusRule: %v\n", err)
		os.Exit(1)
	}
	out, err := json.MarshalIndent(rule, "", "  ")
	if err != nil {
		fmt.Fprintf(os.Stderr, "encoding the PrometheusRule: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}
