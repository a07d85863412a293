package main

// rpc_load: many Allocate calls at a plugin's socket, from several goroutines.
//
// The device manager cannot be driven concurrently: the kubelet admits pods one
// at a time, and ManagerImpl.Allocate writes maps it does not lock. To measure
// how a plugin copes with concurrent callers, this command dials the plugin the
// way the kubelet's endpoint client does (insecure gRPC over the unix socket,
// authority "localhost", one shared connection) and sends the kubelet's own
// request shapes: GetPreferredAllocation (when the plugin advertises it)
// followed by Allocate with one container request. Each call's latency covers
// both RPCs, as the kubelet's admission does.
//
//	{"cmd": "rpc_load", "socket": "/var/lib/kubelet/device-plugins/x.sock",
//	 "device_ids": ["x-0", ...], "count": 2000, "concurrency": 16,
//	 "size": 1, "preferred": null, "timeout_s": 30}
//
// answers {"latencies_s": [...], "wall_s": s, "errors": n, "first_error": "...",
// "preferred": bool, "concurrency": n}.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type rpcLoadReq struct {
	header
	Socket      string   `json:"socket"`
	DeviceIDs   []string `json:"device_ids"`
	Count       int      `json:"count"`
	Concurrency int      `json:"concurrency"`
	Size        int      `json:"size"`
	Preferred   *bool    `json:"preferred"`
	TimeoutS    *float64 `json:"timeout_s"`
}

func cmdRPCLoad(line []byte, resp map[string]any) error {
	var req rpcLoadReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	if req.Socket == "" || len(req.DeviceIDs) == 0 || req.Count <= 0 {
		return errors.New("rpc_load needs \"socket\", \"device_ids\" and a positive \"count\"")
	}
	if req.Concurrency <= 0 {
		req.Concurrency = 1
	}
	if req.Size <= 0 {
		req.Size = 1
	}
	if req.Size > len(req.DeviceIDs) {
		return fmt.Errorf("size %d exceeds the %d device IDs", req.Size, len(req.DeviceIDs))
	}
	timeout := 30 * time.Second
	if req.TimeoutS != nil {
		timeout = time.Duration(*req.TimeoutS * float64(time.Second))
	}

	dialCtx, cancelDial := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelDial()
	conn, err := grpc.DialContext(dialCtx, req.Socket, //nolint:staticcheck // the kubelet's own way of dialing a plugin
		grpc.WithAuthority("localhost"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(), //nolint:staticcheck // as the kubelet does
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
	if err != nil {
		return fmt.Errorf("dial %s: %w", req.Socket, err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	preferred := false
	if req.Preferred != nil {
		preferred = *req.Preferred
	} else {
		opts, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
		if err != nil {
			return fmt.Errorf("GetDevicePluginOptions: %w", err)
		}
		preferred = opts.GetGetPreferredAllocationAvailable()
	}

	latencies := make([]float64, req.Count)
	var (
		errMu    sync.Mutex
		errCount int
		firstErr string
	)
	fail := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		errCount++
		if firstErr == "" {
			firstErr = err.Error()
		}
	}
	next := make(chan int)
	var wg sync.WaitGroup
	begin := time.Now()
	for w := 0; w < req.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				start := time.Now()
				if err := loadOne(ctx, client, req, i, preferred); err != nil {
					fail(err)
				}
				latencies[i] = time.Since(start).Seconds()
			}
		}()
	}
	for i := 0; i < req.Count; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	resp["wall_s"] = time.Since(begin).Seconds()
	resp["latencies_s"] = latencies
	resp["errors"] = errCount
	resp["first_error"] = firstErr
	resp["preferred"] = preferred
	resp["concurrency"] = req.Concurrency
	return nil
}

// loadOne is one admission's worth of plugin calls: the preferred allocation
// over every device (when asked), then Allocate of the chosen IDs.
func loadOne(ctx context.Context, client pluginapi.DevicePluginClient, req rpcLoadReq, i int, preferred bool) error {
	n := len(req.DeviceIDs)
	ids := make([]string, 0, req.Size)
	for k := 0; k < req.Size; k++ {
		ids = append(ids, req.DeviceIDs[(i*req.Size+k)%n])
	}
	if preferred {
		pr, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs: req.DeviceIDs,
				AllocationSize:     int32(req.Size),
			}},
		})
		if err != nil {
			return fmt.Errorf("GetPreferredAllocation: %w", err)
		}
		if crs := pr.GetContainerResponses(); len(crs) > 0 && len(crs[0].GetDeviceIDs()) == req.Size {
			ids = crs[0].GetDeviceIDs()
		}
	}
	ar, err := client.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{containerAllocateRequest(ids)},
	})
	if err != nil {
		return fmt.Errorf("Allocate: %w", err)
	}
	if len(ar.GetContainerResponses()) == 0 {
		return errors.New("Allocate: no container response")
	}
	return nil
}
