package olist

import (
	"cmp"
	"hash/fnv"
	"slices"
	"time"

	"github.com/orderd/orderd/domain"
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

// IdempotencyKey is the Idempotency-Key header of cmd for the order:
// "olist-<order id>-<command name>".
func IdempotencyKey(orderID string, cmd domain.Command) string {
	return "olist-" + orderID + "-" + domain.CommandName(cmd)
}

// Plan is what the tool sends for one order and what it expects back.
// Commands run in order; the place command carries amounts in BRL cents,
// freight on each line as the data has it (no order-level freight), and a
// zero At means the request has no "at" (the service stamps its receive
// time). Odd lists the order's odd paths (sorted); Refused the documented
// refusals as rejection reasons ("ship: invalid-transition"); Want the
// final status after them.
type Plan struct {
	Order    Order
	Commands []domain.Command
	Odd      []string
	Refused  []string
	Want     domain.Status
}

// Plan builds the plan of o as the package doc describes.
func (d *Dataset) Plan(o Order) Plan {
	p := Plan{Order: o, Want: o.Status}
	add := func(cmd domain.Command) { p.Commands = append(p.Commands, cmd) }
	approval := cmp.Or(o.ApprovedAt, o.PurchasedAt)
	add(d.placeOrder(o))
	if !o.ApprovedAt.IsZero() {
		add(domain.Approve{At: o.ApprovedAt})
	}
	switch o.Status {
	case domain.StatusInvoiced:
		add(domain.Invoice{At: approval})
	case domain.StatusProcessing:
		add(domain.StartProcessing{At: approval})
	}
	if !o.CarrierAt.IsZero() {
		add(domain.Ship{At: o.CarrierAt})
	}
	if !o.DeliveredAt.IsZero() || o.Status == domain.StatusDelivered {
		add(domain.Deliver{At: o.DeliveredAt})
	}
	switch o.Status {
	case domain.StatusCanceled:
		last := o.PurchasedAt
		for _, t := range []time.Time{o.ApprovedAt, o.CarrierAt, o.DeliveredAt} {
			if t.After(last) {
				last = t
			}
		}
		add(domain.Cancel{At: last, Reason: "olist: canceled"})
	case domain.StatusUnavailable:
		add(domain.MarkUnavailable{At: approval, Reason: "olist: unavailable"})
	}

	canceled := o.Status == domain.StatusCanceled
	if o.ApprovedAt.IsZero() {
		for _, c := range p.Commands {
			switch c.(type) {
			case domain.Invoice, domain.StartProcessing, domain.Ship, domain.Deliver:
				p.Refused = append(p.Refused, refusal(c))
			}
		}
		if len(p.Refused) > 0 {
			p.Odd = append(p.Odd, OddApprovalMissing)
			switch p.Commands[len(p.Commands)-1].(type) {
			case domain.Cancel, domain.MarkUnavailable: // legal from created
			default:
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
			p.Refused = append(p.Refused, refusal(domain.Cancel{}))
			p.Want = domain.StatusDelivered
		}
	}
	if o.Status == domain.StatusDelivered && o.DeliveredAt.IsZero() {
		p.Odd = append(p.Odd, OddDeliveredWithoutDate)
	}
	return p
}

// refusal is the rejection reason of cmd refused by the lifecycle.
func refusal(cmd domain.Command) string { return domain.CommandName(cmd) + ": invalid-transition" }

// placeOrder builds the place command: the order's item rows grouped by
// (product, price) in order_item_id order, each line's freight the sum of
// its rows' freight_value, or the one line ChooseLine picks.
func (d *Dataset) placeOrder(o Order) domain.PlaceOrder {
	r := domain.PlaceOrder{CustomerID: o.CustomerID, Currency: Currency, At: o.PurchasedAt}
	rows := d.byOrder[o.ID]
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
