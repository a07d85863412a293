package main

// The bench: one device manager driven by JSON lines.
//
// Every request is one JSON object on one line of stdin, with a "cmd" and an
// optional "id" (echoed back verbatim). Every request gets exactly one JSON
// line on stdout, in order: {"ok": true, ...} or {"ok": false, "error": "..."}.
// Requests are handled one at a time; logs go to stderr.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	kubeletmetrics "k8s.io/kubernetes/pkg/kubelet/metrics"
)

const checkpointName = "kubelet_internal_checkpoint"

// podSpec describes a pod the bench treats as active: its containers and
// what each one asked for (resource name -> count).
type podSpec struct {
	UID            string                    `json:"uid"`
	Name           string                    `json:"name,omitempty"`
	Namespace      string                    `json:"namespace,omitempty"`
	Containers     map[string]map[string]int `json:"containers,omitempty"`
	InitContainers map[string]map[string]int `json:"init_containers,omitempty"`
}

// UnmarshalJSON accepts either a bare pod UID string or a podSpec object.
func (p *podSpec) UnmarshalJSON(data []byte) error {
	var uid string
	if err := json.Unmarshal(data, &uid); err == nil {
		*p = podSpec{UID: uid}
		return nil
	}
	type plain podSpec
	var q plain
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err != nil {
		return err
	}
	*p = podSpec(q)
	return nil
}

type runningContainer struct {
	PodUID    string `json:"pod_uid"`
	Container string `json:"container"`
}

type bench struct {
	logger klog.Logger

	mu           sync.Mutex // guards pods, sourcesReady and mgr (read by manager callbacks and the PodResources server)
	pods         map[string]*v1.Pod
	sourcesReady bool

	mgr     *devicemanager.ManagerImpl // written only by the request loop, under mu
	running bool
	removed sets.Set[string] // resources GetCapacity reported removed, not yet returned by "capacity"
}

// sourcesReadyFlag implements config.SourcesReady from the bench's switch.
type sourcesReadyFlag struct{ b *bench }

func (s sourcesReadyFlag) AddSource(string) {}
func (s sourcesReadyFlag) AllReady() bool {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return s.b.sourcesReady
}

func (b *bench) activePods() []*v1.Pod {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*v1.Pod, 0, len(b.pods))
	for _, p := range b.pods {
		out = append(out, p)
	}
	return out
}

// current is the manager of the last start, for other goroutines (nil before one).
func (b *bench) current() *devicemanager.ManagerImpl {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mgr
}

func runBench(args []string) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	podResources := fs.String("pod-resources-socket", "", "serve the kubelet's PodResources API (v1) on this socket (1.35+)")
	addKlogFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// Only the two device-plugin metrics are registered; everything else in
	// the kubelet's registry stays uncreated.
	legacyregistry.MustRegister(kubeletmetrics.DevicePluginRegistrationCount)
	legacyregistry.MustRegister(kubeletmetrics.DevicePluginAllocationDuration)

	b := &bench{
		logger:       klog.Background(),
		pods:         map[string]*v1.Pod{},
		sourcesReady: true,
		removed:      sets.New[string](),
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if *podResources != "" {
		if err := b.servePodResources(ctx, *podResources); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
	}

	serveLines(b.logger, b.handle, func() { b.stopManager() })
	return 0
}

// serveLines answers the JSON lines of stdin with handle, one line each, until
// handle says exit, stdin closes or a SIGTERM/SIGINT arrives (then stop runs).
func serveLines(logger klog.Logger, handle func([]byte) (map[string]any, bool), stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	lines := make(chan []byte)
	go readLines(os.Stdin, lines)
	out := bufio.NewWriter(os.Stdout)
	for {
		select {
		case sig := <-sigs:
			logger.Info("Signal received, stopping", "signal", sig.String())
			stop()
			return
		case line, ok := <-lines:
			if !ok {
				logger.Info("stdin closed, stopping")
				stop()
				return
			}
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			resp, exit := handle(line)
			data, err := json.Marshal(resp)
			if err != nil {
				data, _ = json.Marshal(map[string]any{"ok": false, "error": "encoding response: " + err.Error()})
			}
			_, _ = out.Write(append(data, '\n'))
			_ = out.Flush()
			if exit {
				return
			}
		}
	}
}

func readLines(r io.Reader, ch chan<- []byte) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		ch <- append([]byte(nil), sc.Bytes()...)
	}
	close(ch)
}

type header struct {
	Cmd string          `json:"cmd"`
	ID  json.RawMessage `json:"id,omitempty"`
}

// decodeStrict decodes a request into dst, rejecting unknown fields so that
// typos in the driver surface as errors instead of being ignored.
func decodeStrict(line []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	return dec.Decode(dst)
}

func (b *bench) handle(line []byte) (resp map[string]any, exit bool) {
	var h header
	if err := json.Unmarshal(line, &h); err != nil {
		return map[string]any{"ok": false, "error": "bad request: " + err.Error()}, false
	}
	var err error
	resp = map[string]any{}
	switch h.Cmd {
	case "version":
		err = decodeStrict(line, &h)
		for k, v := range versionInfo() {
			resp[k] = v
		}
		resp["pid"] = os.Getpid()
		resp["socket"] = pluginapi.KubeletSocket
	case "start":
		err = b.cmdStart(line, resp)
	case "stop":
		if err = decodeStrict(line, &h); err == nil {
			resp["was_running"] = b.stopManager()
		}
	case "capacity":
		if err = decodeStrict(line, &h); err == nil {
			err = b.cmdCapacity(resp)
		}
	case "allocate":
		err = b.cmdAllocate(line, resp)
	case "options":
		err = b.cmdOptions(line, resp)
	case "devices":
		err = b.cmdDevices(line, resp)
	case "allocatable_devices":
		if err = decodeStrict(line, &h); err == nil {
			err = b.cmdAllocatableDevices(resp)
		}
	case "pods":
		if err = decodeStrict(line, &h); err == nil {
			resp["pods"] = b.podList()
		}
	case "set_active_pods":
		err = b.cmdSetActivePods(line, resp)
	case "remove_pod":
		err = b.cmdRemovePod(line, resp)
	case "set_sources_ready":
		err = b.cmdSetSourcesReady(line)
	case "wait":
		err = b.cmdWait(line, resp)
	case "metrics":
		if err = decodeStrict(line, &h); err == nil {
			err = cmdMetrics(resp)
		}
	case "rpc_load":
		err = cmdRPCLoad(line, resp)
	case "memstats":
		err = cmdMemstats(line, resp)
	case "exit":
		b.stopManager()
		exit = true
	case "":
		err = errors.New("missing \"cmd\"")
	default:
		err = fmt.Errorf("unknown cmd %q", h.Cmd)
	}
	if err != nil {
		resp = map[string]any{"ok": false, "error": err.Error()}
		// Keep the condition snapshot of a failed wait for the driver.
		if we, ok := err.(*waitError); ok {
			resp["elapsed_s"] = we.elapsed
			resp["capacity"] = we.capacity
			resp["allocatable"] = we.allocatable
		}
	} else {
		resp["ok"] = true
	}
	if len(h.ID) > 0 {
		resp["id"] = h.ID
	}
	return resp, exit
}

// ---- start / stop -------------------------------------------------------

type startReq struct {
	header
	ActivePods        []podSpec          `json:"active_pods"`
	SourcesReady      *bool              `json:"sources_ready"`
	RunningContainers []runningContainer `json:"running_containers"`
}

func (b *bench) cmdStart(line []byte, resp map[string]any) error {
	var req startReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	if b.running {
		return errors.New("manager already started; stop it first")
	}
	pods := map[string]*v1.Pod{}
	for _, ps := range req.ActivePods {
		pod, err := podFromSpec(ps)
		if err != nil {
			return err
		}
		pods[ps.UID] = pod
	}
	b.mu.Lock()
	b.pods = pods
	if req.SourcesReady != nil {
		b.sourcesReady = *req.SourcesReady
	} else {
		b.sourcesReady = true
	}
	b.mu.Unlock()

	// Every start is a fresh manager, as after a kubelet restart: the only
	// state carried over is the checkpoint file in the socket directory.
	mgr, err := newManager(b.logger)
	if err != nil {
		return fmt.Errorf("NewManagerImpl: %w", err)
	}
	cmap := containermap.NewContainerMap()
	runningSet := sets.New[string]()
	for i, rc := range req.RunningContainers {
		id := fmt.Sprintf("bench-container-%d", i)
		cmap.Add(rc.PodUID, rc.Container, id)
		runningSet.Insert(id)
	}
	_, statErr := os.Stat(filepath.Join(pluginapi.DevicePluginPath, checkpointName))
	if err := startManager(b.logger, mgr, b.activePods, sourcesReadyFlag{b}, cmap, runningSet); err != nil {
		return fmt.Errorf("Start: %w", err)
	}
	b.mu.Lock()
	b.mgr = mgr
	b.mu.Unlock()
	b.running = true
	b.removed = sets.New[string]()
	resp["socket"] = pluginapi.KubeletSocket
	resp["checkpoint_found"] = statErr == nil
	return nil
}

func (b *bench) stopManager() bool {
	if b.mgr == nil || !b.running {
		return false
	}
	if err := stopManager(b.logger, b.mgr); err != nil {
		b.logger.Error(err, "Stop failed")
	}
	b.running = false
	return true
}

// ---- capacity / wait ----------------------------------------------------

func (b *bench) manager() (*devicemanager.ManagerImpl, error) {
	if b.mgr == nil {
		return nil, errors.New("manager not started")
	}
	return b.mgr, nil
}

func toCounts(rl v1.ResourceList) map[string]int64 {
	out := make(map[string]int64, len(rl))
	for name, q := range rl {
		out[string(name)] = q.Value()
	}
	return out
}

// capacity calls GetCapacity like the kubelet's node status loop does. A
// resource GetCapacity reports as removed is reported once only upstream, so
// the bench keeps it until the next "capacity" response.
func (b *bench) capacity(mgr *devicemanager.ManagerImpl) (map[string]int64, map[string]int64) {
	capacity, allocatable, removed := getCapacity(b.logger, mgr)
	b.removed.Insert(removed...)
	return toCounts(capacity), toCounts(allocatable)
}

func (b *bench) cmdCapacity(resp map[string]any) error {
	mgr, err := b.manager()
	if err != nil {
		return err
	}
	c, a := b.capacity(mgr)
	resp["capacity"] = c
	resp["allocatable"] = a
	resp["removed"] = sets.List(b.removed)
	b.removed = sets.New[string]()
	return nil
}

type waitReq struct {
	header
	Resource    string   `json:"resource"`
	Capacity    *int64   `json:"capacity"`
	Allocatable *int64   `json:"allocatable"`
	Present     *bool    `json:"present"`
	TimeoutS    *float64 `json:"timeout_s"`
	IntervalS   *float64 `json:"interval_s"`
}

type waitError struct {
	msg         string
	elapsed     float64
	capacity    int64
	allocatable int64
}

func (e *waitError) Error() string { return e.msg }

func monotonicNs() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

func (b *bench) cmdWait(line []byte, resp map[string]any) error {
	begin := time.Now()
	var req waitReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	if req.Resource == "" {
		return errors.New("wait needs \"resource\"")
	}
	if req.Capacity == nil && req.Allocatable == nil && req.Present == nil {
		return errors.New("wait needs at least one of \"capacity\", \"allocatable\", \"present\"")
	}
	mgr, err := b.manager()
	if err != nil {
		return err
	}
	timeout := 10 * time.Second
	if req.TimeoutS != nil {
		timeout = time.Duration(*req.TimeoutS * float64(time.Second))
	}
	interval := time.Millisecond
	if req.IntervalS != nil {
		interval = time.Duration(*req.IntervalS * float64(time.Second))
	}
	for {
		c, a := b.capacity(mgr)
		capN, present := c[req.Resource]
		allocN := a[req.Resource]
		ok := (req.Capacity == nil || *req.Capacity == capN) &&
			(req.Allocatable == nil || *req.Allocatable == allocN) &&
			(req.Present == nil || *req.Present == present)
		elapsed := time.Since(begin)
		if ok {
			resp["elapsed_s"] = elapsed.Seconds()
			resp["done_monotonic_ns"] = monotonicNs()
			resp["capacity"] = capN
			resp["allocatable"] = allocN
			resp["present"] = present
			return nil
		}
		if elapsed >= timeout {
			return &waitError{
				msg: fmt.Sprintf("timeout after %.3fs waiting for %s (capacity=%d allocatable=%d present=%v)",
					elapsed.Seconds(), req.Resource, capN, allocN, present),
				elapsed: elapsed.Seconds(), capacity: capN, allocatable: allocN,
			}
		}
		time.Sleep(interval)
	}
}

// ---- pods ---------------------------------------------------------------

func quantityLimits(res map[string]int) v1.ResourceList {
	rl := v1.ResourceList{}
	for name, n := range res {
		rl[v1.ResourceName(name)] = *resource.NewQuantity(int64(n), resource.DecimalSI)
	}
	return rl
}

func newPod(uid, name, namespace string) *v1.Pod {
	if name == "" {
		name = "bench-" + uid
	}
	if namespace == "" {
		namespace = "default"
	}
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: name, Namespace: namespace}}
}

// setContainer adds or replaces a container of the pod spec.
func setContainer(pod *v1.Pod, name string, res map[string]int, init bool) *v1.Container {
	rl := quantityLimits(res)
	c := v1.Container{Name: name, Resources: v1.ResourceRequirements{Limits: rl, Requests: rl.DeepCopy()}}
	list := &pod.Spec.Containers
	if init {
		list = &pod.Spec.InitContainers
	}
	for i := range *list {
		if (*list)[i].Name == name {
			(*list)[i] = c
			return &(*list)[i]
		}
	}
	*list = append(*list, c)
	return &(*list)[len(*list)-1]
}

func findContainer(pod *v1.Pod, name string) *v1.Container {
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i]
		}
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	return nil
}

func podFromSpec(ps podSpec) (*v1.Pod, error) {
	if ps.UID == "" {
		return nil, errors.New("pod needs a uid")
	}
	pod := newPod(ps.UID, ps.Name, ps.Namespace)
	for _, name := range sortedKeys(ps.InitContainers) {
		setContainer(pod, name, ps.InitContainers[name], true)
	}
	for _, name := range sortedKeys(ps.Containers) {
		setContainer(pod, name, ps.Containers[name], false)
	}
	return pod, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func podToSpec(pod *v1.Pod) podSpec {
	ps := podSpec{UID: string(pod.UID), Name: pod.Name, Namespace: pod.Namespace}
	conv := func(cs []v1.Container) map[string]map[string]int {
		if len(cs) == 0 {
			return nil
		}
		out := map[string]map[string]int{}
		for _, c := range cs {
			r := map[string]int{}
			for name, q := range c.Resources.Limits {
				r[string(name)] = int(q.Value())
			}
			out[c.Name] = r
		}
		return out
	}
	ps.Containers = conv(pod.Spec.Containers)
	ps.InitContainers = conv(pod.Spec.InitContainers)
	return ps
}

func (b *bench) podList() []podSpec {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]podSpec, 0, len(b.pods))
	for _, uid := range sortedKeys(b.pods) {
		out = append(out, podToSpec(b.pods[uid]))
	}
	return out
}

type setActivePodsReq struct {
	header
	Pods []podSpec `json:"pods"`
}

func (b *bench) cmdSetActivePods(line []byte, resp map[string]any) error {
	var req setActivePodsReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	pods := map[string]*v1.Pod{}
	for _, ps := range req.Pods {
		b.mu.Lock()
		old := b.pods[ps.UID]
		b.mu.Unlock()
		// A bare UID keeps the containers the bench already knows for it.
		if old != nil && ps.Containers == nil && ps.InitContainers == nil {
			pods[ps.UID] = old
			continue
		}
		pod, err := podFromSpec(ps)
		if err != nil {
			return err
		}
		pods[ps.UID] = pod
	}
	b.mu.Lock()
	b.pods = pods
	b.mu.Unlock()
	return b.gc(resp)
}

type podReq struct {
	header
	PodUID string `json:"pod_uid"`
}

func (b *bench) cmdRemovePod(line []byte, resp map[string]any) error {
	var req podReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	b.mu.Lock()
	_, known := b.pods[req.PodUID]
	delete(b.pods, req.PodUID)
	b.mu.Unlock()
	resp["was_active"] = known
	return b.gc(resp)
}

// gc runs UpdateAllocatedDevices, which frees the devices of pods that are
// no longer active (only while sources are ready, as in the kubelet).
func (b *bench) gc(resp map[string]any) error {
	mgr, err := b.manager()
	if err != nil {
		return nil // nothing allocated in this process yet; the next start sees the new list
	}
	updateAllocatedDevices(b.logger, mgr)
	resp["gc"] = true
	return nil
}

type sourcesReadyReq struct {
	header
	Ready bool `json:"ready"`
}

func (b *bench) cmdSetSourcesReady(line []byte) error {
	var req sourcesReadyReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	b.mu.Lock()
	b.sourcesReady = req.Ready
	b.mu.Unlock()
	return nil
}

// ---- allocation ---------------------------------------------------------

type allocateReq struct {
	header
	PodUID    string         `json:"pod_uid"`
	PodName   string         `json:"pod_name"`
	Namespace string         `json:"namespace"`
	Container string         `json:"container"`
	Resources map[string]int `json:"resources"`
	Init      bool           `json:"init"`
	TimeoutS  *float64       `json:"timeout_s"`
}

func (b *bench) cmdAllocate(line []byte, resp map[string]any) error {
	var req allocateReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	if req.PodUID == "" || req.Container == "" {
		return errors.New("allocate needs \"pod_uid\" and \"container\"")
	}
	mgr, err := b.manager()
	if err != nil {
		return err
	}
	ctx := context.Background()
	if req.TimeoutS != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(*req.TimeoutS*float64(time.Second)))
		defer cancel()
	}
	ctx = klog.NewContext(ctx, b.logger)

	// As in the kubelet, the pod is in the active set while it is admitted
	// (it was added to the pod manager first); a rejected new pod leaves it.
	b.mu.Lock()
	pod, existed := b.pods[req.PodUID]
	var work *v1.Pod
	if existed {
		work = pod.DeepCopy()
	} else {
		work = newPod(req.PodUID, req.PodName, req.Namespace)
	}
	c := setContainer(work, req.Container, req.Resources, req.Init)
	b.pods[req.PodUID] = work
	b.mu.Unlock()

	begin := time.Now()
	if err := allocate(ctx, mgr, work, c); err != nil {
		b.mu.Lock()
		if existed {
			b.pods[req.PodUID] = pod
		} else {
			delete(b.pods, req.PodUID)
		}
		b.mu.Unlock()
		return err
	}
	resp["allocate_s"] = time.Since(begin).Seconds()
	return b.fillOptions(ctx, mgr, work, c, resp)
}

type containerReq struct {
	header
	PodUID    string `json:"pod_uid"`
	Container string `json:"container"`
}

// cmdOptions asks GetDeviceRunContainerOptions again for a known container
// (this is what the kubelet does on every container (re)start: it calls
// PreStartContainer when the plugin asked for it, and re-allocates if the
// manager has no record for an active pod).
func (b *bench) cmdOptions(line []byte, resp map[string]any) error {
	var req containerReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	mgr, err := b.manager()
	if err != nil {
		return err
	}
	b.mu.Lock()
	pod := b.pods[req.PodUID]
	b.mu.Unlock()
	if pod == nil {
		return fmt.Errorf("pod %q is not active in the bench", req.PodUID)
	}
	c := findContainer(pod, req.Container)
	if c == nil {
		return fmt.Errorf("pod %q has no container %q", req.PodUID, req.Container)
	}
	return b.fillOptions(klog.NewContext(context.Background(), b.logger), mgr, pod, c, resp)
}

func (b *bench) fillOptions(ctx context.Context, mgr *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container, resp map[string]any) error {
	opts, err := runContainerOptions(ctx, mgr, pod, c)
	if err != nil {
		return fmt.Errorf("GetDeviceRunContainerOptions: %w", err)
	}
	devices := []map[string]any{}
	mounts := []map[string]any{}
	envs := map[string]string{}
	annotations := map[string]string{}
	cdi := []string{}
	if opts != nil {
		for _, d := range opts.Devices {
			devices = append(devices, map[string]any{
				"container_path": d.PathInContainer, "host_path": d.PathOnHost, "permissions": d.Permissions,
			})
		}
		for _, m := range opts.Mounts {
			mounts = append(mounts, map[string]any{
				"container_path": m.ContainerPath, "host_path": m.HostPath, "read_only": m.ReadOnly,
			})
		}
		for _, e := range opts.Envs {
			envs[e.Name] = e.Value
		}
		for _, a := range opts.Annotations {
			annotations[a.Name] = a.Value
		}
		for _, d := range opts.CDIDevices {
			cdi = append(cdi, d.Name)
		}
	}
	resp["devices"] = devices
	resp["mounts"] = mounts
	resp["envs"] = envs
	resp["annotations"] = annotations
	resp["cdi_devices"] = cdi
	resp["device_ids"] = deviceIDs(mgr.GetDevices(string(pod.UID), c.Name))
	return nil
}

func deviceIDs(rdi devicemanager.ResourceDeviceInstances) map[string][]string {
	out := map[string][]string{}
	for res, devs := range rdi {
		ids := make([]string, 0, len(devs))
		for id := range devs {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		out[res] = ids
	}
	return out
}

func (b *bench) cmdDevices(line []byte, resp map[string]any) error {
	var req containerReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	mgr, err := b.manager()
	if err != nil {
		return err
	}
	resp["device_ids"] = deviceIDs(mgr.GetDevices(req.PodUID, req.Container))
	return nil
}

func (b *bench) cmdAllocatableDevices(resp map[string]any) error {
	mgr, err := b.manager()
	if err != nil {
		return err
	}
	resp["device_ids"] = deviceIDs(allocatableDevices(b.logger, mgr))
	return nil
}

// ---- metrics ------------------------------------------------------------

// cmdMetrics reports the kubelet's own device plugin metrics, per resource:
// registrations (kubelet_device_plugin_registration_total) and allocation
// RPC durations (kubelet_device_plugin_alloc_duration_seconds).
func cmdMetrics(resp map[string]any) error {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return err
	}
	registrations := map[string]float64{}
	allocs := map[string]map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			res := labelValue(m, "resource_name")
			switch f.GetName() {
			case "kubelet_device_plugin_registration_total":
				registrations[res] = m.GetCounter().GetValue()
			case "kubelet_device_plugin_alloc_duration_seconds":
				h := m.GetHistogram()
				allocs[res] = map[string]float64{"count": float64(h.GetSampleCount()), "sum": h.GetSampleSum()}
			}
		}
	}
	resp["registrations"] = registrations
	resp["alloc_duration"] = allocs
	return nil
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
