// Module root marker only. The real module files are go129.mod, go135.mod and
// go137.mod (one per pinned k8s.io/kubernetes release); build with
//   go build -modfile=go129.mod -tags k8s129 -o ... .
//   go build -modfile=go135.mod -tags k8s135 -o ... .
//   go build -modfile=go137.mod -tags k8s137 -o ... .
// or simply run tools/build-kubelet-bench.sh from the repository root.
module atedevplugin.test/kubeletbench

go 1.25.0
