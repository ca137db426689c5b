package mongodb_test

import (
	"github.com/orderd/orderd/admin"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/outbox"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// The workers declare what they need of the storage; this adapter is what
// cmd/orderd gives them. A change on either side fails to compile here.
var (
	_ projector.Projection      = (*projection.Model[domain.Order])(nil)
	_ projector.DeadLetterStore = (*mongodb.DeadLetters)(nil)

	_ jobs.Store             = (*mongodb.Jobs)(nil)
	_ jobs.Pointers          = (*mongodb.Pointers)(nil)
	_ jobs.EventLog          = (*mongodb.EventStore)(nil)
	_ jobs.Projection        = (*projection.Model[domain.Order])(nil)
	_ jobs.DeadLetterCounter = (*mongodb.DeadLetters)(nil)
	_ projection.Scanner     = (*mongodb.EventStore)(nil)

	_ admin.ReadModel   = (*projection.Model[domain.Order])(nil)
	_ admin.DeadLetters = (*mongodb.DeadLetters)(nil)
	_ admin.Log         = (*mongodb.EventStore)(nil)
	_ admin.Relay       = (*mongodb.Lease)(nil)

	_ outbox.Log   = (*mongodb.EventStore)(nil)
	_ outbox.Lease = (*mongodb.Lease)(nil)
)
