package proxy

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// lowerThreadPriority locks the calling goroutine to its OS thread and
// gives that thread the nice value nice (Linux schedules threads, and a
// thread's nice value is its own). The goroutine must end without
// unlocking: Go then ends the thread, so no other goroutine ever runs at
// the lowered priority (an unprivileged process cannot raise it again).
func lowerThreadPriority(nice int) error {
	runtime.LockOSThread()
	return unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), nice)
}
