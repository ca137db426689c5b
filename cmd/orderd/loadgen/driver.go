package loadgen

import (
	"context"
	"fmt"
	"log"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderd/orderd/domain"
)

// driver sends the orders of one Run. Its counters feed the progress line.
type driver struct {
	cfg   Config
	s     *sender
	width int         // digits of the order number
	log   *log.Logger // lines to cfg.Progress, after "loadgen: "; to io.Discard without it

	started, done, commands, acked, refused, unknown, retries, paused, races atomic.Int64
	raceWins, doubleWins                                                     atomic.Int64
}

// progress writes a progress line every second until the returned func
// is called.
func (d *driver) progress(start time.Time) (stop func()) {
	if d.cfg.Progress == nil {
		return func() {}
	}
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				d.log.Printf("%3.0fs  orders %d/%d (%d done)  commands %d  acked %d  refused %d  races %d  unknown %d  retries %d (paused %d)",
					time.Since(start).Seconds(), d.started.Load(), d.cfg.Orders, d.done.Load(), d.commands.Load(),
					d.acked.Load(), d.refused.Load(), d.races.Load(), d.unknown.Load(), d.retries.Load(), d.paused.Load())
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// orderResult is what driving one order did, beyond the driver's
// counters.
type orderResult struct {
	refused             map[string]int
	acks                []Ack
	unexpected, unknown []string
}

// order is the state of an order as its last acknowledged answer has it.
type order struct {
	id      string
	version int64
	status  domain.Status
}

// drive places order n and walks it to a terminal status, or until a
// command is refused or its outcome unknown, or ctx ends.
func (d *driver) drive(ctx context.Context, n int) *orderResult {
	rng := mrand.New(mrand.NewPCG(uint64(d.cfg.Seed), uint64(n)))
	r := &orderResult{refused: map[string]int{}}
	o := &order{id: fmt.Sprintf("%s-%0*d", d.cfg.RunID, d.width, n)}
	place := step{cmd: d.placeOrder(rng)}
	if !d.single(ctx, rng, r, o, place, stepRequest(o, place, "")) {
		return r
	}
	for {
		steps := legal(o.status)
		if len(steps) == 0 || ctx.Err() != nil {
			return r
		}
		var goOn bool
		if rng.Float64() < d.cfg.ConflictRate {
			goOn = d.race(ctx, rng, r, o, steps)
		} else {
			s := draw(rng, steps)
			goOn = d.single(ctx, rng, r, o, s, stepRequest(o, s, ""))
		}
		if !goOn {
			return r
		}
	}
}

// placeOrder draws the customer and 1 to 3 lines of an order; amounts are
// BRL cents.
func (d *driver) placeOrder(rng *mrand.Rand) domain.PlaceOrder {
	p := domain.PlaceOrder{CustomerID: fmt.Sprintf("lg-cust-%d", 1+rng.IntN(d.cfg.Customers)),
		Currency: "BRL", FreightCents: int64(rng.IntN(3001))}
	for i := range 1 + rng.IntN(3) {
		p.Items = append(p.Items, domain.Line{SKU: fmt.Sprintf("lg-sku-%d-%d", i+1, 1+rng.IntN(50)),
			Quantity: int64(1 + rng.IntN(5)), UnitPriceCents: int64(100 + rng.IntN(50000))})
	}
	return p
}

// stepRequest is the request of step s on order o; side is "" outside a
// race, else "a" or "b", and then the request carries If-Match o's version.
func stepRequest(o *order, s step, side string) request {
	r := request{orderID: o.id, cmd: s.cmd, key: o.id + "-" + s.name()}
	if side != "" {
		r.key += "-" + side
		r.ifMatch = &domain.IfMatch{Versions: []int64{o.version}}
	}
	return r
}

// urlPair draws the indexes of two different URLs, or of the only one
// twice.
func (d *driver) urlPair(rng *mrand.Rand) (int, int) {
	n := len(d.cfg.URLs)
	i := rng.IntN(n)
	if n == 1 {
		return i, i
	}
	return i, (i + 1 + rng.IntN(n-1)) % n
}

// count adds one sent command's answer to the counters of d, and its
// refusal to r's.
func (d *driver) count(r *orderResult, a answer) {
	d.commands.Add(1)
	d.retries.Add(int64(a.attempts - 1))
	d.paused.Add(int64(a.paused))
	switch a.outcome {
	case acked:
		d.acked.Add(1)
	case refused:
		d.refused.Add(1)
		r.refused[a.reason]++
	case unknown:
		d.unknown.Add(1)
	}
}

// ack records an acknowledged command.
func (r *orderResult) ack(o *order, name string, req request, a answer) {
	r.acks = append(r.acks, Ack{OrderID: o.id, Command: name, Key: req.key, Version: a.version, Status: a.status})
}

// follow checks an acknowledged answer of step s against o's last state
// and the status the domain's table says s leads to, then moves o to the
// answer's state.
func (r *orderResult) follow(o *order, s step, a answer) {
	to, _ := domain.Next(o.status, s.cmd)
	switch {
	case a.malformedAnswer:
		r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s: acknowledged with a body that is not a command answer: %s", o.id, s.name(), a.detail))
	case a.version != o.version+1:
		r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s: acknowledged with version %d after version %d, want %d", o.id, s.name(), a.version, o.version, o.version+1))
	case domain.Status(a.status) != to:
		r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s: acknowledged with status %q, want %q", o.id, s.name(), a.status, to))
	}
	o.version, o.status = a.version, domain.Status(a.status)
}

// single sends one command on its own and reports whether the order goes
// on: only after an acknowledgement.
func (d *driver) single(ctx context.Context, rng *mrand.Rand, r *orderResult, o *order, s step, req request) bool {
	a := d.s.send(ctx, rng.IntN(len(d.cfg.URLs)), req) // to a URL drawn at random
	if a.attempts == 0 {
		return false // ctx ended before it was sent: nothing to count
	}
	d.count(r, a)
	switch a.outcome {
	case acked:
		r.ack(o, s.name(), req, a)
		r.follow(o, s, a)
		return true
	case refused:
		r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s: %d %s: %s", o.id, s.name(), a.code, a.reason, a.detail))
	default:
		r.unknown = append(r.unknown, req.key)
		d.log.Printf("order %s: %s: outcome unknown (key %s): %s", o.id, s.name(), req.key, a.detail)
	}
	return false
}

// race sends two commands legal in o's status at once, both with If-Match
// o's version, and reports whether the order goes on: only when exactly
// one side was acknowledged and the other refused.
func (d *driver) race(ctx context.Context, rng *mrand.Rand, r *orderResult, o *order, steps []step) bool {
	sa, sb := drawPair(rng, steps)
	ua, ub := d.urlPair(rng)
	sides := [2]struct {
		s   step
		req request
		a   answer
	}{
		{s: sa, req: stepRequest(o, sa, "a")},
		{s: sb, req: stepRequest(o, sb, "b")},
	}
	var wg sync.WaitGroup
	wg.Go(func() { sides[0].a = d.s.send(ctx, ua, sides[0].req) })
	wg.Go(func() { sides[1].a = d.s.send(ctx, ub, sides[1].req) })
	wg.Wait()
	// When ctx ended before a side was sent there is no race, but a side
	// that was sent still counts.
	raced := sides[0].a.attempts > 0 && sides[1].a.attempts > 0
	var won []int
	unknowns := 0
	for i, x := range sides {
		if x.a.attempts == 0 {
			continue
		}
		d.count(r, x.a)
		switch x.a.outcome {
		case acked:
			r.ack(o, x.s.name(), x.req, x.a)
			won = append(won, i)
		case refused:
			if raced && x.a.code != 409 && x.a.code != 412 {
				r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s (race at version %d): %d %s: %s", o.id, x.s.name(), o.version, x.a.code, x.a.reason, x.a.detail))
			}
		default:
			unknowns++
			r.unknown = append(r.unknown, x.req.key)
			if raced {
				d.log.Printf("order %s: %s (race at version %d): outcome unknown (key %s): %s", o.id, x.s.name(), o.version, x.req.key, x.a.detail)
			}
		}
	}
	if !raced {
		return false
	}
	d.races.Add(1)
	what := fmt.Sprintf("race %s/%s at version %d", sa.name(), sb.name(), o.version)
	switch len(won) {
	case 2:
		d.doubleWins.Add(1)
		d.log.Printf("order %s: %s: DOUBLE WIN: %s v%d %s and %s v%d %s", o.id, what,
			sa.name(), sides[0].a.version, sides[0].a.status, sb.name(), sides[1].a.version, sides[1].a.status)
		return false
	case 1:
		d.raceWins.Add(1)
		w := sides[won[0]]
		r.follow(o, w.s, w.a)
		return unknowns == 0
	}
	if unknowns == 0 {
		r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s: neither side acknowledged: %d %s, %d %s",
			o.id, what, sides[0].a.code, sides[0].a.reason, sides[1].a.code, sides[1].a.reason))
	}
	return false
}
