package main

import (
	"context"
	"errors"

	orderhttp "github.com/orderd/orderd/http"
)

// readyChecks returns what /readyz checks for roles r: the store for every
// role, and the bus too when a role needs it (roles.needsBus). A process
// with several roles checks the union; an api-only instance stays ready
// while NATS is down, since commands need only the store. Each of the
// relay, projector and jobs roles is a check too, named by the role,
// which fails while the role is failing (roleHealth: it keeps stopping
// and being restarted).
func readyChecks(r roles, store, bus orderhttp.Check, health *roleHealth) map[string]orderhttp.Check {
	checks := map[string]orderhttp.Check{"store": store}
	if r.needsBus() {
		checks["bus"] = bus
	}
	for role, on := range map[string]bool{"relay": r.relay, "projector": r.projector, "jobs": r.jobs} {
		if on {
			checks[role] = health.check(role)
		}
	}
	return checks
}

// busConnected is the readiness check of the bus: nil while the NATS
// connection is up. Only the roles that need the bus check it, and they
// do not start without a connection (connectBus).
func (m *Main) busConnected(context.Context) error {
	if !m.nc.IsConnected() {
		return errors.New("nats: not connected")
	}
	return nil
}
