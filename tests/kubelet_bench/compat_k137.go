//go:build k8s137

// API shims for k8s.io/kubernetes 1.37.x: NewManagerImpl, GetCapacity,
// UpdateAllocatedDevices and GetAllocatableDevices take a klog.Logger, and
// Allocate takes a context plus the admission operation.

package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

const builtFor = "1.37"

func newManager(logger klog.Logger) (*devicemanager.ManagerImpl, error) {
	return devicemanager.NewManagerImpl(logger, nil, topologymanager.NewFakeManager(logger))
}

func allocate(ctx context.Context, m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) error {
	return m.Allocate(ctx, pod, c, lifecycle.AddOperation)
}

func getCapacity(logger klog.Logger, m *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList, []string) {
	return m.GetCapacity(logger)
}

func updateAllocatedDevices(logger klog.Logger, m *devicemanager.ManagerImpl) {
	m.UpdateAllocatedDevices(logger)
}

func allocatableDevices(logger klog.Logger, m *devicemanager.ManagerImpl) devicemanager.ResourceDeviceInstances {
	return m.GetAllocatableDevices(logger)
}

// draGetNode adapts a node getter to the DRA manager's GetNodeFunc (with a context from 1.37).
func draGetNode(get func(context.Context) (*v1.Node, error)) dra.GetNodeFunc {
	return get
}

// The PodResources providers' 1.37 signatures (podresources.go): nothing held by
// a device plugin, CPU or memory manager on the DRA side, by claims on the
// device manager side.
type noneHeld struct{}

func (noneHeld) UpdateAllocatedDevices(klog.Logger)                                    {}
func (noneHeld) GetDevices(string, string) []*podresourcesapi.ContainerDevices         { return nil }
func (noneHeld) GetAllocatableDevices(klog.Logger) []*podresourcesapi.ContainerDevices { return nil }
func (noneHeld) GetCPUs(*v1.Pod, *v1.Container) []int64                                { return nil }
func (noneHeld) GetPodCPUs(string) []int64                                             { return nil }
func (noneHeld) GetAllocatableCPUs() []int64                                           { return nil }
func (noneHeld) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.ContainerMemory {
	return nil
}
func (noneHeld) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory { return nil }
func (noneHeld) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory { return nil }
func (noneHeld) GetDynamicResources(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

func (d devicesHeld) UpdateAllocatedDevices(logger klog.Logger) { d.update(logger) }
func (d devicesHeld) GetAllocatableDevices(logger klog.Logger) []*podresourcesapi.ContainerDevices {
	return d.allocatable(logger)
}

func (c claimsHeld) GetDynamicResources(logger klog.Logger, pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	return c.dynamicResources(logger, pod, container)
}
