package consumer

import "errors"

// ErrStopped is the cause with which handler contexts are cancelled when the
// consumer stops and SoftStopTimeout has run out. Work interrupted by it is
// requeued and its attempt is not counted.
var ErrStopped = errors.New("consumer: stopped")

// ErrNotStarted is returned by calls that need a started consumer.
var ErrNotStarted = errors.New("consumer: not started")
