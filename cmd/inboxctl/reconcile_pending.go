package main

import (
	"context"
	"errors"

	"github.com/inboxmq/inboxmq/inbox"
)

// reconcileOnce runs one reconciler pass. The inbox's Reconciler is not in
// this build yet: until it lands only --dry-run works.
func reconcileOnce(context.Context, *cli, *inbox.Store) error {
	return errors.New("reconcile: the inbox reconciler is not available in this build; use --dry-run")
}
