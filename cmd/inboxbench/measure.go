package main

import (
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sample is a process-wide snapshot of CPU time and allocations.
type sample struct {
	at      time.Time
	cpu     time.Duration
	mallocs uint64
}

func snapshot() sample {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return sample{at: time.Now(), cpu: cpu, mallocs: ms.Mallocs}
}

// rssMiB reads the resident set size of this process.
func rssMiB() float64 {
	return procStatusKiB("VmRSS:") / 1024
}

// peakRSSMiB reads the peak resident set size of this process.
func peakRSSMiB() float64 {
	return procStatusKiB("VmHWM:") / 1024
}

func procStatusKiB(field string) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field) {
			f := strings.Fields(line)
			if len(f) >= 2 {
				v, _ := strconv.ParseFloat(f[1], 64)
				return v
			}
		}
	}
	return 0
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}
