//go:build !k8s129

// API shims shared by every pinned release after 1.29: the device manager's Start, Stop
// and GetDeviceRunContainerOptions, and the stub plugin's Start, Stop, Register and Watch
// take a logger or a context; the allocate request's IDs are DevicesIds; the stub hands
// its callbacks devices by pointer. 1.29 has the older forms (compat_k129.go).

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
	"k8s.io/kubernetes/pkg/kubelet/config"
)

func startManager(logger klog.Logger, m *devicemanager.ManagerImpl, active devicemanager.ActivePodsFunc, ready config.SourcesReady, cmap containermap.ContainerMap, running sets.Set[string]) error {
	return m.Start(logger, active, ready, cmap, running)
}

func stopManager(logger klog.Logger, m *devicemanager.ManagerImpl) error {
	return m.Stop(logger)
}

func runContainerOptions(ctx context.Context, m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return m.GetDeviceRunContainerOptions(ctx, pod, c)
}

func newStub(logger klog.Logger, devs []*pluginapi.Device, socket, resource string, preStart, preferred bool) *plugin.Stub {
	return plugin.NewDevicePluginStub(logger, devs, socket, resource, preStart, preferred)
}

func startStub(ctx context.Context, s *plugin.Stub) error { return s.Start(ctx) }

func stopStub(logger klog.Logger, s *plugin.Stub) error { return s.Stop(logger) }

func registerStub(ctx context.Context, s *plugin.Stub, kubeletSocket, resource, sockDir string) error {
	return s.Register(ctx, kubeletSocket, resource, sockDir)
}

func watchStub(ctx context.Context, s *plugin.Stub, kubeletSocket, resource, sockDir string) {
	s.Watch(ctx, kubeletSocket, resource, sockDir)
}

func allocateIDs(r *pluginapi.ContainerAllocateRequest) []string { return r.GetDevicesIds() }

func containerAllocateRequest(ids []string) *pluginapi.ContainerAllocateRequest {
	return &pluginapi.ContainerAllocateRequest{DevicesIds: ids}
}

func setStubAlloc(s *plugin.Stub, f func(*pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error)) {
	s.SetAllocFunc(func(r *pluginapi.AllocateRequest, _ map[string]*pluginapi.Device) (*pluginapi.AllocateResponse, error) {
		return f(r)
	})
}

func setStubPreferred(s *plugin.Stub, f func(*pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error)) {
	s.SetGetPreferredAllocFunc(func(r *pluginapi.PreferredAllocationRequest, _ map[string]*pluginapi.Device) (*pluginapi.PreferredAllocationResponse, error) {
		return f(r)
	})
}
