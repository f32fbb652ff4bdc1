package main

// valgrindRequest makes a valgrind client request (valgrind_amd64.s).
//
//go:noescape
func valgrindRequest(args *[6]uint64) uint64

// canCount reports whether this build can switch callgrind's counting on and off.
const canCount = true

// instrument switches callgrind's counting of instructions on or off, in every thread of the
// process (CALLGRIND_START_INSTRUMENTATION and _STOP_ of callgrind.h); outside valgrind it
// does nothing.
func instrument(on bool) {
	const start, stop = 0x43540004, 0x43540005 // VG_USERREQ_TOOL_BASE('C','T') + 4 and + 5
	args := [6]uint64{stop}
	if on {
		args[0] = start
	}
	valgrindRequest(&args)
}
