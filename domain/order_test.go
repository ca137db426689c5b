package domain_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
)

const orderID = "o-1"

// t0 is the business time of the first event of every history below.
var t0 = time.Date(2024, 3, 1, 10, 0, 0, 0, time.UTC)

func at(step int) time.Time { return t0.Add(time.Duration(step) * time.Hour) }

func lines() []domain.Line {
	return []domain.Line{{SKU: "sku-1", Quantity: 2, UnitPriceCents: 1500}, {SKU: "sku_2", Quantity: 3, UnitPriceCents: 250}}
}

func placeCmd() domain.PlaceOrder {
	return domain.PlaceOrder{CustomerID: "c-1", Currency: "BRL", Items: lines(), FreightCents: 999}
}

func placed() domain.OrderPlaced {
	return domain.OrderPlaced{CustomerID: "c-1", Currency: "BRL", Items: lines(), FreightCents: 999}
}

// history turns payloads into the events of stream orderID: versions 1..n,
// step i occurring at(i).
func history(datas ...domain.EventData) []domain.Event {
	evs := make([]domain.Event, len(datas))
	for i, d := range datas {
		evs[i] = event(int64(i+1), d)
	}
	return evs
}

func event(version int64, d domain.EventData) domain.Event {
	return domain.Event{
		ID: fmt.Sprintf("e-%d", version), StreamID: orderID, StreamType: domain.StreamTypeOrder,
		Type: d.EventType(), Version: version, OccurredAt: at(int(version - 1)), RecordedAt: at(int(version - 1)).Add(time.Second),
		Data: d, Metadata: domain.Metadata{CorrelationID: "corr", CausationID: "cmd", SchemaVersion: 1},
	}
}

func fold(t *testing.T, datas ...domain.EventData) domain.Order {
	t.Helper()
	o, err := domain.Fold(history(datas...))
	if err != nil {
		t.Fatalf("fold: %v", err)
	}
	return o
}

// pathTo is a history that ends in status s.
func pathTo(s domain.Status) []domain.EventData {
	p := []domain.EventData{placed()}
	switch s {
	case domain.StatusApproved:
		p = append(p, domain.OrderApproved{})
	case domain.StatusInvoiced:
		p = append(p, domain.OrderApproved{}, domain.OrderInvoiced{})
	case domain.StatusProcessing:
		p = append(p, domain.OrderApproved{}, domain.OrderInvoiced{}, domain.OrderProcessingStarted{})
	case domain.StatusShipped:
		p = append(p, domain.OrderApproved{}, domain.OrderShipped{})
	case domain.StatusDelivered:
		p = append(p, domain.OrderApproved{}, domain.OrderShipped{}, domain.OrderDelivered{})
	case domain.StatusCanceled:
		p = append(p, domain.OrderCanceled{Reason: "customer asked"})
	case domain.StatusUnavailable:
		p = append(p, domain.OrderMarkedUnavailable{Reason: "out of stock"})
	}
	return p
}

// lifecycle is the transition table of doc.go, written out independently of
// the implementation: command, the event it appends, legal from, to.
var lifecycle = []struct {
	cmd  domain.Command
	name string
	want domain.EventData
	from []domain.Status
	to   domain.Status
}{
	{domain.Approve{}, "approve", domain.OrderApproved{}, []domain.Status{domain.StatusCreated}, domain.StatusApproved},
	{domain.Invoice{}, "invoice", domain.OrderInvoiced{}, []domain.Status{domain.StatusApproved}, domain.StatusInvoiced},
	{domain.StartProcessing{}, "process", domain.OrderProcessingStarted{},
		[]domain.Status{domain.StatusApproved, domain.StatusInvoiced}, domain.StatusProcessing},
	{domain.Ship{}, "ship", domain.OrderShipped{},
		[]domain.Status{domain.StatusApproved, domain.StatusInvoiced, domain.StatusProcessing}, domain.StatusShipped},
	{domain.Deliver{}, "deliver", domain.OrderDelivered{}, []domain.Status{domain.StatusShipped}, domain.StatusDelivered},
	{domain.Cancel{Reason: "late"}, "cancel", domain.OrderCanceled{Reason: "late"},
		[]domain.Status{domain.StatusCreated, domain.StatusApproved, domain.StatusInvoiced, domain.StatusProcessing, domain.StatusShipped},
		domain.StatusCanceled},
	{domain.MarkUnavailable{Reason: "no stock"}, "mark-unavailable", domain.OrderMarkedUnavailable{Reason: "no stock"},
		[]domain.Status{domain.StatusCreated, domain.StatusApproved, domain.StatusInvoiced, domain.StatusProcessing},
		domain.StatusUnavailable},
}

var docStatuses = []domain.Status{"created", "approved", "invoiced", "processing", "shipped", "delivered", "canceled", "unavailable"}

// scenario: given these events, when this command, then these payloads or
// this error.
type scenario struct {
	name  string
	given []domain.EventData
	when  domain.Command
	then  []domain.EventData
	err   error
}

func runScenarios(t *testing.T, scenarios []scenario) {
	t.Helper()
	now := time.Date(2024, 5, 6, 7, 8, 9, 123_456_789, time.UTC)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			o := fold(t, sc.given...)
			d, when, err := o.Decide(sc.when, now)
			if sc.err != nil {
				if !errors.Is(err, sc.err) || d != nil {
					t.Fatalf("Decide = %v, %v; want error %v and no event", d, err, sc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if got := []domain.EventData{d}; !reflect.DeepEqual(got, sc.then) {
				t.Fatalf("Decide = %#v, want %#v", got, sc.then)
			}
			if want := domain.Timestamp(now); !when.Equal(want) {
				t.Errorf("occurred at %v, want %v", when, want)
			}
			// The decided event must fold onto the given state.
			if err := o.Apply(event(o.Version+1, d)); err != nil {
				t.Fatalf("apply decided %s: %v", d.EventType(), err)
			}
		})
	}
}

func TestStatusesMatchDoc(t *testing.T) {
	if !slices.Equal(domain.Statuses, docStatuses) {
		t.Fatalf("Statuses = %v, want %v", domain.Statuses, docStatuses)
	}
	for _, s := range docStatuses {
		if !domain.ValidStatus(string(s)) {
			t.Errorf("ValidStatus(%q) = false", s)
		}
	}
	for _, s := range []string{"", "Created", "returned", "created "} {
		if domain.ValidStatus(s) {
			t.Errorf("ValidStatus(%q) = true", s)
		}
	}
}

func TestCommandName(t *testing.T) {
	if got := domain.CommandName(domain.PlaceOrder{}); got != "place" {
		t.Errorf("CommandName(PlaceOrder) = %q", got)
	}
	for _, l := range lifecycle {
		if got := domain.CommandName(l.cmd); got != l.name {
			t.Errorf("CommandName(%T) = %q, want %q", l.cmd, got, l.name)
		}
	}
}

// TestDecideTransitionTable decides every lifecycle command in every status:
// legal iff doc.go's table says so.
func TestDecideTransitionTable(t *testing.T) {
	var scs []scenario
	for _, s := range docStatuses {
		for _, l := range lifecycle {
			sc := scenario{name: fmt.Sprintf("%s/%s", s, l.name), given: pathTo(s), when: l.cmd}
			if slices.Contains(l.from, s) {
				sc.then = []domain.EventData{l.want}
			} else {
				sc.err = domain.ErrInvalidTransition
			}
			if _, ok := domain.Next(s, l.cmd); ok != slices.Contains(l.from, s) {
				t.Errorf("Next(%s, %s) allowed %v, the table says the opposite", s, l.name, ok)
			}
			scs = append(scs, sc)
		}
		scs = append(scs, scenario{name: fmt.Sprintf("%s/place", s), given: pathTo(s), when: placeCmd(), err: domain.ErrAlreadyExists})
	}
	for _, l := range lifecycle {
		scs = append(scs, scenario{name: "new stream/" + l.name, when: l.cmd, err: domain.ErrNotFound})
	}
	scs = append(scs, scenario{name: "new stream/place", when: placeCmd(), then: []domain.EventData{placed()}})
	runScenarios(t, scs)

	// The table reaches each status it names, so the legal cases above
	// really were decided in that status.
	for _, s := range docStatuses {
		if got := fold(t, pathTo(s)...).Status; got != s {
			t.Fatalf("pathTo(%s) folds to %s", s, got)
		}
		for _, l := range lifecycle {
			if to, ok := domain.Next(s, l.cmd); ok {
				if got := fold(t, append(pathTo(s), l.want)...).Status; got != to {
					t.Errorf("Next(%s, %s) = %s, the fold reaches %s", s, l.name, to, got)
				}
			}
		}
	}
	if to, ok := domain.Next("", placeCmd()); !ok || to != domain.StatusCreated {
		t.Errorf("Next of a place on a new stream = %s, %v", to, ok)
	}
}

func TestDecideScenarios(t *testing.T) {
	long := strings.Repeat("r", 501)
	runScenarios(t, []scenario{
		{name: "ship straight from approved", given: pathTo(domain.StatusApproved), when: domain.Ship{},
			then: []domain.EventData{domain.OrderShipped{}}},
		{name: "no ship before approval", given: pathTo(domain.StatusCreated), when: domain.Ship{}, err: domain.ErrInvalidTransition},
		{name: "cancel in transit", given: pathTo(domain.StatusShipped), when: domain.Cancel{Reason: "refused"},
			then: []domain.EventData{domain.OrderCanceled{Reason: "refused"}}},
		{name: "no cancel after delivery", given: pathTo(domain.StatusDelivered), when: domain.Cancel{}, err: domain.ErrInvalidTransition},
		{name: "cancel without reason", given: pathTo(domain.StatusCreated), when: domain.Cancel{},
			then: []domain.EventData{domain.OrderCanceled{}}},
		{name: "cancel reason of 500 bytes", given: pathTo(domain.StatusCreated), when: domain.Cancel{Reason: long[:500]},
			then: []domain.EventData{domain.OrderCanceled{Reason: long[:500]}}},
		{name: "cancel reason too long", given: pathTo(domain.StatusCreated), when: domain.Cancel{Reason: long}, err: domain.ErrValidation},
		{name: "mark-unavailable reason too long", given: pathTo(domain.StatusCreated), when: domain.MarkUnavailable{Reason: long},
			err: domain.ErrValidation},
		{name: "invalid place on an existing order", given: pathTo(domain.StatusCreated),
			when: domain.PlaceOrder{Currency: "BRL", Items: lines()}, err: domain.ErrValidation},
		{name: "nil command", when: nil, err: domain.ErrValidation},
	})
}

func TestDecideTime(t *testing.T) {
	now := time.Date(2024, 5, 6, 7, 8, 9, 999_999_999, time.FixedZone("x", -3*3600))
	given := time.Date(2023, 1, 2, 3, 4, 5, 6_700_000, time.FixedZone("y", 5*3600))
	o := fold(t, pathTo(domain.StatusCreated)...)
	for _, tc := range []struct {
		name string
		o    domain.Order
		cmd  domain.Command
		want time.Time
	}{
		{"approve at now", o, domain.Approve{}, domain.Timestamp(now)},
		{"approve at given time", o, domain.Approve{At: given}, domain.Timestamp(given)},
		{"place at now", domain.Order{}, placeCmd(), domain.Timestamp(now)},
		{"place at given time", domain.Order{}, domain.PlaceOrder{CustomerID: "c", Currency: "EUR", Items: lines(), At: given},
			domain.Timestamp(given)},
	} {
		_, got, err := tc.o.Decide(tc.cmd, now)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: at %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

func TestDecideDoesNotAliasItems(t *testing.T) {
	cmd := placeCmd()
	got, _, err := domain.Order{}.Decide(cmd, t0)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Items[0].Quantity = 99
	if q := got.(domain.OrderPlaced).Items[0].Quantity; q != 2 {
		t.Fatalf("OrderPlaced shares the command's items: quantity %d", q)
	}
}

func TestPlaceOrderValidation(t *testing.T) {
	n := func(k int, l domain.Line) []domain.Line {
		ls := make([]domain.Line, k)
		for i := range ls {
			ls[i] = l
		}
		return ls
	}
	one := domain.Line{SKU: "s", Quantity: 1, UnitPriceCents: 1}
	maxLine := domain.Line{SKU: "s", Quantity: 1_000_000, UnitPriceCents: 1_000_000_000_000}
	id64 := strings.Repeat("a", 64)
	for _, tc := range []struct {
		name   string
		edit   func(*domain.PlaceOrder)
		fields []string // nil: valid
	}{
		{"valid", func(*domain.PlaceOrder) {}, nil},
		{"64-byte customer id", func(p *domain.PlaceOrder) { p.CustomerID = id64 }, nil},
		{"500 lines", func(p *domain.PlaceOrder) { p.Items = n(500, one) }, nil},
		{"bounds", func(p *domain.PlaceOrder) {
			p.Items, p.FreightCents = []domain.Line{maxLine, {SKU: id64, Quantity: 1}}, 1_000_000_000_000
		}, nil},
		{"empty customer id", func(p *domain.PlaceOrder) { p.CustomerID = "" }, []string{"customer_id"}},
		{"customer id with dot", func(p *domain.PlaceOrder) { p.CustomerID = "c.1" }, []string{"customer_id"}},
		{"customer id with dollar", func(p *domain.PlaceOrder) { p.CustomerID = "$c" }, []string{"customer_id"}},
		{"customer id with space", func(p *domain.PlaceOrder) { p.CustomerID = "c 1" }, []string{"customer_id"}},
		{"customer id not UTF-8", func(p *domain.PlaceOrder) { p.CustomerID = "c\xff" }, []string{"customer_id"}},
		{"65-byte customer id", func(p *domain.PlaceOrder) { p.CustomerID = id64 + "a" }, []string{"customer_id"}},
		{"lower-case currency", func(p *domain.PlaceOrder) { p.Currency = "brl" }, []string{"currency"}},
		{"short currency", func(p *domain.PlaceOrder) { p.Currency = "BR" }, []string{"currency"}},
		{"long currency", func(p *domain.PlaceOrder) { p.Currency = "BRLL" }, []string{"currency"}},
		{"currency with digit", func(p *domain.PlaceOrder) { p.Currency = "B1L" }, []string{"currency"}},
		{"no items", func(p *domain.PlaceOrder) { p.Items = nil }, []string{"items"}},
		{"empty items", func(p *domain.PlaceOrder) { p.Items = []domain.Line{} }, []string{"items"}},
		{"501 lines", func(p *domain.PlaceOrder) { p.Items = n(501, one) }, []string{"items"}},
		{"quantity 0", func(p *domain.PlaceOrder) { p.Items[0].Quantity = 0 }, []string{"items[0].quantity"}},
		{"negative quantity", func(p *domain.PlaceOrder) { p.Items[1].Quantity = -1 }, []string{"items[1].quantity"}},
		{"quantity too large", func(p *domain.PlaceOrder) { p.Items[0].Quantity = 1_000_001 }, []string{"items[0].quantity"}},
		{"negative price", func(p *domain.PlaceOrder) { p.Items[1].UnitPriceCents = -1 }, []string{"items[1].unit_price_cents"}},
		{"price too large", func(p *domain.PlaceOrder) { p.Items[0].UnitPriceCents = 1_000_000_000_001 },
			[]string{"items[0].unit_price_cents"}},
		{"bad sku", func(p *domain.PlaceOrder) { p.Items[1].SKU = "a.b" }, []string{"items[1].sku"}},
		{"empty sku", func(p *domain.PlaceOrder) { p.Items[0].SKU = "" }, []string{"items[0].sku"}},
		{"negative freight", func(p *domain.PlaceOrder) { p.FreightCents = -1 }, []string{"freight_cents"}},
		{"freight too large", func(p *domain.PlaceOrder) { p.FreightCents = 1_000_000_000_001 }, []string{"freight_cents"}},
		{"line freight at the bound", func(p *domain.PlaceOrder) { p.Items[1].FreightCents = 1_000_000_000_000 }, nil},
		{"negative line freight", func(p *domain.PlaceOrder) { p.Items[1].FreightCents = -1 }, []string{"items[1].freight_cents"}},
		{"line freight too large", func(p *domain.PlaceOrder) { p.Items[0].FreightCents = 1_000_000_000_001 },
			[]string{"items[0].freight_cents"}},
		{"total overflows", func(p *domain.PlaceOrder) { p.Items = n(500, maxLine) }, []string{"items"}},
		// 2*10^18 + 305843*10^12 is 9.2*10^9 below the bound, MaxInt64/4:
		// the freight of one line tips it over.
		{"total just under the bound", func(p *domain.PlaceOrder) {
			p.Items, p.FreightCents = []domain.Line{maxLine, maxLine, {SKU: "s", Quantity: 305_843, UnitPriceCents: 1_000_000_000_000},
				{SKU: "s", Quantity: 1, FreightCents: 9_000_000_000}}, 0
		}, nil},
		{"total over the bound by line freight", func(p *domain.PlaceOrder) {
			p.Items, p.FreightCents = []domain.Line{maxLine, maxLine, {SKU: "s", Quantity: 305_843, UnitPriceCents: 1_000_000_000_000},
				{SKU: "s", Quantity: 1, FreightCents: 10_000_000_000}}, 0
		}, []string{"items"}},
		{"every field at once", func(p *domain.PlaceOrder) {
			p.CustomerID, p.Currency, p.FreightCents = "", "x", -5
			p.Items[1] = domain.Line{SKU: "a b", Quantity: 0, UnitPriceCents: -1}
		}, []string{"customer_id", "currency", "items[1].sku", "items[1].quantity", "items[1].unit_price_cents", "freight_cents"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := placeCmd()
			tc.edit(&p)
			got, _, err := domain.Order{}.Decide(p, t0)
			if tc.fields == nil {
				if _, ok := got.(domain.OrderPlaced); err != nil || !ok {
					t.Fatalf("Decide = %v, %v; want an OrderPlaced", got, err)
				}
				return
			}
			var ve *domain.ValidationError
			if !errors.Is(err, domain.ErrValidation) || !errors.As(err, &ve) || got != nil {
				t.Fatalf("Decide = %v, %v; want a *ValidationError and no events", got, err)
			}
			var fields []string
			for _, f := range ve.Fields {
				if f.Detail == "" {
					t.Errorf("field %s has no detail", f.Field)
				}
				fields = append(fields, f.Field)
			}
			if !slices.Equal(fields, tc.fields) {
				t.Fatalf("fields = %q, want %q", fields, tc.fields)
			}
			for _, f := range tc.fields {
				if !strings.Contains(err.Error(), f+": ") {
					t.Errorf("error %q does not name %s", err, f)
				}
			}
		})
	}
}

func TestValidateID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"a", true}, {"A-z_09", true}, {strings.Repeat("x", 64), true},
		{"", false}, {strings.Repeat("x", 65), false}, {"a.b", false}, {"$a", false}, {"a b", false},
		{"a\tb", false}, {"a*", false}, {"a>", false}, {"é", false}, {"a\xff", false}, {"a/b", false},
	} {
		err := domain.ValidateID("order id", tc.id)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, domain.ErrValidation)) {
			t.Errorf("ValidateID(%q) = %v, want ok=%v", tc.id, err, tc.ok)
		}
	}
}

// refunded is an event type this build does not know.
type refunded struct{}

func (refunded) EventType() string { return "OrderRefunded" }

func TestApplyRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		given []domain.EventData
		e     domain.Event
		err   error // nil: any error
	}{
		{"first event not version 1", nil, event(2, placed()), nil},
		{"version 0", nil, event(0, placed()), nil},
		{"version repeated", []domain.EventData{placed()}, event(1, domain.OrderApproved{}), nil},
		{"version skipped", []domain.EventData{placed()}, event(3, domain.OrderApproved{}), nil},
		{"lifecycle event first", nil, event(1, domain.OrderApproved{}), domain.ErrInvalidTransition},
		{"second placement", []domain.EventData{placed()}, event(2, placed()), domain.ErrInvalidTransition},
		{"other stream", []domain.EventData{placed()},
			func() domain.Event { e := event(2, domain.OrderApproved{}); e.StreamID = "o-2"; return e }(), domain.ErrValidation},
		{"payload of another type", []domain.EventData{placed()},
			func() domain.Event { e := event(2, domain.OrderApproved{}); e.Type = domain.TypeOrderShipped; return e }(), domain.ErrValidation},
		{"no payload", []domain.EventData{placed()},
			func() domain.Event { e := event(2, domain.OrderApproved{}); e.Data = nil; return e }(), domain.ErrValidation},
		{"unknown type", []domain.EventData{placed()},
			event(2, refunded{}), domain.ErrUnknownEvent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := fold(t, tc.given...)
			before := o
			err := o.Apply(tc.e)
			if err == nil || (tc.err != nil && !errors.Is(err, tc.err)) {
				t.Fatalf("Apply = %v, want error %v", err, tc.err)
			}
			if !reflect.DeepEqual(o, before) {
				t.Fatalf("refused Apply changed the order: %+v", o)
			}
		})
	}
	// Apply's table is Decide's table: every lifecycle event in every status.
	for _, s := range docStatuses {
		for _, l := range lifecycle {
			o := fold(t, pathTo(s)...)
			before := o
			err := o.Apply(event(o.Version+1, l.want))
			switch legal := slices.Contains(l.from, s); {
			case legal && (err != nil || o.Status != l.to):
				t.Errorf("%s in %s: Apply = %v, status %s; want %s", l.want.EventType(), s, err, o.Status, l.to)
			case !legal && (!errors.Is(err, domain.ErrInvalidTransition) || !reflect.DeepEqual(o, before)):
				t.Errorf("%s in %s: Apply = %v, want ErrInvalidTransition and no change", l.want.EventType(), s, err)
			}
		}
	}
}

func TestFoldLifecycle(t *testing.T) {
	ptr := func(step int) *time.Time { t := at(step); return &t }
	base := domain.Order{
		ID: orderID, CustomerID: "c-1", Currency: "BRL", Items: lines(),
		ItemCount: 5, SubtotalCents: 2*1500 + 3*250, FreightCents: 999, TotalCents: 2*1500 + 3*250 + 999, PlacedAt: ptr(0),
	}
	// RecordedAt is the last event's: a second after it occurred (event).
	with := func(f func(*domain.Order)) domain.Order {
		o := base
		f(&o)
		o.RecordedAt = o.UpdatedAt.Add(time.Second)
		return o
	}
	for _, tc := range []struct {
		name  string
		given []domain.EventData
		want  domain.Order
	}{
		{"placed", []domain.EventData{placed()}, with(func(o *domain.Order) {
			o.Status, o.Version, o.UpdatedAt = domain.StatusCreated, 1, at(0)
		})},
		{"delivered", []domain.EventData{placed(), domain.OrderApproved{}, domain.OrderInvoiced{}, domain.OrderProcessingStarted{},
			domain.OrderShipped{}, domain.OrderDelivered{}}, with(func(o *domain.Order) {
			o.Status, o.Version, o.UpdatedAt = domain.StatusDelivered, 6, at(5)
			o.ApprovedAt, o.InvoicedAt, o.ProcessingAt, o.ShippedAt, o.DeliveredAt = ptr(1), ptr(2), ptr(3), ptr(4), ptr(5)
		})},
		{"canceled in transit", []domain.EventData{placed(), domain.OrderApproved{}, domain.OrderShipped{},
			domain.OrderCanceled{Reason: "refused"}}, with(func(o *domain.Order) {
			o.Status, o.Version, o.UpdatedAt, o.Reason = domain.StatusCanceled, 4, at(3), "refused"
			o.ApprovedAt, o.ShippedAt, o.CanceledAt = ptr(1), ptr(2), ptr(3)
		})},
		{"unavailable", []domain.EventData{placed(), domain.OrderApproved{}, domain.OrderMarkedUnavailable{Reason: "no stock"}},
			with(func(o *domain.Order) {
				o.Status, o.Version, o.UpdatedAt, o.Reason = domain.StatusUnavailable, 3, at(2), "no stock"
				o.ApprovedAt, o.UnavailableAt = ptr(1), ptr(2)
			})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fold(t, tc.given...); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Fold =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
	o, err := domain.Fold(history(placed(), domain.OrderDelivered{}))
	if !errors.Is(err, domain.ErrInvalidTransition) || !reflect.DeepEqual(o, domain.Order{}) {
		t.Fatalf("Fold of an illegal history = %+v, %v; want zero Order and ErrInvalidTransition", o, err)
	}
}

// TestFoldFreight: the order's freight is its order-level freight plus each
// line's, and the total includes both; an order placed without line freight
// (the only shape before per-line freight) keeps its totals.
func TestFoldFreight(t *testing.T) {
	withLineFreight := func(order int64, perLine ...int64) domain.OrderPlaced {
		p := placed()
		p.Items, p.FreightCents = lines(), order
		for i, f := range perLine {
			p.Items[i].FreightCents = f
		}
		return p
	}
	const subtotal = 2*1500 + 3*250
	for _, tc := range []struct {
		name    string
		placed  domain.OrderPlaced
		freight int64
	}{
		{"order-level freight only", placed(), 999},
		{"freight per line", withLineFreight(0, 1234, 567), 1234 + 567},
		{"freight on one line", withLineFreight(0, 0, 890), 890},
		{"per line and order-level", withLineFreight(100, 1234, 567), 100 + 1234 + 567},
		{"no freight", withLineFreight(0), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := fold(t, tc.placed, domain.OrderApproved{})
			if o.SubtotalCents != subtotal || o.FreightCents != tc.freight || o.TotalCents != subtotal+tc.freight {
				t.Fatalf("subtotal %d, freight %d, total %d; want %d, %d, %d",
					o.SubtotalCents, o.FreightCents, o.TotalCents, subtotal, tc.freight, subtotal+tc.freight)
			}
			if !reflect.DeepEqual(o.Items, tc.placed.Items) {
				t.Errorf("items %+v, want %+v", o.Items, tc.placed.Items)
			}
		})
	}
}

func TestSamePlacement(t *testing.T) {
	o := fold(t, placed(), domain.OrderApproved{})
	for _, tc := range []struct {
		name string
		edit func(*domain.PlaceOrder)
		want bool
	}{
		{"same", func(*domain.PlaceOrder) {}, true},
		{"same at another time", func(p *domain.PlaceOrder) { p.At = at(9) }, true},
		{"other customer", func(p *domain.PlaceOrder) { p.CustomerID = "c-2" }, false},
		{"other currency", func(p *domain.PlaceOrder) { p.Currency = "USD" }, false},
		{"other freight", func(p *domain.PlaceOrder) { p.FreightCents++ }, false},
		{"other line freight", func(p *domain.PlaceOrder) { p.Items[1].FreightCents++ }, false},
		{"order freight moved to a line", func(p *domain.PlaceOrder) {
			p.Items[0].FreightCents, p.FreightCents = p.FreightCents, 0
		}, false},
		{"other quantity", func(p *domain.PlaceOrder) { p.Items[1].Quantity++ }, false},
		{"other price", func(p *domain.PlaceOrder) { p.Items[0].UnitPriceCents++ }, false},
		{"other sku", func(p *domain.PlaceOrder) { p.Items[0].SKU = "sku-9" }, false},
		{"lines reordered", func(p *domain.PlaceOrder) { slices.Reverse(p.Items) }, false},
		{"extra line", func(p *domain.PlaceOrder) { p.Items = append(p.Items, p.Items[0]) }, false},
	} {
		p := placeCmd()
		tc.edit(&p)
		if got := o.SamePlacement(p); got != tc.want {
			t.Errorf("%s: SamePlacement = %v, want %v", tc.name, got, tc.want)
		}
	}
	p := placeCmd()
	p.Items[0].FreightCents, p.FreightCents = 400, 599
	if o := fold(t, domain.OrderPlaced{CustomerID: p.CustomerID, Currency: p.Currency, Items: p.Items,
		FreightCents: p.FreightCents}); !o.SamePlacement(p) {
		t.Error("an order placed with line freight differs from its own placement")
	}
	if (domain.Order{}).SamePlacement(domain.PlaceOrder{}) {
		t.Error("a new order has the same placement as an empty PlaceOrder")
	}
}

func TestTimestamp(t *testing.T) {
	in := time.Date(2024, 1, 1, 5, 30, 0, 123_987_654, time.FixedZone("IST", 5*3600+1800))
	want := time.Date(2024, 1, 1, 0, 0, 0, 123_000_000, time.UTC)
	if got := domain.Timestamp(in); !reflect.DeepEqual(got, want) || got.Location() != time.UTC {
		t.Fatalf("Timestamp(%v) = %v, want %v", in, got, want)
	}
	now := time.Now() // carries a monotonic reading
	if a, b := domain.Timestamp(now), domain.Timestamp(now.UTC()); a != b || a.Nanosecond()%int(time.Millisecond) != 0 {
		t.Fatalf("Timestamp(now) = %v, Timestamp(now.UTC()) = %v", a, b)
	}
}

func TestCountsTowardValue(t *testing.T) {
	for _, s := range docStatuses {
		want := s != domain.StatusCanceled && s != domain.StatusUnavailable
		if got := domain.CountsTowardValue(s); got != want {
			t.Errorf("CountsTowardValue(%s) = %v, want %v", s, got, want)
		}
	}
}
