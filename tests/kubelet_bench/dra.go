//go:build !k8s129

package main

// dra: the kubelet's DRA side (k8s.io/kubernetes/pkg/kubelet/cm/dra: its
// manager and DRA plugin manager, registered through the kubelet's plugin
// manager and plugin watcher) for one node, against a real API server, driven
// by JSON lines as the device manager bench is.
//
//	kubelet-bench dra --kubeconfig F --node N --registry-dir D --state-dir S
//	                  [--pod-resources-socket P] [-v N]
//
// At start it lists and watches the node's ResourceSlices (every driver), then
// starts the manager, which deletes every slice of the node as a starting
// kubelet does, and the plugin manager, which registers drivers whose sockets
// appear in the registry directory. With --pod-resources-socket it also serves
// the kubelet's PodResources API there (podresources.go): the active pods and
// the claims prepared for them. Commands (one answer line each):
//
//	version
//	wait_registered  driver, timeout_s        -> elapsed_s, done_monotonic_ns
//	wait_slices      driver, devices, timeout_s: the driver's slices of this
//	                 node hold `devices` devices, after the start's wipe when
//	                 the driver had slices then -> elapsed_s, done_monotonic_ns,
//	                 since_start_s, wiped
//	slices           driver -> devices: the published device names, pool
//	make_claims      namespace, driver, count, prefix: creates `count` claims,
//	                 each allocated one of the driver's published devices
//	                 (round robin) and reserved for its own pod, as the
//	                 scheduler leaves them -> claims: [{claim, pod_name, pod_uid, device}]
//	prepare          namespace, pod_name, pod_uid, claims: PrepareResources
//	                 of a pod whose one container uses every claim
//	                 -> prepare_s, cdi_devices
//	unprepare        namespace, pod_name, pod_uid, claims -> unprepare_s
//	delete_claims    namespace, names
//	metrics          -> grpc: {method: {count, sum}} (the kubelet's
//	                 dra_grpc_operations_duration_seconds), operations
//	memstats, exit
//
// Run it inside the namespaces of the API server it talks to; it writes only
// under its registry and state directories.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	kubeletmetrics "k8s.io/kubernetes/pkg/kubelet/metrics"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// The kubelet's client settings (kubeAPIQPS, kubeAPIBurst defaults).
const (
	kubeletQPS   = 50
	kubeletBurst = 100
)

type sliceState struct {
	driver  string
	pool    string
	devices []string
}

// sliceTracker follows the node's ResourceSlices through one list and watch.
type sliceTracker struct {
	mu        sync.Mutex
	slices    map[string]sliceState // by slice name
	atStart   map[string]bool       // drivers with slices when the bench started
	wiped     map[string]bool       // drivers whose slices were deleted since
	changed   chan struct{}         // closed and replaced on every event
	listError error
}

func (t *sliceTracker) notify() {
	close(t.changed)
	t.changed = make(chan struct{})
}

func stateOf(s *resourceapi.ResourceSlice) sliceState {
	names := make([]string, 0, len(s.Spec.Devices))
	for _, d := range s.Spec.Devices {
		names = append(names, d.Name)
	}
	return sliceState{driver: s.Spec.Driver, pool: s.Spec.Pool.Name, devices: names}
}

func startTracker(ctx context.Context, logger klog.Logger, client kubernetes.Interface, node string) (*sliceTracker, error) {
	t := &sliceTracker{
		slices:  map[string]sliceState{},
		atStart: map[string]bool{},
		wiped:   map[string]bool{},
		changed: make(chan struct{}),
	}
	selector := fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, node).String()
	api := client.ResourceV1().ResourceSlices()
	list, err := api.List(ctx, metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	for i := range list.Items {
		st := stateOf(&list.Items[i])
		t.slices[list.Items[i].Name] = st
		t.atStart[st.driver] = true
	}
	version := list.ResourceVersion
	go func() {
		for ctx.Err() == nil {
			w, err := api.Watch(ctx, metav1.ListOptions{FieldSelector: selector, ResourceVersion: version, AllowWatchBookmarks: true})
			if err != nil {
				logger.Error(err, "Watching ResourceSlices failed, again in 1s")
				time.Sleep(time.Second)
				continue
			}
			for ev := range w.ResultChan() {
				s, ok := ev.Object.(*resourceapi.ResourceSlice)
				if !ok {
					continue
				}
				version = s.ResourceVersion
				t.mu.Lock()
				switch ev.Type {
				case watch.Added, watch.Modified:
					t.slices[s.Name] = stateOf(s)
				case watch.Deleted:
					delete(t.slices, s.Name)
					t.wiped[s.Spec.Driver] = true
				}
				t.notify()
				t.mu.Unlock()
			}
		}
	}()
	return t, nil
}

// devices of one driver on this node: names (sorted) and the pool.
func (t *sliceTracker) devices(driver string) ([]string, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var names []string
	pool := ""
	for _, s := range t.slices {
		if s.driver == driver {
			names = append(names, s.devices...)
			pool = s.pool
		}
	}
	sort.Strings(names)
	return names, pool
}

type draBench struct {
	logger  klog.Logger
	client  kubernetes.Interface
	node    string
	started time.Time
	mgr     *dra.Manager
	plugins *draplugin.DRAPluginManager
	slices  *sliceTracker

	mu   sync.Mutex
	pods map[string]*v1.Pod // active pods (prepared, not yet unprepared)
}

func runDRA(args []string) int {
	fs := flag.NewFlagSet("dra", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the kubelet's identity (required)")
	node := fs.String("node", "", "node name (required; the Node object must exist)")
	registryDir := fs.String("registry-dir", "", "plugin registry directory the plugin watcher watches (required)")
	stateDir := fs.String("state-dir", "", "directory of the DRA manager's checkpoint (required)")
	podResources := fs.String("pod-resources-socket", "", "serve the kubelet's PodResources API (v1) on this socket")
	addKlogFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *kubeconfig == "" || *node == "" || *registryDir == "" || *stateDir == "" {
		fmt.Fprintln(os.Stderr, "dra: --kubeconfig, --node, --registry-dir and --state-dir are required")
		return 2
	}
	logger := klog.Background()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()
	b, err := startDRA(ctx, logger, *kubeconfig, *node, *registryDir, *stateDir)
	if err == nil && *podResources != "" {
		err = b.servePodResources(ctx, *podResources)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dra:", err)
		return 1
	}
	serveLines(logger, b.handle, cancel)
	return 0
}

func startDRA(ctx context.Context, logger klog.Logger, kubeconfig, node, registryDir, stateDir string) (*draBench, error) {
	legacyregistry.MustRegister(kubeletmetrics.DRAOperationsDuration)
	legacyregistry.MustRegister(kubeletmetrics.DRAGRPCOperationsDuration)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = kubeletQPS, kubeletBurst
	cfg.UserAgent = "kubelet-bench-dra/" + builtFor
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{registryDir, stateDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, err
		}
	}
	b := &draBench{logger: logger, client: client, node: node, started: time.Now(), pods: map[string]*v1.Pod{}}
	if b.slices, err = startTracker(ctx, logger, client, node); err != nil {
		return nil, err
	}
	if b.mgr, err = dra.NewManager(logger, client, stateDir); err != nil {
		return nil, fmt.Errorf("NewManager: %w", err)
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	}
	if err := b.mgr.Start(ctx, b.activePods, draGetNode(getNode), sourcesAlwaysReady{}); err != nil {
		return nil, fmt.Errorf("Start: %w", err)
	}
	handler := b.mgr.GetWatcherHandler()
	plugins, ok := handler.(*draplugin.DRAPluginManager)
	if !ok {
		return nil, fmt.Errorf("unexpected DRA handler type %T", handler)
	}
	b.plugins = plugins
	pm := pluginmanager.NewPluginManager(registryDir, &record.FakeRecorder{})
	pm.AddHandler(registerapi.DRAPlugin, handler)
	go pm.Run(ctx, sourcesAlwaysReady{}, ctx.Done())
	return b, nil
}

type sourcesAlwaysReady struct{}

func (sourcesAlwaysReady) AddSource(string) {}
func (sourcesAlwaysReady) AllReady() bool   { return true }

func (b *draBench) activePods() []*v1.Pod {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*v1.Pod, 0, len(b.pods))
	for _, p := range b.pods {
		out = append(out, p)
	}
	return out
}

func (b *draBench) handle(line []byte) (map[string]any, bool) {
	var h header
	resp := map[string]any{}
	var err error
	exit := false
	if err = json.Unmarshal(line, &h); err != nil {
		err = fmt.Errorf("bad request: %w", err)
	} else {
		switch h.Cmd {
		case "version":
			for k, v := range versionInfo() {
				resp[k] = v
			}
			resp["pid"] = os.Getpid()
		case "wait_registered":
			err = b.cmdWaitRegistered(line, resp)
		case "wait_slices":
			err = b.cmdWaitSlices(line, resp)
		case "slices":
			err = b.cmdSlices(line, resp)
		case "make_claims":
			err = b.cmdMakeClaims(line, resp)
		case "prepare", "unprepare":
			err = b.cmdPrepare(line, h.Cmd == "prepare", resp)
		case "delete_claims":
			err = b.cmdDeleteClaims(line)
		case "metrics":
			err = draMetrics(resp)
		case "memstats":
			err = cmdMemstats(line, resp)
		case "exit":
			exit = true
		default:
			err = fmt.Errorf("unknown cmd %q", h.Cmd)
		}
	}
	if err != nil {
		resp = map[string]any{"ok": false, "error": err.Error()}
	} else {
		resp["ok"] = true
	}
	if len(h.ID) > 0 {
		resp["id"] = h.ID
	}
	return resp, exit
}

func timeoutOf(s *float64, def time.Duration) time.Duration {
	if s == nil {
		return def
	}
	return time.Duration(*s * float64(time.Second))
}

type waitRegisteredReq struct {
	header
	Driver   string   `json:"driver"`
	TimeoutS *float64 `json:"timeout_s"`
}

func (b *draBench) cmdWaitRegistered(line []byte, resp map[string]any) error {
	begin := time.Now()
	var req waitRegisteredReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	deadline := begin.Add(timeoutOf(req.TimeoutS, 30*time.Second))
	for {
		if _, err := b.plugins.GetPlugin(req.Driver); err == nil {
			resp["elapsed_s"] = time.Since(begin).Seconds()
			resp["done_monotonic_ns"] = monotonicNs()
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("timeout after %.3fs: %w", time.Since(begin).Seconds(), err)
		}
		time.Sleep(time.Millisecond)
	}
}

type waitSlicesReq struct {
	header
	Driver   string   `json:"driver"`
	Devices  int      `json:"devices"`
	TimeoutS *float64 `json:"timeout_s"`
}

func (b *draBench) cmdWaitSlices(line []byte, resp map[string]any) error {
	begin := time.Now()
	var req waitSlicesReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	timer := time.NewTimer(timeoutOf(req.TimeoutS, 60*time.Second))
	defer timer.Stop()
	for {
		t := b.slices
		t.mu.Lock()
		changed := t.changed
		wiped := t.wiped[req.Driver] || !t.atStart[req.Driver]
		t.mu.Unlock()
		names, _ := t.devices(req.Driver)
		if wiped && len(names) == req.Devices {
			resp["elapsed_s"] = time.Since(begin).Seconds()
			resp["since_start_s"] = time.Since(b.started).Seconds()
			resp["done_monotonic_ns"] = monotonicNs()
			resp["wiped"] = t.atStart[req.Driver]
			return nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return fmt.Errorf("timeout after %.3fs waiting for %d devices of %s (have %d, wiped %v)",
				time.Since(begin).Seconds(), req.Devices, req.Driver, len(names), wiped)
		}
	}
}

type driverReq struct {
	header
	Driver string `json:"driver"`
}

func (b *draBench) cmdSlices(line []byte, resp map[string]any) error {
	var req driverReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	names, pool := b.slices.devices(req.Driver)
	resp["devices"] = names
	resp["pool"] = pool
	return nil
}

type makeClaimsReq struct {
	header
	Namespace string `json:"namespace"`
	Driver    string `json:"driver"`
	Count     int    `json:"count"`
	Prefix    string `json:"prefix"`
}

// cmdMakeClaims plays the scheduler: each claim gets one published device
// and its pod in reservedFor, written to the status as the scheduler does.
func (b *draBench) cmdMakeClaims(line []byte, resp map[string]any) error {
	var req makeClaimsReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	names, pool := b.slices.devices(req.Driver)
	if len(names) == 0 {
		return fmt.Errorf("driver %s has no published devices on node %s", req.Driver, b.node)
	}
	ctx := context.Background()
	api := b.client.ResourceV1().ResourceClaims(req.Namespace)
	out := make([]map[string]any, 0, req.Count)
	for i := 0; i < req.Count; i++ {
		name := fmt.Sprintf("%s-%d", req.Prefix, i)
		podName, podUID := name+"-pod", string(uuid.NewUUID())
		device := names[i%len(names)]
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: req.Namespace},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name:    "dev",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "bench", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
			}}}},
		}
		created, err := api.Create(ctx, claim, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create claim %s: %w", name, err)
		}
		created.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "dev", Driver: req.Driver, Pool: pool, Device: device}},
		}}
		created.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: podName, UID: types.UID(podUID)}}
		if _, err := api.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("allocate claim %s: %w", name, err)
		}
		out = append(out, map[string]any{"claim": name, "pod_name": podName, "pod_uid": podUID, "device": device})
	}
	resp["claims"] = out
	return nil
}

type prepareReq struct {
	header
	Namespace string   `json:"namespace"`
	PodName   string   `json:"pod_name"`
	PodUID    string   `json:"pod_uid"`
	Claims    []string `json:"claims"`
}

func benchPod(req prepareReq) (*v1.Pod, *v1.Container) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: req.PodName, Namespace: req.Namespace, UID: types.UID(req.PodUID)}}
	c := v1.Container{Name: "main"}
	for i, claim := range req.Claims {
		ref := fmt.Sprintf("c%d", i)
		name := claim
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, v1.PodResourceClaim{Name: ref, ResourceClaimName: &name})
		c.Resources.Claims = append(c.Resources.Claims, v1.ResourceClaim{Name: ref})
	}
	pod.Spec.Containers = []v1.Container{c}
	return pod, &pod.Spec.Containers[0]
}

func (b *draBench) cmdPrepare(line []byte, prepare bool, resp map[string]any) error {
	var req prepareReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	if req.PodUID == "" || len(req.Claims) == 0 {
		return errors.New("needs \"pod_uid\" and \"claims\"")
	}
	pod, c := benchPod(req)
	ctx := klog.NewContext(context.Background(), b.logger)
	if prepare {
		b.mu.Lock()
		b.pods[req.PodUID] = pod // active while it starts, as in the kubelet
		b.mu.Unlock()
		begin := time.Now()
		if err := b.mgr.PrepareResources(ctx, pod); err != nil {
			return err
		}
		resp["prepare_s"] = time.Since(begin).Seconds()
		info, err := b.mgr.GetResources(pod, c)
		if err != nil {
			return err
		}
		cdi := []string{}
		for _, d := range info.CDIDevices {
			cdi = append(cdi, d.Name)
		}
		resp["cdi_devices"] = cdi
		return nil
	}
	b.mu.Lock()
	delete(b.pods, req.PodUID) // the pod has terminated
	b.mu.Unlock()
	begin := time.Now()
	if err := b.mgr.UnprepareResources(ctx, pod); err != nil {
		return err
	}
	resp["unprepare_s"] = time.Since(begin).Seconds()
	return nil
}

type deleteClaimsReq struct {
	header
	Namespace string   `json:"namespace"`
	Names     []string `json:"names"`
}

func (b *draBench) cmdDeleteClaims(line []byte) error {
	var req deleteClaimsReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	api := b.client.ResourceV1().ResourceClaims(req.Namespace)
	for _, name := range req.Names {
		if err := api.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete claim %s: %w", name, err)
		}
	}
	return nil
}

// draMetrics reports the kubelet's DRA histograms: the gRPC calls to the
// driver by method, and PrepareResources/UnprepareResources as a whole.
func draMetrics(resp map[string]any) error {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return err
	}
	grpc := map[string]map[string]float64{}
	ops := map[string]map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			entry := map[string]float64{"count": float64(h.GetSampleCount()), "sum": h.GetSampleSum()}
			switch f.GetName() {
			case "dra_grpc_operations_duration_seconds":
				grpc[labelValue(m, "driver_name")+" "+labelValue(m, "method_name")+" "+labelValue(m, "grpc_status_code")] = entry
			case "dra_operations_duration_seconds":
				ops[labelValue(m, "operation_name")+" error="+labelValue(m, "is_error")] = entry
			}
		}
	}
	resp["grpc"] = grpc
	resp["operations"] = ops
	return nil
}
