//go:build k8s135

// API shims for k8s.io/kubernetes 1.35.x: the device manager entry points
// below take no logger/context argument in this release.

package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
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

// The PodResources providers' 1.35 signatures (podresources.go): nothing held by
// a device plugin, CPU or memory manager on the DRA side, by claims on the
// device manager side.
type noneHeld struct{}

func (noneHeld) UpdateAllocatedDevices()                                       {}
func (noneHeld) GetDevices(string, string) []*podresourcesapi.ContainerDevices { return nil }
func (noneHeld) GetAllocatableDevices() []*podresourcesapi.ContainerDevices    { return nil }
func (noneHeld) GetCPUs(string, string) []int64                                { return nil }
func (noneHeld) GetAllocatableCPUs() []int64                                   { return nil }
func (noneHeld) GetMemory(string, string) []*podresourcesapi.ContainerMemory   { return nil }
func (noneHeld) GetAllocatableMemory() []*podresourcesapi.ContainerMemory      { return nil }
func (noneHeld) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

func (d devicesHeld) UpdateAllocatedDevices() { d.update(d.b.logger) }
func (d devicesHeld) GetAllocatableDevices() []*podresourcesapi.ContainerDevices {
	return d.allocatable(d.b.logger)
}

func (c claimsHeld) GetDynamicResources(pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	return c.dynamicResources(c.b.logger, pod, container)
}
