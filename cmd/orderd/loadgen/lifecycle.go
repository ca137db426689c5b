package loadgen

import (
	"math/rand/v2"
	"slices"

	"github.com/orderd/orderd/domain"
)

// cancelReason is the reason sent with every cancel.
const cancelReason = "loadgen"

// step is a command and its weight when drawn.
type step struct {
	cmd    domain.Command
	weight int
}

// lifecycle lists the commands the generator sends after the place: the
// happy path is likelier than a cancel.
var lifecycle = []step{
	{domain.Approve{}, 10},
	{domain.Invoice{}, 5},
	{domain.StartProcessing{}, 5},
	{domain.Ship{}, 5},
	{domain.Deliver{}, 10},
	{domain.Cancel{Reason: cancelReason}, 1},
}

// name is the step's command name ("place", "approve", ...), as acks and
// idempotency keys carry it.
func (s step) name() string { return domain.CommandName(s.cmd) }

// legal returns the steps of lifecycle that the domain's table allows in
// status s (none for a terminal status).
func legal(s domain.Status) []step {
	return slices.DeleteFunc(slices.Clone(lifecycle), func(st step) bool {
		_, ok := domain.Next(s, st.cmd)
		return !ok
	})
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
