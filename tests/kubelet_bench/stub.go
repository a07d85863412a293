package main

// stub-plugin: the kubelet's own Go stub device plugin
// (pkg/kubelet/cm/devicemanager/plugin/v1beta1.Stub) as a process.
//
// It serves the device plugin API on --socket, registers --resource with the
// kubelet, and (unless --no-watch) runs the stub's own kubelet-restart watch:
// when kubelet.sock is created again it restarts its server and registers
// again. With --control it also reads JSON lines on stdin:
//
//	{"cmd": "set_health", "unhealthy": ["dev-1"]}  sends a ListAndWatch update
//	{"cmd": "register"}                              registers once more
//	{"cmd": "stop"}                                  stops and exits
//
// and answers each with one JSON line. Without --control stdin is ignored.
// It prints {"event": "ready", ...} on stdout once serving (and registered).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

type stubOpts struct {
	resource      string
	socket        string
	devices       int
	idPrefix      string
	preferred     bool
	preStart      bool
	register      bool
	watch         bool
	control       bool
	kubeletSocket string
	deviceNode    string
}

func runStub(args []string) int {
	var o stubOpts
	fs := flag.NewFlagSet("stub-plugin", flag.ContinueOnError)
	fs.StringVar(&o.resource, "resource", "", "extended resource name to register (required)")
	fs.StringVar(&o.socket, "socket", "", "plugin socket path (default <plugin dir>/stub-<resource>.sock)")
	fs.IntVar(&o.devices, "devices", 2, "number of devices advertised")
	fs.StringVar(&o.idPrefix, "id-prefix", "dev-", "device IDs are <prefix><n>, n = 0..devices-1")
	fs.BoolVar(&o.preferred, "preferred", false, "advertise GetPreferredAllocation (prefers the highest IDs)")
	fs.BoolVar(&o.preStart, "pre-start", false, "advertise PreStartContainer")
	noRegister := fs.Bool("no-register", false, "serve only; do not register with the kubelet")
	noWatch := fs.Bool("no-watch", false, "do not watch for kubelet restarts (no re-registration)")
	fs.BoolVar(&o.control, "control", false, "read JSON-line commands on stdin")
	fs.StringVar(&o.kubeletSocket, "kubelet-socket", pluginapi.KubeletSocket, "kubelet registration socket")
	fs.StringVar(&o.deviceNode, "device-node", "", "host device node handed out for every device (optional)")
	addKlogFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o.register, o.watch = !*noRegister, !*noWatch
	if o.resource == "" || o.devices < 0 {
		fmt.Fprintln(os.Stderr, "stub-plugin: --resource is required and --devices must be >= 0")
		return 2
	}
	if o.socket == "" {
		o.socket = filepath.Join(pluginapi.DevicePluginPath, "stub-"+strings.NewReplacer("/", "-", ".", "-").Replace(o.resource)+".sock")
	}
	if err := serveStub(o); err != nil {
		klog.Background().Error(err, "stub-plugin failed")
		return 1
	}
	return 0
}

func stubDevices(o stubOpts, unhealthy map[string]bool) []*pluginapi.Device {
	devs := make([]*pluginapi.Device, 0, o.devices)
	for i := 0; i < o.devices; i++ {
		id := fmt.Sprintf("%s%d", o.idPrefix, i)
		health := pluginapi.Healthy
		if unhealthy[id] {
			health = pluginapi.Unhealthy
		}
		devs = append(devs, &pluginapi.Device{ID: id, Health: health})
	}
	return devs
}

// allocFunc answers with one container response per request (the stub's
// default answer has none, which the kubelet rejects): envs and an annotation
// naming the IDs, plus a device node per ID when --device-node is given.
func allocFunc(o stubOpts) func(*pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	return func(r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		resp := &pluginapi.AllocateResponse{}
		for _, creq := range r.ContainerRequests {
			ids := append([]string(nil), allocateIDs(creq)...)
			sort.Strings(ids)
			joined := strings.Join(ids, ",")
			cresp := &pluginapi.ContainerAllocateResponse{
				Envs:        map[string]string{"STUB_RESOURCE": o.resource, "STUB_DEVICE_IDS": joined},
				Annotations: map[string]string{"kubelet-bench.stub/devices": joined},
			}
			if o.deviceNode != "" {
				for _, id := range ids {
					cresp.Devices = append(cresp.Devices, &pluginapi.DeviceSpec{
						ContainerPath: "/dev/stub/" + id, HostPath: o.deviceNode, Permissions: "rw",
					})
				}
			}
			resp.ContainerResponses = append(resp.ContainerResponses, cresp)
		}
		return resp, nil
	}
}

// preferredFunc keeps must_include and fills up with the highest available
// IDs, so that a test can tell the preference was followed.
func preferredFunc(r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, creq := range r.ContainerRequests {
		chosen := append([]string(nil), creq.MustIncludeDeviceIDs...)
		taken := map[string]bool{}
		for _, id := range chosen {
			taken[id] = true
		}
		avail := append([]string(nil), creq.AvailableDeviceIDs...)
		sort.Sort(sort.Reverse(sort.StringSlice(avail)))
		for _, id := range avail {
			if len(chosen) >= int(creq.AllocationSize) {
				break
			}
			if !taken[id] {
				chosen = append(chosen, id)
				taken[id] = true
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: chosen})
	}
	return resp, nil
}

func emit(mu *sync.Mutex, v map[string]any) {
	data, _ := json.Marshal(v)
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(string(data))
}

func serveStub(o stubOpts) error {
	logger := klog.Background()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()

	stub := newStub(logger, stubDevices(o, nil), o.socket, o.resource, o.preStart, o.preferred)
	setStubAlloc(stub, allocFunc(o))
	if o.preferred {
		setStubPreferred(stub, preferredFunc)
	}
	if err := startStub(ctx, stub); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer func() {
		if err := stopStub(logger, stub); err != nil {
			logger.Error(err, "stop")
		}
	}()
	// The stub looks for "<dir>DEPRECATION" to skip registration, so the
	// directory is passed with its trailing slash.
	sockDir := filepath.Dir(o.socket) + "/"
	if o.register {
		if err := registerStub(ctx, stub, o.kubeletSocket, o.resource, sockDir); err != nil {
			return fmt.Errorf("register: %w", err)
		}
	}
	if o.watch {
		go watchStub(ctx, stub, o.kubeletSocket, o.resource, sockDir)
	}
	var outMu sync.Mutex
	emit(&outMu, map[string]any{
		"event": "ready", "resource": o.resource, "socket": o.socket,
		"registered": o.register, "watch": o.watch, "pid": os.Getpid(),
	})

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan struct{})
	if o.control {
		go func() {
			defer close(done)
			stubControl(ctx, o, stub, sockDir, &outMu)
		}()
	}
	select {
	case sig := <-sigs:
		logger.Info("Signal received, stopping", "signal", sig.String())
	case <-done:
	}
	return nil
}

type stubCmd struct {
	Cmd       string          `json:"cmd"`
	ID        json.RawMessage `json:"id,omitempty"`
	Unhealthy []string        `json:"unhealthy"`
}

func stubControl(ctx context.Context, o stubOpts, stub *plugin.Stub, sockDir string, outMu *sync.Mutex) {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var c stubCmd
		resp := map[string]any{}
		err := json.Unmarshal(sc.Bytes(), &c)
		stop := false
		if err == nil {
			switch c.Cmd {
			case "set_health":
				bad := map[string]bool{}
				for _, id := range c.Unhealthy {
					bad[id] = true
				}
				err = updateWithTimeout(stub, stubDevices(o, bad), 5*time.Second)
			case "register":
				err = registerStub(ctx, stub, o.kubeletSocket, o.resource, sockDir)
			case "stop":
				stop = true
			default:
				err = fmt.Errorf("unknown cmd %q", c.Cmd)
			}
		}
		if err != nil {
			resp["ok"], resp["error"] = false, err.Error()
		} else {
			resp["ok"] = true
		}
		if len(c.ID) > 0 {
			resp["id"] = c.ID
		}
		emit(outMu, resp)
		if stop {
			return
		}
	}
}

// updateWithTimeout hands devices to the stub's ListAndWatch loop; the stub's
// Update blocks until a stream takes them.
func updateWithTimeout(stub *plugin.Stub, devs []*pluginapi.Device, timeout time.Duration) error {
	sent := make(chan struct{})
	go func() {
		stub.Update(devs)
		close(sent)
	}()
	select {
	case <-sent:
		return nil
	case <-time.After(timeout):
		return errors.New("no ListAndWatch stream took the update")
	}
}
