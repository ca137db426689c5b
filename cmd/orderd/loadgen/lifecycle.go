package loadgen

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/orderd/orderd/domain"
)

// cancelReason is the reason sent with every cancel.
const cancelReason = "loadgen"

// lifecycleCommands are the commands the generator sends after the place,
// with their weight when drawn: the happy path is likelier than a cancel.
var lifecycleCommands = []struct {
	cmd    domain.Command
	weight int
}{
	{domain.Approve{}, 10},
	{domain.Invoice{}, 5},
	{domain.StartProcessing{}, 5},
	{domain.Ship{}, 5},
	{domain.Deliver{}, 10},
	{domain.Cancel{Reason: cancelReason}, 1},
}

// step is a command legal in some status: the command, the status it
// leads to and its weight.
type step struct {
	cmd    domain.Command
	to     domain.Status
	weight int
}

// name is the step's command name ("place", "approve", ...), as acks and
// idempotency keys carry it.
func (s step) name() string { return domain.CommandName(s.cmd) }

// legal maps every status to the steps legal in it (none for a terminal
// status). It is asked of the domain, so it cannot drift from it.
var legal = legalSteps()

// legalSteps decides every command of lifecycleCommands on an order in
// every status and keeps those the domain accepts, with the status the
// resulting event leads to.
func legalSteps() map[domain.Status][]step {
	now := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	m := make(map[domain.Status][]step, len(domain.Statuses))
	for _, s := range domain.Statuses {
		o := domain.Order{ID: "x", Status: s, Version: 1}
		for _, c := range lifecycleCommands {
			d, at, err := o.Decide(c.cmd, now)
			if err != nil {
				continue
			}
			next := o
			e := domain.Event{StreamID: o.ID, Type: d.EventType(), Version: o.Version + 1, OccurredAt: at, Data: d}
			if err := next.Apply(e); err != nil {
				panic(fmt.Sprintf("loadgen: the domain accepts %s in %s but cannot apply it: %v", domain.CommandName(c.cmd), s, err))
			}
			m[s] = append(m[s], step{cmd: c.cmd, to: next.Status, weight: c.weight})
		}
	}
	return m
}

// draw picks one of steps at random, by weight; steps must not be empty.
func draw(rng *rand.Rand, steps []step) step {
	total := 0
	for _, s := range steps {
		total += s.weight
	}
	n := rng.IntN(total)
	for _, s := range steps {
		if n < s.weight {
			return s
		}
		n -= s.weight
	}
	return steps[len(steps)-1]
}

// drawPair picks the two sides of a race: one by weight, the other
// uniformly among the rest, or the same step twice when only one is legal.
func drawPair(rng *rand.Rand, steps []step) (a, b step) {
	a = draw(rng, steps)
	if len(steps) == 1 {
		return a, a
	}
	others := slices.DeleteFunc(slices.Clone(steps), func(s step) bool { return s.name() == a.name() })
	return a, others[rng.IntN(len(others))]
}
