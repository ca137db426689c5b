package eventstore

import (
	"go.opentelemetry.io/otel"
)

// tracer records the event store's and the relay's spans through the
// global OpenTelemetry provider (a no-op unless the program installs one).
var tracer = otel.Tracer("github.com/orderd/orderd/eventstore")
