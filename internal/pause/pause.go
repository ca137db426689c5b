// Package pause waits out a backoff or a polling interval in the service's
// background loops without outliving their context.
package pause

import (
	"context"
	"time"
)

// For waits for d, or until ctx is done, whichever comes first. A d of 0
// or less does not wait.
func For(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
