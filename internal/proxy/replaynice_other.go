//go:build !linux

package proxy

import "errors"

// lowerThreadPriority is Linux's alone: elsewhere a process's threads
// share its priority, and the replay runs at kproxy's.
func lowerThreadPriority(int) error {
	return errors.New("a thread's own priority is Linux's alone")
}
