package domain

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"time"
)

// Status is an order's lifecycle state.
type Status string

// The statuses of the Olist lifecycle. Delivered, Canceled and Unavailable
// are terminal.
const (
	StatusCreated     Status = "created"
	StatusApproved    Status = "approved"
	StatusInvoiced    Status = "invoiced"
	StatusProcessing  Status = "processing"
	StatusShipped     Status = "shipped"
	StatusDelivered   Status = "delivered"
	StatusCanceled    Status = "canceled"
	StatusUnavailable Status = "unavailable"
)

// Statuses lists every status in lifecycle order.
var Statuses = []Status{StatusCreated, StatusApproved, StatusInvoiced, StatusProcessing,
	StatusShipped, StatusDelivered, StatusCanceled, StatusUnavailable}

// ValidStatus reports whether s is one of Statuses.
func ValidStatus(s string) bool { return slices.Contains(Statuses, Status(s)) }

// transitions is the table of the package doc and the one list of the
// event types: for each, its payload type (a name not here is an unknown
// event type), the name of the command that appends it, the statuses it
// may follow ("" for a new stream) and the status it leads to.
var transitions = map[string]struct {
	payload EventData
	command string
	from    []Status
	to      Status
}{
	TypeOrderPlaced:            {OrderPlaced{}, "place", []Status{""}, StatusCreated},
	TypeOrderApproved:          {OrderApproved{}, "approve", []Status{StatusCreated}, StatusApproved},
	TypeOrderInvoiced:          {OrderInvoiced{}, "invoice", []Status{StatusApproved}, StatusInvoiced},
	TypeOrderProcessingStarted: {OrderProcessingStarted{}, "process", []Status{StatusApproved, StatusInvoiced}, StatusProcessing},
	TypeOrderShipped:           {OrderShipped{}, "ship", []Status{StatusApproved, StatusInvoiced, StatusProcessing}, StatusShipped},
	TypeOrderDelivered:         {OrderDelivered{}, "deliver", []Status{StatusShipped}, StatusDelivered},
	TypeOrderCanceled:          {OrderCanceled{}, "cancel", []Status{StatusCreated, StatusApproved, StatusInvoiced, StatusProcessing, StatusShipped}, StatusCanceled},
	TypeOrderMarkedUnavailable: {OrderMarkedUnavailable{}, "mark-unavailable", []Status{StatusCreated, StatusApproved, StatusInvoiced, StatusProcessing}, StatusUnavailable},
}

// Order is the order aggregate's state, folded from its events. Amounts are
// minor units of Currency; SubtotalCents is the sum of quantity times unit
// price, FreightCents the order-level freight plus every line's freight,
// TotalCents their sum. A zero Version means the order does not exist. The step timestamps are the OccurredAt of the event that set
// them; nil when the step did not happen. RecordedAt is the RecordedAt of
// the last event applied (when the store committed it); zero for a
// read-model document written before the field existed.
type Order struct {
	ID            string     `json:"order_id"`
	CustomerID    string     `json:"customer_id"`
	Status        Status     `json:"status"`
	Currency      string     `json:"currency"`
	Items         []Line     `json:"items"`
	ItemCount     int64      `json:"item_count"`
	SubtotalCents int64      `json:"subtotal_cents"`
	FreightCents  int64      `json:"freight_cents"`
	TotalCents    int64      `json:"total_cents"`
	PlacedAt      *time.Time `json:"placed_at,omitempty"`
	ApprovedAt    *time.Time `json:"approved_at,omitempty"`
	InvoicedAt    *time.Time `json:"invoiced_at,omitempty"`
	ProcessingAt  *time.Time `json:"processing_at,omitempty"`
	ShippedAt     *time.Time `json:"shipped_at,omitempty"`
	DeliveredAt   *time.Time `json:"delivered_at,omitempty"`
	CanceledAt    *time.Time `json:"canceled_at,omitempty"`
	UnavailableAt *time.Time `json:"unavailable_at,omitempty"`
	Reason        string     `json:"reason,omitempty"`
	Version       int64      `json:"version"`
	UpdatedAt     time.Time  `json:"updated_at"`
	RecordedAt    time.Time  `json:"recorded_at,omitzero"`
}

// Fold folds events, in version order, into a new Order.
func Fold(events []Event) (Order, error) {
	var o Order
	for _, e := range events {
		if err := o.Apply(e); err != nil {
			return Order{}, err
		}
	}
	return o, nil
}

// Apply folds one event into o. The event must be the next version
// (o.Version+1) of the same stream and a transition the table allows;
// otherwise Apply changes nothing and returns an error. Apply is the only
// fold: the aggregate, GET /v1/orders/{id} and the order_summaries
// projection all use it.
func (o *Order) Apply(e Event) error {
	if e.Version != o.Version+1 {
		return fmt.Errorf("apply %s v%d to %s at v%d: not the next version", e.Type, e.Version, e.StreamID, o.Version)
	}
	if o.Version > 0 && e.StreamID != o.ID {
		return fmt.Errorf("apply %s of stream %s to order %s: %w", e.Type, e.StreamID, o.ID, ErrValidation)
	}
	at := e.OccurredAt
	t, known := transitions[e.Type]
	if !known {
		return fmt.Errorf("apply %s v%d of %s: %w", e.Type, e.Version, e.StreamID, ErrUnknownEvent)
	}
	if e.Data == nil || reflect.TypeOf(e.Data) != reflect.TypeOf(t.payload) {
		return fmt.Errorf("apply %s v%d of %s: payload does not match type: %w", e.Type, e.Version, e.StreamID, ErrValidation)
	}
	if !slices.Contains(t.from, o.Status) {
		return fmt.Errorf("apply %s v%d of %s in status %q: %w", e.Type, e.Version, e.StreamID, o.Status, ErrInvalidTransition)
	}
	o.ID, o.Status = e.StreamID, t.to
	e.Data.(interface{ apply(*Order, *time.Time) }).apply(o, &at)
	o.Version = e.Version
	o.UpdatedAt = at
	o.RecordedAt = e.RecordedAt
	return nil
}

// sums returns the sum of quantity times unit price, the sum of the lines'
// freight and the sum of quantities. validatePlaced has bounded them, so
// none overflows.
func sums(items []Line) (subtotal, freight, count int64) {
	for _, l := range items {
		subtotal += l.Quantity * l.UnitPriceCents
		freight += l.FreightCents
		count += l.Quantity
	}
	return subtotal, freight, count
}

// apply sets the fields of o that the payload fills, at the time it
// occurred; Apply has checked the event and set its status.
func (d OrderPlaced) apply(o *Order, at *time.Time) {
	sub, freight, count := sums(d.Items)
	freight += d.FreightCents
	o.CustomerID, o.Currency, o.Items, o.PlacedAt = d.CustomerID, d.Currency, d.Items, at
	o.ItemCount, o.SubtotalCents, o.FreightCents, o.TotalCents = count, sub, freight, sub+freight
}
func (OrderApproved) apply(o *Order, at *time.Time)          { o.ApprovedAt = at }
func (OrderInvoiced) apply(o *Order, at *time.Time)          { o.InvoicedAt = at }
func (OrderProcessingStarted) apply(o *Order, at *time.Time) { o.ProcessingAt = at }
func (OrderShipped) apply(o *Order, at *time.Time)           { o.ShippedAt = at }
func (OrderDelivered) apply(o *Order, at *time.Time)         { o.DeliveredAt = at }
func (d OrderCanceled) apply(o *Order, at *time.Time)        { o.CanceledAt, o.Reason = at, d.Reason }
func (d OrderMarkedUnavailable) apply(o *Order, at *time.Time) {
	o.UnavailableAt, o.Reason = at, d.Reason
}

// Command is a request to change an order: each command type gives the
// one event it appends, which names the command in the transition table.
// At is when it happened in the business (zero means the time the service
// received it).
type Command interface {
	event() (EventData, time.Time)
}

// PlaceOrder opens a new order stream. FreightCents is a whole-order
// charge on top of each line's own FreightCents.
type PlaceOrder struct {
	CustomerID   string
	Currency     string
	Items        []Line
	FreightCents int64
	At           time.Time
}

// Approve, Invoice, StartProcessing, Ship and Deliver move an order one step
// along its lifecycle.
type (
	Approve         struct{ At time.Time }
	Invoice         struct{ At time.Time }
	StartProcessing struct{ At time.Time }
	Ship            struct{ At time.Time }
	Deliver         struct{ At time.Time }
)

// Cancel cancels an order that is not delivered yet.
type Cancel struct {
	At     time.Time
	Reason string
}

// MarkUnavailable marks an order that cannot be fulfilled.
type MarkUnavailable struct {
	At     time.Time
	Reason string
}

func (c PlaceOrder) event() (EventData, time.Time) {
	return OrderPlaced{CustomerID: c.CustomerID, Currency: c.Currency, Items: slices.Clone(c.Items), FreightCents: c.FreightCents}, c.At
}
func (c Approve) event() (EventData, time.Time)         { return OrderApproved{}, c.At }
func (c Invoice) event() (EventData, time.Time)         { return OrderInvoiced{}, c.At }
func (c StartProcessing) event() (EventData, time.Time) { return OrderProcessingStarted{}, c.At }
func (c Ship) event() (EventData, time.Time)            { return OrderShipped{}, c.At }
func (c Deliver) event() (EventData, time.Time)         { return OrderDelivered{}, c.At }
func (c Cancel) event() (EventData, time.Time)          { return OrderCanceled{Reason: c.Reason}, c.At }
func (c MarkUnavailable) event() (EventData, time.Time) {
	return OrderMarkedUnavailable{Reason: c.Reason}, c.At
}

// CommandName is the command's name in the REST path ("approve", ...).
func CommandName(c Command) string {
	data, _ := c.event()
	return transitions[data.EventType()].command
}

// Next returns the status cmd leads to and whether the lifecycle table
// allows cmd on an order in status from ("" for an order not placed
// yet). It looks at nothing else: Decide also checks the payload and time.
func Next(from Status, cmd Command) (to Status, ok bool) {
	data, _ := cmd.event()
	t := transitions[data.EventType()]
	return t.to, slices.Contains(t.from, from)
}

// Decide returns the payload of the one event cmd appends to the order in
// state o and its occurrence time, or an error wrapping ErrValidation, ErrNotFound,
// ErrAlreadyExists or ErrInvalidTransition. It changes nothing. now is used
// when the command carries no time.
func (o Order) Decide(cmd Command, now time.Time) (EventData, time.Time, error) {
	if cmd == nil {
		return nil, time.Time{}, fmt.Errorf("decide no command: %w", ErrValidation)
	}
	data, at := cmd.event()
	// The payload passes the checks DecodeData makes of a stored one.
	if err := validateData(data); err != nil {
		return nil, time.Time{}, err
	}
	if at.IsZero() {
		at = now
	}
	if !ValidTime(at) {
		return nil, time.Time{}, &ValidationError{Fields: []FieldError{{Field: "at", Detail: "a time in years 1 to 9999 UTC"}}}
	}
	_, placing := cmd.(PlaceOrder)
	switch {
	case placing && o.Version > 0:
		return nil, time.Time{}, fmt.Errorf("place order %s: %w", o.ID, ErrAlreadyExists)
	case !placing && o.Version == 0:
		return nil, time.Time{}, fmt.Errorf("%s: order: %w", CommandName(cmd), ErrNotFound)
	case !slices.Contains(transitions[data.EventType()].from, o.Status):
		return nil, time.Time{}, fmt.Errorf("%s order %s in status %q: %w", CommandName(cmd), o.ID, o.Status, ErrInvalidTransition)
	}
	return data, Timestamp(at), nil
}

// SamePlacement reports whether p would place exactly the order o was
// placed as, so a repeated PlaceOrder can be answered with the existing
// order instead of ErrAlreadyExists.
func (o Order) SamePlacement(p PlaceOrder) bool {
	// With the lines equal, equal freight sums mean equal order-level
	// freight.
	_, lineFreight, _ := sums(p.Items)
	return o.Version > 0 && o.CustomerID == p.CustomerID && o.Currency == p.Currency &&
		slices.Equal(o.Items, p.Items) && o.FreightCents == p.FreightCents+lineFreight
}

// validatePlaced bounds every amount so that subtotals and totals fit in an
// int64 with room to spare: at most maxItemsPerOrder lines, quantities up to
// maxQuantity, prices, line freight and order freight up to maxCents.
func validatePlaced(ve *ValidationError, p OrderPlaced) {
	items, freight := p.Items, p.FreightCents
	if !validID(p.CustomerID) {
		ve.add("customer_id", "1 to %d letters, digits, '_' or '-'", MaxIDLength)
	}
	if !ValidCurrency(p.Currency) {
		ve.add("currency", "an ISO 4217 code: three upper-case letters")
	}
	if len(items) == 0 || len(items) > maxItemsPerOrder {
		ve.add("items", "1 to %d lines", maxItemsPerOrder)
	}
	for i, l := range items {
		if i >= maxItemsPerOrder {
			break
		}
		if !validID(l.SKU) {
			ve.add(fmt.Sprintf("items[%d].sku", i), "1 to %d letters, digits, '_' or '-'", MaxIDLength)
		}
		if l.Quantity < 1 || l.Quantity > maxQuantity {
			ve.add(fmt.Sprintf("items[%d].quantity", i), "1 to %d", maxQuantity)
		}
		if l.UnitPriceCents < 0 || l.UnitPriceCents > maxCents {
			ve.add(fmt.Sprintf("items[%d].unit_price_cents", i), "0 to %d", maxCents)
		}
		if l.FreightCents < 0 || l.FreightCents > maxCents {
			ve.add(fmt.Sprintf("items[%d].freight_cents", i), "0 to %d", maxCents)
		}
	}
	if freight < 0 || freight > maxCents {
		ve.add("freight_cents", "0 to %d", maxCents)
	}
	// Each line is at most 10^6 * 10^12 + 10^12 < MaxInt64, but 500 of
	// them are not: bound the running sum before each addition.
	const limit = math.MaxInt64 / 4
	sum := freight
	for _, l := range items {
		if l.Quantity < 1 || l.Quantity > maxQuantity || l.UnitPriceCents < 0 || l.UnitPriceCents > maxCents ||
			l.FreightCents < 0 || l.FreightCents > maxCents {
			continue // reported above
		}
		amount := l.Quantity*l.UnitPriceCents + l.FreightCents
		if sum > limit-amount {
			ve.add("items", "order total is over %d minor units", int64(limit))
			break
		}
		sum += amount
	}
}

// ValidCurrency reports whether c is an ISO 4217 code as orders carry it:
// three upper-case letters.
func ValidCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	return true
}

// CustomerOrderStats is what GET /v1/customers/{id}/order-stats says of one
// customer: how many orders it placed, how many are in each status, and its
// lifetime value per currency in minor units: the totals of its orders that
// are not canceled or unavailable.
type CustomerOrderStats struct {
	CustomerID         string           `json:"customer_id"`
	OrderCount         int64            `json:"order_count"`
	ByStatus           map[Status]int64 `json:"by_status"`
	LifetimeValueCents map[string]int64 `json:"lifetime_value_cents"`
	// RecordedAt is the newest RecordedAt among the orders' read-model
	// documents that carry one; zero when none does.
	RecordedAt time.Time `json:"recorded_at,omitzero"`
}

// CountsTowardValue reports whether an order in status s adds to a
// customer's lifetime value.
func CountsTowardValue(s Status) bool { return s != StatusCanceled && s != StatusUnavailable }
