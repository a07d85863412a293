package main

// memstats: the Go runtime's view of this process's memory, so that the
// kubelet side's cost of a plugin's devices can be told apart from the
// process's resident set (which also holds freed heap the runtime keeps).
//
//	{"cmd": "memstats", "gc": true}
//
// answers heap_alloc (live heap bytes; after a GC when "gc" is set),
// heap_inuse, heap_sys, heap_objects, stack_inuse, sys (everything the
// runtime got from the OS), num_gc, goroutines, vm_rss (VmRSS of
// /proc/self/status, bytes) and cpu_s (user + system CPU of the process from
// getrusage, microsecond resolution where /proc/<pid>/stat counts 10 ms ticks).

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

type memstatsReq struct {
	header
	GC bool `json:"gc"`
}

func cmdMemstats(line []byte, resp map[string]any) error {
	var req memstatsReq
	if err := decodeStrict(line, &req); err != nil {
		return err
	}
	if req.GC {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	resp["heap_alloc"] = m.HeapAlloc
	resp["heap_inuse"] = m.HeapInuse
	resp["heap_sys"] = m.HeapSys
	resp["heap_objects"] = m.HeapObjects
	resp["stack_inuse"] = m.StackInuse
	resp["sys"] = m.Sys
	resp["num_gc"] = m.NumGC
	resp["goroutines"] = runtime.NumGoroutine()
	resp["vm_rss"] = vmRSS()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		resp["cpu_s"] = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	return nil
}

// vmRSS is the VmRSS line of /proc/self/status in bytes (0 if unreadable).
func vmRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb * 1024
		}
	}
	return 0
}
