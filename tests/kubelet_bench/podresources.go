//go:build !k8s129

package main

// The kubelet's PodResources API (v1): the kubelet's own server
// (k8s.io/kubernetes/pkg/kubelet/apis/podresources) on a unix socket, over the
// bench's active pods and what holds them. On the DRA side the claims the DRA
// manager prepared (its claim cache, Manager.GetContainerClaimInfos); on the
// device manager side (devicesHeld) the units the device manager allocated.
// The kubelet's container manager turns claim infos and allocated device
// instances into the API's entries; that glue is ours: one ClaimResource per
// prepared device with its driver, pool, device name, CDI IDs and share ID,
// and one ContainerDevices per allocated device ID (with its NUMA nodes when
// the plugin gave any). Nothing else (CPU, memory manager) holds anything.

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// servePodResources serves the v1 PodResources API at socket until ctx ends,
// over the DRA side's active pods and prepared claims.
func (b *draBench) servePodResources(ctx context.Context, socket string) error {
	return servePodResources(ctx, b.logger, socket, podresources.PodResourcesProviders{
		Pods:             benchPods{b.activePods},
		Devices:          noneHeld{},
		Cpus:             noneHeld{},
		Memory:           noneHeld{},
		DynamicResources: claimsHeld{b},
	})
}

// servePodResources serves the v1 PodResources API of providers at socket until ctx ends.
func servePodResources(ctx context.Context, logger klog.Logger, socket string, providers podresources.PodResourcesProviders) error {
	if err := os.MkdirAll(filepath.Dir(socket), 0o750); err != nil {
		return err
	}
	_ = os.Remove(socket) // left by a killed bench, as a restarted kubelet finds it
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socket, err)
	}
	server := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, providers))
	go func() {
		<-ctx.Done()
		server.Stop()
	}()
	go func() {
		if err := server.Serve(listener); err != nil {
			logger.Error(err, "PodResources server ended")
		}
	}()
	return nil
}

// benchPods: the active pods, by name.
type benchPods struct{ active func() []*v1.Pod }

func (p benchPods) GetActivePods() []*v1.Pod { return p.active() }
func (p benchPods) GetPods() []*v1.Pod       { return p.active() }

func (p benchPods) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range p.active() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

// servePodResources serves the v1 PodResources API at socket until ctx ends,
// over the device manager side's active pods and the units allocated to them.
func (b *bench) servePodResources(ctx context.Context, socket string) error {
	return servePodResources(ctx, b.logger, socket, podresources.PodResourcesProviders{
		Pods:             benchPods{b.activePods},
		Devices:          devicesHeld{b},
		Cpus:             noneHeld{},
		Memory:           noneHeld{},
		DynamicResources: noneHeld{},
	})
}

// devicesHeld: what the device manager running now (the bench's last start)
// allocated, as the kubelet's container manager reports it.
type devicesHeld struct{ b *bench }

func (d devicesHeld) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	if mgr := d.b.current(); mgr != nil {
		return containerDevices(mgr.GetDevices(podUID, containerName))
	}
	return nil
}

func (d devicesHeld) update(logger klog.Logger) {
	if mgr := d.b.current(); mgr != nil {
		updateAllocatedDevices(logger, mgr)
	}
}

func (d devicesHeld) allocatable(logger klog.Logger) []*podresourcesapi.ContainerDevices {
	if mgr := d.b.current(); mgr != nil {
		return containerDevices(allocatableDevices(logger, mgr))
	}
	return nil
}

// containerDevices: one entry per device ID, one per NUMA node of it when the
// plugin said any.
func containerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resource, instances := range devs {
		for id, dev := range instances {
			nodes := dev.GetTopology().GetNodes()
			if len(nodes) == 0 {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}})
				continue
			}
			for _, node := range nodes {
				out = append(out, &podresourcesapi.ContainerDevices{
					ResourceName: resource,
					DeviceIds:    []string{id},
					Topology:     &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: node.GetID()}}},
				})
			}
		}
	}
	return out
}

// claimsHeld: what the DRA manager's claim cache holds for a container.
type claimsHeld struct{ b *draBench }

func (c claimsHeld) dynamicResources(logger klog.Logger, pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	infos, err := c.b.mgr.GetContainerClaimInfos(pod, container)
	if err != nil {
		logger.Error(err, "No claim infos", "pod", klog.KObj(pod), "container", container.Name)
		return nil
	}
	var out []*podresourcesapi.DynamicResource
	for _, info := range infos {
		drivers := make([]string, 0, len(info.DriverState))
		for driver := range info.DriverState {
			drivers = append(drivers, driver)
		}
		sort.Strings(drivers)
		var resources []*podresourcesapi.ClaimResource
		for _, driver := range drivers {
			for _, device := range info.DriverState[driver].Devices {
				resource := &podresourcesapi.ClaimResource{
					DriverName: driver, PoolName: device.PoolName, DeviceName: device.DeviceName,
				}
				for _, id := range device.CDIDeviceIDs {
					resource.CdiDevices = append(resource.CdiDevices, &podresourcesapi.CDIDevice{Name: id})
				}
				if device.ShareID != nil {
					share := string(*device.ShareID)
					resource.ShareId = &share
				}
				resources = append(resources, resource)
			}
		}
		out = append(out, &podresourcesapi.DynamicResource{
			ClaimName: info.ClaimName, ClaimNamespace: info.Namespace, ClaimResources: resources,
		})
	}
	return out
}
