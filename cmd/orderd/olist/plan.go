package olist

import (
	"cmp"
	"hash/fnv"
	"slices"
	"time"

	"github.com/orderd/orderd/domain"
)

// Command names: the last path segment of POST /v1/orders/{id}/{name}
// ("place" is POST /v1/orders).
const (
	CmdPlace           = "place"
	CmdApprove         = "approve"
	CmdInvoice         = "invoice"
	CmdProcess         = "process"
	CmdShip            = "ship"
	CmdDeliver         = "deliver"
	CmdCancel          = "cancel"
	CmdMarkUnavailable = "mark-unavailable"
)

// Odd paths of the data (package doc).
const (
	OddApprovalMissing       = "approval-missing"
	OddCanceledAfterCarrier  = "canceled-after-carrier"
	OddCanceledAfterDelivery = "canceled-after-delivery"
	OddDeliveredWithoutDate  = "delivered-without-date"
)

// OddPaths lists the odd-path names, sorted.
var OddPaths = []string{OddApprovalMissing, OddCanceledAfterCarrier, OddCanceledAfterDelivery, OddDeliveredWithoutDate}

// Currency is the currency of every Olist order.
const Currency = "BRL"

// Command is one command of a plan. Name is one of the Cmd constants. At is
// the business time (UTC); zero means the request has no "at" and the
// service stamps its receive time. Reason is set for cancel and
// mark-unavailable, Place for place only: amounts in BRL cents, freight on
// each line as the data has it (no order-level freight).
type Command struct {
	Name   string
	At     time.Time
	Reason string
	Place  *domain.PlaceOrder
}

// IdempotencyKey is the Idempotency-Key header of c for the order:
// "olist-<order id>-<command>".
func (c Command) IdempotencyKey(orderID string) string { return "olist-" + orderID + "-" + c.Name }

// Domain is the domain command of c: the one the service runs when it
// gets c's request.
func (c Command) Domain() domain.Command {
	switch c.Name {
	case CmdPlace:
		return *c.Place
	case CmdApprove:
		return domain.Approve{At: c.At}
	case CmdInvoice:
		return domain.Invoice{At: c.At}
	case CmdProcess:
		return domain.StartProcessing{At: c.At}
	case CmdShip:
		return domain.Ship{At: c.At}
	case CmdDeliver:
		return domain.Deliver{At: c.At}
	case CmdCancel:
		return domain.Cancel{At: c.At, Reason: c.Reason}
	case CmdMarkUnavailable:
		return domain.MarkUnavailable{At: c.At, Reason: c.Reason}
	}
	panic("olist: unknown plan command " + c.Name)
}

// Plan is what the tool sends for one order and what it expects back.
// Odd lists the order's odd paths (sorted); Refused the documented
// refusals as rejection reasons ("ship: invalid-transition"); Want the
// final status after them.
type Plan struct {
	Order    Order
	Commands []Command
	Odd      []string
	Refused  []string
	Want     domain.Status
}

// Plan builds the plan of o as the package doc describes.
func (d *Dataset) Plan(o Order) Plan {
	p := Plan{Order: o, Want: o.Status}
	add := func(name string, at time.Time, reason string) {
		p.Commands = append(p.Commands, Command{Name: name, At: at, Reason: reason})
	}
	approval := cmp.Or(o.ApprovedAt, o.PurchasedAt)
	p.Commands = append(p.Commands, Command{Name: CmdPlace, At: o.PurchasedAt, Place: d.placeOrder(o)})
	if !o.ApprovedAt.IsZero() {
		add(CmdApprove, o.ApprovedAt, "")
	}
	switch o.Status {
	case domain.StatusInvoiced:
		add(CmdInvoice, approval, "")
	case domain.StatusProcessing:
		add(CmdProcess, approval, "")
	}
	if !o.CarrierAt.IsZero() {
		add(CmdShip, o.CarrierAt, "")
	}
	if !o.DeliveredAt.IsZero() || o.Status == domain.StatusDelivered {
		add(CmdDeliver, o.DeliveredAt, "")
	}
	switch o.Status {
	case domain.StatusCanceled:
		last := o.PurchasedAt
		for _, t := range []time.Time{o.ApprovedAt, o.CarrierAt, o.DeliveredAt} {
			if t.After(last) {
				last = t
			}
		}
		add(CmdCancel, last, "olist: canceled")
	case domain.StatusUnavailable:
		add(CmdMarkUnavailable, approval, "olist: unavailable")
	}

	canceled := o.Status == domain.StatusCanceled
	if o.ApprovedAt.IsZero() {
		for _, c := range p.Commands {
			if c.Name == CmdInvoice || c.Name == CmdProcess || c.Name == CmdShip || c.Name == CmdDeliver {
				p.Refused = append(p.Refused, c.Name+": invalid-transition")
			}
		}
		if len(p.Refused) > 0 {
			p.Odd = append(p.Odd, OddApprovalMissing)
			if last := p.Commands[len(p.Commands)-1].Name; last != CmdCancel && last != CmdMarkUnavailable {
				p.Want = domain.StatusCreated
			}
		}
	}
	if canceled && !o.CarrierAt.IsZero() && o.DeliveredAt.IsZero() {
		p.Odd = append(p.Odd, OddCanceledAfterCarrier)
	}
	if canceled && !o.DeliveredAt.IsZero() {
		p.Odd = append(p.Odd, OddCanceledAfterDelivery)
		if !slices.Contains(p.Odd, OddApprovalMissing) { // else never delivered: the cancel is legal
			p.Refused = append(p.Refused, CmdCancel+": invalid-transition")
			p.Want = domain.StatusDelivered
		}
	}
	if o.Status == domain.StatusDelivered && o.DeliveredAt.IsZero() {
		p.Odd = append(p.Odd, OddDeliveredWithoutDate)
	}
	return p
}

// placeOrder builds the place command: the order's item rows grouped by
// (product, price) in order_item_id order, each line's freight the sum of
// its rows' freight_value, or the one line ChooseLine picks.
func (d *Dataset) placeOrder(o Order) *domain.PlaceOrder {
	r := &domain.PlaceOrder{CustomerID: o.CustomerID, Currency: Currency, At: o.PurchasedAt}
	rows := d.ItemsOf(o.ID)
	if len(rows) == 0 {
		rows = []Item{ChooseLine(o.ID, d.Items)}
	}
	for _, it := range rows {
		i := slices.IndexFunc(r.Items, func(l domain.Line) bool {
			return l.SKU == it.ProductID && l.UnitPriceCents == it.PriceCents
		})
		if i < 0 {
			r.Items = append(r.Items, domain.Line{SKU: it.ProductID, UnitPriceCents: it.PriceCents})
			i = len(r.Items) - 1
		}
		r.Items[i].Quantity++
		r.Items[i].FreightCents += it.FreightCents
	}
	return r
}

// ChooseLine returns the item row used for an order without item rows:
// rows[FNV-1a-64(orderID) mod len(rows)]. rows must not be empty.
func ChooseLine(orderID string, rows []Item) Item {
	h := fnv.New64a()
	h.Write([]byte(orderID))
	return rows[h.Sum64()%uint64(len(rows))]
}
