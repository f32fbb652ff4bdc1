//go:build !amd64

package main

// canCount reports whether this build can switch callgrind's counting on and off: only the
// amd64 build speaks valgrind's client requests.
const canCount = false

func instrument(bool) {}
