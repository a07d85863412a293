//go:build k8s135

// API shims for k8s.io/kubernetes 1.35.x: the device manager entry points
// below take no logger/context argument in this release.

package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

const builtFor = "1.35"

func newManager(_ klog.Logger) (*devicemanager.ManagerImpl, error) {
	return devicemanager.NewManagerImpl(nil, topologymanager.NewFakeManager())
}

func allocate(_ context.Context, m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) error {
	return m.Allocate(pod, c)
}

func getCapacity(_ klog.Logger, m *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList, []string) {
	return m.GetCapacity()
}

func updateAllocatedDevices(_ klog.Logger, m *devicemanager.ManagerImpl) {
	m.UpdateAllocatedDevices()
}

func allocatableDevices(_ klog.Logger, m *devicemanager.ManagerImpl) devicemanager.ResourceDeviceInstances {
	return m.GetAllocatableDevices()
}

// draGetNode adapts a node getter to the DRA manager's GetNodeFunc (no context in 1.35).
func draGetNode(get func(context.Context) (*v1.Node, error)) dra.GetNodeFunc {
	return func() (*v1.Node, error) { return get(context.Background()) }
}
