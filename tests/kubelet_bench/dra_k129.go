//go:build k8s129

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// runDRA: 1.29 has no resource.k8s.io/v1 and another DRA kubelet API; the
// DRA bench needs a 1.35+ build.
func runDRA([]string) int {
	fmt.Fprintln(os.Stderr, "dra: not built for 1.29 (the DRA bench needs kubelet-bench-1.35 or newer)")
	return 2
}

// servePodResources: 1.29's PodResources server takes other providers; the
// bench's --pod-resources-socket needs a 1.35+ build.
func (b *bench) servePodResources(context.Context, string) error {
	return errors.New("--pod-resources-socket: not built for 1.29 (needs kubelet-bench-1.35 or newer)")
}
