//go:build !k8s129

package main

// The kubelet's PodResources API (v1) for the DRA side: the kubelet's own server
// (k8s.io/kubernetes/pkg/kubelet/apis/podresources) on a unix socket, listing
// the bench's active pods with the claims the DRA manager prepared for them
// (its claim cache, Manager.GetContainerClaimInfos). The kubelet's container
// manager turns claim infos into the API's DynamicResource entries; that glue
// (dynamicResources below) is ours, one ClaimResource per prepared device
// with its driver, pool, device name, CDI IDs and share ID. No device plugin,
// CPU or memory manager runs on this side: those providers hold nothing.

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
)

// servePodResources serves the v1 PodResources API at socket until ctx ends.
func (b *draBench) servePodResources(ctx context.Context, socket string) error {
	if err := os.MkdirAll(filepath.Dir(socket), 0o750); err != nil {
		return err
	}
	_ = os.Remove(socket) // left by a killed bench, as a restarted kubelet finds it
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socket, err)
	}
	server := grpc.NewServer()
	providers := podresources.PodResourcesProviders{
		Pods:             benchPods{b},
		Devices:          noneHeld{},
		Cpus:             noneHeld{},
		Memory:           noneHeld{},
		DynamicResources: claimsHeld{b},
	}
	podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, providers))
	go func() {
		<-ctx.Done()
		server.Stop()
	}()
	go func() {
		if err := server.Serve(listener); err != nil {
			b.logger.Error(err, "PodResources server ended")
		}
	}()
	return nil
}

// benchPods: the active pods (prepared, not yet unprepared), by name.
type benchPods struct{ b *draBench }

func (p benchPods) GetActivePods() []*v1.Pod { return p.b.activePods() }
func (p benchPods) GetPods() []*v1.Pod       { return p.b.activePods() }

func (p benchPods) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range p.b.activePods() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
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
