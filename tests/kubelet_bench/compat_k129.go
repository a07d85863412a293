//go:build k8s129

// API shims for k8s.io/kubernetes 1.29.x, the oldest pinned release: no entry point
// of the device manager or of its stub plugin takes a logger or a context yet.

package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
)

const builtFor = "1.29"

func newManager(_ klog.Logger) (*devicemanager.ManagerImpl, error) {
	return devicemanager.NewManagerImpl(nil, topologymanager.NewFakeManager())
}

func startManager(_ klog.Logger, m *devicemanager.ManagerImpl, active devicemanager.ActivePodsFunc, ready config.SourcesReady, cmap containermap.ContainerMap, running sets.Set[string]) error {
	return m.Start(active, ready, cmap, running)
}

func stopManager(_ klog.Logger, m *devicemanager.ManagerImpl) error {
	return m.Stop()
}

func allocate(_ context.Context, m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) error {
	return m.Allocate(pod, c)
}

func runContainerOptions(_ context.Context, m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return m.GetDeviceRunContainerOptions(pod, c)
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

func newStub(_ klog.Logger, devs []*pluginapi.Device, socket, resource string, preStart, preferred bool) *plugin.Stub {
	return plugin.NewDevicePluginStub(devs, socket, resource, preStart, preferred)
}

func startStub(_ context.Context, s *plugin.Stub) error { return s.Start() }

func stopStub(_ klog.Logger, s *plugin.Stub) error { return s.Stop() }

func registerStub(_ context.Context, s *plugin.Stub, kubeletSocket, resource, sockDir string) error {
	return s.Register(kubeletSocket, resource, sockDir)
}

// watchStub runs until the process ends: this release's Watch takes no context.
func watchStub(_ context.Context, s *plugin.Stub, kubeletSocket, resource, sockDir string) {
	s.Watch(kubeletSocket, resource, sockDir)
}

// In this release the allocate request's IDs are DevicesIDs (later DevicesIds), and the
// stub hands its callbacks devices by value.
func allocateIDs(r *pluginapi.ContainerAllocateRequest) []string { return r.GetDevicesIDs() }

func containerAllocateRequest(ids []string) *pluginapi.ContainerAllocateRequest {
	return &pluginapi.ContainerAllocateRequest{DevicesIDs: ids}
}

func setStubAlloc(s *plugin.Stub, f func(*pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error)) {
	s.SetAllocFunc(func(r *pluginapi.AllocateRequest, _ map[string]pluginapi.Device) (*pluginapi.AllocateResponse, error) {
		return f(r)
	})
}

func setStubPreferred(s *plugin.Stub, f func(*pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error)) {
	s.SetGetPreferredAllocFunc(func(r *pluginapi.PreferredAllocationRequest, _ map[string]pluginapi.Device) (*pluginapi.PreferredAllocationResponse, error) {
		return f(r)
	})
}
