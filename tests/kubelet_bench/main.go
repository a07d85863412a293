// Command kubelet-bench embeds the kubelet's device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager) so that device plugins
// can be tested against the real kubelet code without a kubelet, and wraps
// the kubelet's own Go stub device plugin as a runnable peer.
//
// Subcommands:
//
//	kubelet-bench [bench] [-v N]   JSON-lines control protocol on stdin/stdout
//	kubelet-bench stub-plugin ...  the kubelet's stub device plugin
//	kubelet-bench dra ...          the kubelet's DRA manager for one node (1.35+)
//	kubelet-bench version          one JSON line describing the build
//
// The device manager's kubelet socket is hard-wired upstream to
// /var/lib/kubelet/device-plugins/kubelet.sock: run this program only inside
// a private mount namespace (see tests/harness/kubelet.py).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"

	"k8s.io/klog/v2"
)

func main() {
	args := os.Args[1:]
	cmd := "bench"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "bench":
		os.Exit(runBench(args))
	case "stub-plugin":
		os.Exit(runStub(args))
	case "dra":
		os.Exit(runDRA(args))
	case "version":
		out, _ := json.Marshal(versionInfo())
		fmt.Println(string(out))
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q (want bench, stub-plugin, dra or version)\n", cmd)
		os.Exit(2)
	}
}

// k8sModuleVersion reports the k8s.io/kubernetes version linked in.
func k8sModuleVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path == "k8s.io/kubernetes" {
			return dep.Version
		}
	}
	return "unknown"
}

func versionInfo() map[string]any {
	return map[string]any{
		"k8s_version": k8sModuleVersion(),
		"built_for":   builtFor,
		"go_version":  runtime.Version(),
	}
}

// addKlogFlags exposes klog's -v (and friends) on a subcommand's flag set;
// klog writes to stderr.
func addKlogFlags(fs *flag.FlagSet) {
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	_ = kfs.Set("logtostderr", "true")
	kfs.VisitAll(func(f *flag.Flag) {
		if f.Name == "v" || f.Name == "vmodule" {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
}
