package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"
)

// span measures the timed part of one contender's run: its elapsed time, the CPU time this
// process spent, and the allocations it made (every goroutine of the process: the client's
// background work is its cost too). With -profile, the first round of every contender also
// writes a CPU profile over the same part, and the second a pair of allocation profiles that
// record every allocation (which would skew a CPU profile of the same round).
type span struct {
	start   time.Time
	cpu     time.Duration
	mallocs uint64
	bytes   uint64
	profile profile
}

// profile says which profile a span writes, and where.
type profile struct {
	path   string // without the suffix; empty: none
	allocs bool   // the allocation profiles, not the CPU profile
}

// measured is what the last span that stopped measured, read by compare.
var measured struct {
	cpu            time.Duration
	mallocs, bytes uint64
}

// profileAs is the profile the next span writes, set by compare for the first two rounds of
// every contender when -profile is given.
var profileAs profile

// startSpan starts measuring.
func startSpan() *span {
	w := &span{profile: profileAs}
	profileAs = profile{}
	switch {
	case w.profile.path == "":
	case w.profile.allocs:
		runtime.MemProfileRate = 1
		writeAllocs(w.profile.path + ".allocs-base.pprof")
	default:
		f, err := os.Create(w.profile.path + ".cpu.pprof")
		must(err)
		must(pprof.StartCPUProfile(f))
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	w.mallocs, w.bytes = ms.Mallocs, ms.TotalAlloc
	w.cpu = processCPU()
	w.start = time.Now()
	if *cpuChild != "" {
		// Under bench -cpu's callgrind the span is what is counted. It starts on a collected
		// heap, so that the garbage collector's cycles in it come after as many allocations in
		// every run, not where the previous cycle left off.
		runtime.GC()
		instrument(true)
	}
	return w
}

// stop ends the span, records its figures in measured and returns the elapsed time.
func (w *span) stop() time.Duration {
	instrument(false)
	elapsed := time.Since(w.start)
	measured.cpu = processCPU() - w.cpu
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	measured.mallocs, measured.bytes = ms.Mallocs-w.mallocs, ms.TotalAlloc-w.bytes
	switch {
	case w.profile.path == "":
	case w.profile.allocs:
		writeAllocs(w.profile.path + ".allocs.pprof")
		runtime.MemProfileRate = defaultMemProfileRate
	default:
		pprof.StopCPUProfile()
	}
	return elapsed
}

// defaultMemProfileRate is the runtime's rate, restored after an allocation profile.
var defaultMemProfileRate = runtime.MemProfileRate

// writeAllocs writes the process's allocation profile (cumulative since the start: read one
// span's with `go tool pprof -diff_base NAME.allocs-base.pprof NAME.allocs.pprof`).
func writeAllocs(path string) {
	f, err := os.Create(path)
	must(err)
	defer f.Close()
	must(pprof.Lookup("allocs").WriteTo(f, 0))
}

// profilePath is where the profiles of contender name of section go under -profile.
func profilePath(section, name string) string {
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, name)
	return filepath.Join(*profileDir, fmt.Sprintf("%s.%s", section, clean))
}
