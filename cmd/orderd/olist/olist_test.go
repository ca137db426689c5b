package olist

import (
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/domain/domaintest"
)

const sample = "../../../testdata/olist-sample"

func loadSample(t *testing.T) *Dataset {
	t.Helper()
	ds, err := Load(sample)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func find(t *testing.T, ds *Dataset, id string) Order {
	t.Helper()
	i := slices.IndexFunc(ds.Orders, func(o Order) bool { return o.ID == id })
	if i < 0 {
		t.Fatalf("order %s not in the sample", id)
	}
	return ds.Orders[i]
}

// The README says 4,070 orders, 5,153 item rows and 176 orders with items;
// the files hold one more row each (their last line has no newline) and
// 175 joined orders (the README's join counted the header). Its status
// breakdown is right and sums to 4,071.
func TestLoadSample(t *testing.T) {
	ds := loadSample(t)
	if len(ds.Orders) != 4071 || len(ds.Items) != 5154 {
		t.Fatalf("orders %d, items %d; want 4071, 5154", len(ds.Orders), len(ds.Items))
	}
	statuses := map[domain.Status]int{}
	withItems := 0
	for _, o := range ds.Orders {
		statuses[o.Status]++
		if len(ds.byOrder[o.ID]) > 0 {
			withItems++
		}
	}
	want := map[domain.Status]int{"delivered": 3965, "shipped": 43, "canceled": 20, "unavailable": 18, "processing": 15, "invoiced": 10}
	if !maps.Equal(statuses, want) {
		t.Errorf("statuses %v, want %v", statuses, want)
	}
	if withItems != 175 {
		t.Errorf("%d orders have items, want 175", withItems)
	}
	if !slices.IsSortedFunc(ds.Orders, func(a, b Order) int { return a.PurchasedAt.Compare(b.PurchasedAt) }) {
		t.Error("orders are not sorted by purchase time")
	}
	// First data row: unquoted order id, quoted customer id.
	o := find(t, ds, "e481f51cbdc54678b7cc49136f2d6af7")
	want0 := Order{ID: "e481f51cbdc54678b7cc49136f2d6af7", CustomerID: "9ef432eb6251297304e76186b10a928d",
		Status: domain.StatusDelivered, PurchasedAt: utc("2017-10-02 10:56:33"), ApprovedAt: utc("2017-10-02 11:07:15"),
		CarrierAt: utc("2017-10-04 19:55:00"), DeliveredAt: utc("2017-10-10 21:25:13")}
	if o != want0 {
		t.Errorf("first row %+v, want %+v", o, want0)
	}
	if it := ds.byOrder["00010242fe8c5a6d1ba2dd792cb16214"]; len(it) != 1 || it[0].PriceCents != 5890 || it[0].FreightCents != 1329 {
		t.Errorf("first item row %+v", it)
	}
}

func utc(s string) time.Time {
	t, err := time.Parse(time.DateTime, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestParseCents(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"58.90", 5890}, {"0.00", 0}, {"0.01", 1}, {"58.9", 5890}, {"58", 5800}, {"007.05", 705},
		{"6735.00", 673500}, {"9999999999999.99", 999999999999999},
	} {
		if got, err := ParseCents(tc.in); err != nil || got != tc.want {
			t.Errorf("ParseCents(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", ".", "58.", ".90", "58.901", "-1.00", "+1.00", " 58.90", "58.90 ",
		"1e3", "58,90", "5 8.90", "58.9a", "NaN", "0x10", "1.2.3", "10000000000000.00", "١.٠٠"} {
		if got, err := ParseCents(in); err == nil {
			t.Errorf("ParseCents(%q) = %d, want an error", in, got)
		}
	}
}

// writeData writes an orders and an items file into a new directory.
func writeData(t *testing.T, orders, items [][]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, rows := range map[string][][]string{OrdersFile: orders, ItemsFile: items} {
		var b bytes.Buffer
		w := csv.NewWriter(&b)
		if err := w.WriteAll(rows); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

var (
	ordersHeader = []string{"order_id", "customer_id", "order_status", "order_purchase_timestamp", "order_approved_at",
		"order_delivered_carrier_date", "order_delivered_customer_date", "order_estimated_delivery_date"}
	itemsHeader = []string{"order_id", "order_item_id", "product_id", "seller_id", "shipping_limit_date", "price", "freight_value"}
	goodOrder   = []string{"o1", "c1", "delivered", "2017-10-02 10:56:33", "", "", "", ""}
	goodItem    = []string{"o1", "1", "p1", "s1", "2017-10-03 00:00:00", "58.90", "13.29"}
)

func with(row []string, i int, v string) []string {
	r := slices.Clone(row)
	r[i] = v
	return r
}

func TestLoadRejectsMalformedRows(t *testing.T) {
	for _, tc := range []struct {
		name          string
		orders, items [][]string
		want          string
	}{
		{"price", nil, [][]string{goodItem, with(goodItem, 5, "5x.90")}, `olist_order_items_dataset.csv:3: price: "5x.90"`},
		{"price three decimals", nil, [][]string{with(goodItem, 5, "58.901")}, "olist_order_items_dataset.csv:2: price"},
		{"freight", nil, [][]string{with(goodItem, 6, "-1.00")}, "olist_order_items_dataset.csv:2: freight_value"},
		{"item seq", nil, [][]string{with(goodItem, 1, "0")}, "olist_order_items_dataset.csv:2: order_item_id"},
		{"no items", nil, [][]string{}, "olist_order_items_dataset.csv: no rows"},
		{"timestamp", [][]string{goodOrder, with(with(goodOrder, 0, "o2"), 4, "2017-10-02T10:56:33Z")}, nil, "olist_orders_dataset.csv:3: timestamp"},
		{"status", [][]string{with(goodOrder, 2, "lost")}, nil, `olist_orders_dataset.csv:2: order_status "lost"`},
		{"id", [][]string{with(goodOrder, 0, "o.1")}, nil, "olist_orders_dataset.csv:2: id"},
		{"duplicate", [][]string{goodOrder, goodOrder}, nil, "olist_orders_dataset.csv:3: order o1 appears twice"},
		{"no purchase time", [][]string{with(goodOrder, 3, "")}, nil, "olist_orders_dataset.csv:2: order_purchase_timestamp is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orders, items := [][]string{goodOrder}, [][]string{goodItem}
			if tc.orders != nil {
				orders = tc.orders
			}
			if tc.items != nil {
				items = tc.items
			}
			_, err := Load(writeData(t, append([][]string{ordersHeader}, orders...), append([][]string{itemsHeader}, items...)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load: %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

// steps renders a plan's commands as "name@time", "-" for no time, with
// the reason in parentheses.
func steps(p Plan) []string {
	var out []string
	for _, c := range p.Commands {
		v := reflect.ValueOf(c)
		s := domain.CommandName(c) + "@-"
		if at := v.FieldByName("At").Interface().(time.Time); !at.IsZero() {
			s = domain.CommandName(c) + "@" + at.Format(time.DateTime)
		}
		if r := v.FieldByName("Reason"); r.IsValid() && r.String() != "" {
			s += " (" + r.String() + ")"
		}
		out = append(out, s)
	}
	return out
}

func TestPlanOddPaths(t *testing.T) {
	ds := loadSample(t)
	unapproved := func(id string) Order { o := find(t, ds, id); o.ApprovedAt = time.Time{}; return o }
	for _, tc := range []struct {
		name    string
		order   Order
		steps   []string
		odd     []string
		refused []string
		want    domain.Status
	}{
		{"canceled after delivery", find(t, ds, "1950d777989f6a877539f53795b4c3c3"),
			[]string{"place@2018-02-19 19:48:52", "approve@2018-02-19 20:56:05", "ship@2018-02-20 19:57:13",
				"deliver@2018-03-21 22:03:51", "cancel@2018-03-21 22:03:51 (olist: canceled)"},
			[]string{OddCanceledAfterDelivery}, []string{"cancel: invalid-transition"}, domain.StatusDelivered},
		{"canceled after carrier", find(t, ds, "714fb133a6730ab81fa1d3c1b2007291"),
			[]string{"place@2018-01-26 21:34:08", "approve@2018-01-26 21:58:39", "ship@2018-01-29 22:33:25",
				"cancel@2018-01-29 22:33:25 (olist: canceled)"},
			[]string{OddCanceledAfterCarrier}, nil, domain.StatusCanceled},
		{"canceled after carrier 2", find(t, ds, "3a129877493c8189c59c60eb71d97c29"),
			[]string{"place@2018-01-25 13:34:24", "approve@2018-01-25 13:50:20", "ship@2018-01-26 21:42:18",
				"cancel@2018-01-26 21:42:18 (olist: canceled)"},
			[]string{OddCanceledAfterCarrier}, nil, domain.StatusCanceled},
		{"delivered without date", find(t, ds, "2d1e2d5bf4dc7227b3bfebb81328c15f"),
			[]string{"place@2017-11-28 17:44:07", "approve@2017-11-28 17:56:40", "ship@2017-11-30 18:12:23", "deliver@-"},
			[]string{OddDeliveredWithoutDate}, nil, domain.StatusDelivered},
		// The sample has no approval-missing order: these are real rows
		// with the approval time removed.
		{"approval missing, delivered", unapproved("e481f51cbdc54678b7cc49136f2d6af7"),
			[]string{"place@2017-10-02 10:56:33", "ship@2017-10-04 19:55:00", "deliver@2017-10-10 21:25:13"},
			[]string{OddApprovalMissing}, []string{"ship: invalid-transition", "deliver: invalid-transition"}, domain.StatusCreated},
		{"approval missing, invoiced", unapproved("136cce7faa42fdb2cefd53fdc79a6098"),
			[]string{"place@2017-04-11 12:22:08", "invoice@2017-04-11 12:22:08"},
			[]string{OddApprovalMissing}, []string{"invoice: invalid-transition"}, domain.StatusCreated},
		{"approval missing, canceled after carrier", unapproved("714fb133a6730ab81fa1d3c1b2007291"),
			[]string{"place@2018-01-26 21:34:08", "ship@2018-01-29 22:33:25", "cancel@2018-01-29 22:33:25 (olist: canceled)"},
			[]string{OddApprovalMissing, OddCanceledAfterCarrier}, []string{"ship: invalid-transition"}, domain.StatusCanceled},
		// Ordinary paths, for contrast.
		{"canceled, never approved", find(t, ds, "00b1cb0320190ca0daa2c88b35206009"),
			[]string{"place@2018-08-28 15:26:39", "cancel@2018-08-28 15:26:39 (olist: canceled)"}, nil, nil, domain.StatusCanceled},
		{"invoiced", find(t, ds, "136cce7faa42fdb2cefd53fdc79a6098"),
			[]string{"place@2017-04-11 12:22:08", "approve@2017-04-13 13:25:17", "invoice@2017-04-13 13:25:17"}, nil, nil, domain.StatusInvoiced},
		{"processing", find(t, ds, "15bed8e2fec7fdbadb186b57c46c92f2"),
			[]string{"place@2017-09-03 14:22:03", "approve@2017-09-03 14:30:09", "process@2017-09-03 14:30:09"}, nil, nil, domain.StatusProcessing},
		{"unavailable", find(t, ds, "8e24261a7e58791d10cb1bf9da94df5c"),
			[]string{"place@2017-11-16 15:09:28", "approve@2017-11-16 15:26:57", "mark-unavailable@2017-11-16 15:26:57 (olist: unavailable)"},
			nil, nil, domain.StatusUnavailable},
		{"shipped", find(t, ds, "ee64d42b8cf066f35eac1cf57de1aa85"),
			[]string{"place@2018-06-04 16:44:48", "approve@2018-06-05 04:31:18", "ship@2018-06-05 14:32:00"}, nil, nil, domain.StatusShipped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ds.Plan(tc.order)
			if got := steps(p); !slices.Equal(got, tc.steps) {
				t.Errorf("steps\n got %q\nwant %q", got, tc.steps)
			}
			if !slices.Equal(p.Odd, tc.odd) || !slices.Equal(p.Refused, tc.refused) || p.Want != tc.want {
				t.Errorf("odd %q refused %q want %s; want odd %q refused %q want %s", p.Odd, p.Refused, p.Want, tc.odd, tc.refused, tc.want)
			}
			pl, ok := p.Commands[0].(domain.PlaceOrder)
			if !ok || pl.CustomerID != tc.order.CustomerID || pl.Currency != "BRL" || len(pl.Items) == 0 {
				t.Errorf("place %+v", pl)
			}
		})
	}
	// The odd paths of the whole sample.
	odd := map[string]int{}
	for _, o := range ds.Orders {
		for _, name := range ds.Plan(o).Odd {
			odd[name]++
		}
	}
	if want := map[string]int{OddCanceledAfterCarrier: 2, OddCanceledAfterDelivery: 1, OddDeliveredWithoutDate: 1}; !maps.Equal(odd, want) {
		t.Errorf("odd paths of the sample %v, want %v", odd, want)
	}
}

func TestPlanLines(t *testing.T) {
	ds := loadSample(t)
	// No item rows: one line chosen by FNV-1a 64 of the id.
	id := "e481f51cbdc54678b7cc49136f2d6af7"
	h := fnv.New64a()
	h.Write([]byte(id))
	row := ds.Items[h.Sum64()%uint64(len(ds.Items))]
	if got := ChooseLine(id, ds.Items); got != row || ChooseLine(id, ds.Items) != got {
		t.Fatalf("ChooseLine = %+v, want %+v", got, row)
	}
	if other := ChooseLine("53cdb2fc8bc7dce0b6741e2150273451", ds.Items); other == row {
		t.Errorf("two orders chose the same row %+v (possible, but not for these ids)", row)
	}
	// The items of the place command as JSON; the data's freight is per
	// item, so it goes on the lines and the order has no order-level
	// freight.
	place := func(c domain.Command) string {
		p := c.(domain.PlaceOrder)
		b, err := json.Marshal(p.Items)
		if err != nil {
			return err.Error()
		}
		if p.FreightCents != 0 {
			return fmt.Sprintf("%s with order-level freight_cents %d", b, p.FreightCents)
		}
		return string(b)
	}
	if row.FreightCents == 0 {
		t.Fatalf("the chosen row %+v has no freight; pick an id whose row has", row)
	}
	for _, tc := range []struct{ id, want string }{
		{id, fmt.Sprintf(`[{"sku":%q,"quantity":1,"unit_price_cents":%d,"freight_cents":%d}]`, row.ProductID, row.PriceCents, row.FreightCents)},
		// Four rows of one product, 19.28 freight each.
		{"08bdbdeaf1626720051193300f93806e", `[{"sku":"ecbe1ef7e2903ff8b1d704ba78fa264d","quantity":4,"unit_price_cents":9900,"freight_cents":7712}]`},
		// Three products, in order_item_id order, each with its row's freight.
		{"0420dbc50fc554e303e4b2d6b39063f6", `[{"sku":"7d854ab97c64ef9df2bbfaf332765786","quantity":1,"unit_price_cents":6490,"freight_cents":2698},` +
			`{"sku":"84a87daa85c8b432d90bc1baa0cb4388","quantity":1,"unit_price_cents":5990,"freight_cents":1594},` +
			`{"sku":"fdba6f37e0258dbca54eb0ed8b293ae0","quantity":1,"unit_price_cents":5990,"freight_cents":1472}]`},
	} {
		if got := place(ds.Plan(find(t, ds, tc.id)).Commands[0]); got != tc.want {
			t.Errorf("%s lines\n got %s\nwant %s", tc.id, got, tc.want)
		}
	}
	// One product at two prices stays two lines (not in the sample).
	rows := []Item{{"x", "a", 2, 1200, 100}, {"x", "a", 1, 1000, 100}, {"x", "b", 4, 500, 50}, {"x", "a", 3, 1000, 100}}
	syn := &Dataset{Items: rows, byOrder: map[string][]Item{"x": {rows[1], rows[0], rows[3], rows[2]}}}
	got := place(syn.Plan(Order{ID: "x"}).Commands[0])
	if want := `[{"sku":"a","quantity":2,"unit_price_cents":1000,"freight_cents":200},{"sku":"a","quantity":1,"unit_price_cents":1200,"freight_cents":100},` +
		`{"sku":"b","quantity":1,"unit_price_cents":500,"freight_cents":50}]`; got != want {
		t.Errorf("mixed prices\n got %s\nwant %s", got, want)
	}
}

// ---- the fake service ----

// fake is the service of the REST contract over domain.Service and an
// in-memory store that feeds every appended event to an asynchronous
// order_summaries projection.
type fake struct {
	store      *domaintest.MemStore
	svc        *domain.Service
	mu         sync.Mutex
	summaries  map[string]domain.Order
	projErr    error
	wait       time.Duration // bound of the min_version wait
	corrupt    string        // this order's summary is served with total_cents+1
	stuck      string        // this order's summary stops at version 1
	salesOff   bool          // the daily sales' first row is served with one item more
	flakyEvery int64         // every n-th POST answers 503, once per Idempotency-Key
	posts      atomic.Int64
	flaked     sync.Map     // Idempotency-Keys answered 503 once
	failed     atomic.Int64 // 503s served
	replayed   atomic.Int64 // Idempotent-Replayed answers
}

func newFake(t *testing.T, configure func(*fake)) (*fake, *httptest.Server) {
	feed := make(chan domain.Event, 1024)
	f := &fake{store: domaintest.NewMemStore(), summaries: map[string]domain.Order{}, wait: 2 * time.Second}
	if configure != nil {
		configure(f)
	}
	f.svc = domain.NewService(feeding{f.store, feed}, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range feed {
			f.mu.Lock()
			o := f.summaries[e.StreamID]
			if e.StreamID != f.stuck || e.Version == 1 {
				if err := o.Apply(e); err != nil && f.projErr == nil {
					f.projErr = err
				}
				f.summaries[e.StreamID] = o
			}
			f.mu.Unlock()
		}
	}()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/orders", f.place)
	mux.HandleFunc("POST /v1/orders/{id}/{command}", f.step)
	mux.HandleFunc("GET /v1/orders/{id}", f.get)
	mux.HandleFunc("GET /v1/order-summaries/{id}", f.summary)
	mux.HandleFunc("GET /v1/daily-sales", f.dailySales)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A request answered 503 once is not answered 503 again: a retry
		// could otherwise hit every n-th POST by chance on each attempt.
		if r.Method == http.MethodPost && f.flakyEvery > 0 && f.posts.Add(1)%f.flakyEvery == 0 {
			if _, again := f.flaked.LoadOrStore(r.Header.Get("Idempotency-Key"), true); again {
				mux.ServeHTTP(w, r)
				return
			}
			f.failed.Add(1)
			problem(w, http.StatusServiceUnavailable, "unavailable", "try again", nil)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		ts.Close() // waits for the handlers
		close(feed)
		<-done
		if f.projErr != nil {
			t.Errorf("projection: %v", f.projErr)
		}
	})
	return f, ts
}

// feeding is the store that sends each event it stores to feed, in
// version order, before Append returns. The importer sends an order's
// next command only once the last one is answered, so each stream's
// events reach feed in order.
type feeding struct {
	*domaintest.MemStore
	feed chan<- domain.Event
}

func (s feeding) Append(ctx context.Context, c domain.Commit) (time.Time, error) {
	rec, err := s.MemStore.Append(ctx, c)
	if err != nil {
		return rec, err
	}
	for _, e := range s.Events(c.StreamID)[c.ExpectedVersion:][:len(c.Events)] {
		s.feed <- e
	}
	return rec, nil
}

func problem(w http.ResponseWriter, code int, typ, detail string, fields []domain.FieldError) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "https://orderd.example/problems/" + typ,
		"title": http.StatusText(code), "status": code, "detail": detail, "errors": fields})
}

func writeErr(w http.ResponseWriter, err error) {
	var ve *domain.ValidationError
	switch {
	case errors.As(err, &ve):
		problem(w, 422, "validation", err.Error(), ve.Fields)
	case errors.Is(err, domain.ErrValidation), errors.Is(err, domain.ErrIdempotencyKeyReused):
		problem(w, 422, "validation", err.Error(), nil)
	case errors.Is(err, domain.ErrNotFound):
		problem(w, 404, "not-found", err.Error(), nil)
	case errors.Is(err, domain.ErrInvalidTransition):
		problem(w, 409, "invalid-transition", err.Error(), nil)
	case errors.Is(err, domain.ErrVersionConflict), errors.Is(err, domain.ErrAlreadyExists):
		problem(w, 409, "conflict", err.Error(), nil)
	default:
		problem(w, 500, "internal", err.Error(), nil)
	}
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("body: %v: %w", err, domain.ErrValidation)
	}
	return nil
}

func (f *fake) execute(w http.ResponseWriter, r *http.Request, id string, cmd domain.Command, code int) {
	res, err := f.svc.Execute(r.Context(), id, cmd, domain.ExecOptions{IdempotencyKey: r.Header.Get("Idempotency-Key")})
	if err != nil {
		writeErr(w, err)
		return
	}
	if res.Replayed {
		f.replayed.Add(1)
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"order_id": res.OrderID, "version": res.Version, "status": res.Status})
}

func (f *fake) place(w http.ResponseWriter, r *http.Request) {
	var b struct {
		OrderID    string        `json:"order_id"`
		CustomerID string        `json:"customer_id"`
		Currency   string        `json:"currency"`
		Items      []domain.Line `json:"items"`
		At         time.Time     `json:"at"`
	}
	if err := decode(r, &b); err != nil {
		writeErr(w, err)
		return
	}
	f.execute(w, r, b.OrderID, domain.PlaceOrder{CustomerID: b.CustomerID, Currency: b.Currency, Items: b.Items,
		At: b.At}, http.StatusCreated)
}

func (f *fake) step(w http.ResponseWriter, r *http.Request) {
	var b struct {
		At     time.Time `json:"at"`
		Reason string    `json:"reason"`
	}
	if err := decode(r, &b); err != nil {
		writeErr(w, err)
		return
	}
	name := r.PathValue("command")
	if b.Reason != "" && name != "cancel" && name != "mark-unavailable" {
		writeErr(w, fmt.Errorf("reason on %s: %w", name, domain.ErrValidation))
		return
	}
	cmd, ok := map[string]domain.Command{"approve": domain.Approve{At: b.At}, "invoice": domain.Invoice{At: b.At},
		"process": domain.StartProcessing{At: b.At}, "ship": domain.Ship{At: b.At}, "deliver": domain.Deliver{At: b.At},
		"cancel": domain.Cancel{At: b.At, Reason: b.Reason}, "mark-unavailable": domain.MarkUnavailable{At: b.At, Reason: b.Reason}}[name]
	if !ok {
		writeErr(w, fmt.Errorf("command %q: %w", name, domain.ErrNotFound))
		return
	}
	f.execute(w, r, r.PathValue("id"), cmd, http.StatusOK)
}

func writeOrder(w http.ResponseWriter, o domain.Order) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(o)
}

func (f *fake) get(w http.ResponseWriter, r *http.Request) {
	o, err := f.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(o.Version, 10)))
	writeOrder(w, o)
}

func (f *fake) summary(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	min, err := strconv.ParseInt(cmp.Or(r.URL.Query().Get("min_version"), "0"), 10, 64)
	if err != nil {
		writeErr(w, fmt.Errorf("min_version: %w", domain.ErrValidation))
		return
	}
	deadline := time.Now().Add(f.wait)
	for {
		f.mu.Lock()
		o, ok := f.summaries[id]
		f.mu.Unlock()
		fresh := ok && o.Version >= min
		if fresh || time.Now().After(deadline) {
			if !ok {
				writeErr(w, fmt.Errorf("summary %s: %w", id, domain.ErrNotFound))
				return
			}
			if !fresh {
				w.Header().Set("X-Read-Model-Stale", "true")
			}
			if id == f.corrupt {
				o.TotalCents++
			}
			w.Header().Set("X-Read-Model-Version", strconv.FormatInt(o.Version, 10))
			writeOrder(w, o)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// dailySales sums the projected summaries placed from to to (both
// included) per day and currency, sorted, as GET /v1/daily-sales does.
func (f *fake) dailySales(w http.ResponseWriter, r *http.Request) {
	from, to := r.URL.Query().Get("from"), r.URL.Query().Get("to")
	f.mu.Lock()
	rows := map[string]*domain.DailySales{}
	for _, o := range f.summaries {
		day := o.PlacedAt.UTC().Format(time.DateOnly)
		if day < from || day > to {
			continue
		}
		k := day + o.Currency
		if rows[k] == nil {
			rows[k] = &domain.DailySales{Day: day, Currency: o.Currency}
		}
		row := rows[k]
		row.OrdersPlaced++
		row.Items += o.ItemCount
		row.GrossCents += o.SubtotalCents
		row.FreightCents += o.FreightCents
		if o.Status == domain.StatusCanceled {
			row.OrdersCanceled++
		}
		if o.Status == domain.StatusUnavailable {
			row.OrdersUnavailable++
		}
	}
	f.mu.Unlock()
	days := []domain.DailySales{}
	for _, k := range slices.Sorted(maps.Keys(rows)) {
		days = append(days, *rows[k])
	}
	if f.salesOff && len(days) > 0 {
		days[0].Items++
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"from": from, "to": to, "days": days})
}

// ---- end to end ----

func TestRunLimit300(t *testing.T) {
	f, ts := newFake(t, func(f *fake) { f.flakyEvery = 25 })
	var bar bytes.Buffer
	rep, err := Run(t.Context(), Config{Data: sample, URL: ts.URL, Limit: 300, Progress: &bar})
	if err != nil {
		t.Fatal(err)
	}
	// 300 orders: 279 delivered, 7 shipped, 6 processing, 4 unavailable,
	// 3 canceled, 1 invoiced; none odd.
	if rep.Orders != 300 || rep.Commands != 1177 || rep.Accepted != 1177 || rep.Replayed != 0 || len(rep.Rejected) != 0 ||
		len(rep.Unexpected) != 0 || rep.Skipped != 0 {
		t.Errorf("sent: %+v", rep)
	}
	if rep.Orders != 300 || rep.Equal != 300 || rep.StatusOK != 300 || len(rep.Mismatches) != 0 || rep.Err() != nil {
		t.Errorf("checked: %+v", rep)
	}
	// The 300th order's day is left out: a larger import may have placed
	// more orders on it.
	last := loadSample(t).Orders[299].PurchasedAt.Format(time.DateOnly)
	if s := rep.Sales; s.Skipped != "" || len(s.Mismatches) != 0 || s.Rows != 94 || s.From != "2016-10-04" || s.To != "2017-04-19" || last <= s.To {
		t.Errorf("daily sales check: %+v, the 300th order placed on %s", s, last)
	}
	for name, oo := range rep.Odd {
		if oo.Orders != 0 {
			t.Errorf("odd path %s: %+v", name, oo)
		}
	}
	if f.failed.Load() == 0 || f.store.EventCount() != 1177 {
		t.Errorf("503s served %d (want some, all retried), events %d (want 1177)", f.failed.Load(), f.store.EventCount())
	}
	if !strings.Contains(bar.String(), "300/300") {
		t.Errorf("progress bar: %q", bar.String())
	}
	var out bytes.Buffer
	if err := rep.Print(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", out.String())

	// A second run appends nothing and gets the same answers.
	out.Reset()
	if err := Main(t.Context(), []string{"-data", sample, "-url", ts.URL, "-limit", "300", "-progress=false"}, &out, &bytes.Buffer{}); err != nil {
		t.Fatalf("second run: %v\n%s", err, out.String())
	}
	if f.store.EventCount() != 1177 || f.replayed.Load() < 1177 {
		t.Errorf("second run: events %d (want 1177), replayed answers %d (want >= 1177)", f.store.EventCount(), f.replayed.Load())
	}
	for _, want := range []string{"orders          300\n", "commands sent   1177: accepted 1177 (idempotent replays 1177), rejected 0 (unexpected 0), skipped 0\n",
		"mismatches 0\n", "day and currency rows: equal to the log folds\n", "result          OK\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("second report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestRunOddPaths imports every non-delivered order of the sample, the
// delivered one without a date, and two rows with their approval removed.
func TestRunOddPaths(t *testing.T) {
	f, ts := newFake(t, nil)
	src, err := os.Open(filepath.Join(sample, OrdersFile))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	all, err := csv.NewReader(src).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	rows := [][]string{all[0]}
	for _, r := range all[1:] {
		switch {
		case r[2] != "delivered" || r[0] == "2d1e2d5bf4dc7227b3bfebb81328c15f":
			rows = append(rows, r)
		case r[0] == "e481f51cbdc54678b7cc49136f2d6af7":
			rows = append(rows, with(with(r, 0, "synthetic-unapproved-delivered"), 4, ""))
		}
		if r[0] == "714fb133a6730ab81fa1d3c1b2007291" {
			rows = append(rows, with(with(r, 0, "synthetic-unapproved-canceled"), 4, ""))
		}
	}
	dir := t.TempDir()
	var b bytes.Buffer
	if err := csv.NewWriter(&b).WriteAll(rows); err != nil {
		t.Fatal(err)
	}
	items, err := os.ReadFile(filepath.Join(sample, ItemsFile))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{OrdersFile: b.Bytes(), ItemsFile: items} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := Run(t.Context(), Config{Data: dir, URL: ts.URL, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_ = rep.Print(&out)
	t.Logf("report:\n%s", out.String())
	wantRejected := map[string]int{"cancel: invalid-transition": 1, "ship: invalid-transition": 2, "deliver: invalid-transition": 1}
	if rep.Orders != 109 || !maps.Equal(rep.Rejected, wantRejected) || len(rep.Unexpected) != 0 || len(rep.Mismatches) != 0 || rep.Err() != nil {
		t.Errorf("orders %d, rejected %v, unexpected %d %v, mismatches %d %v", rep.Orders, rep.Rejected, len(rep.Unexpected),
			rep.Unexpected, len(rep.Mismatches), rep.Mismatches)
	}
	want := map[string]OddOutcome{
		OddApprovalMissing: {2, map[string]int{"ship: invalid-transition": 2, "deliver: invalid-transition": 1},
			map[domain.Status]int{domain.StatusCreated: 1, domain.StatusCanceled: 1}},
		OddCanceledAfterCarrier:  {3, map[string]int{"ship: invalid-transition": 1}, map[domain.Status]int{domain.StatusCanceled: 3}},
		OddCanceledAfterDelivery: {1, map[string]int{"cancel: invalid-transition": 1}, map[domain.Status]int{domain.StatusDelivered: 1}},
		OddDeliveredWithoutDate:  {1, map[string]int{}, map[domain.Status]int{domain.StatusDelivered: 1}},
	}
	for name, w := range want {
		if got := rep.Odd[name]; !reflect.DeepEqual(*got, w) {
			t.Errorf("odd path %s: %+v, want %+v", name, *got, w)
		}
	}
	// The service stamped the delivery without a date at its receive time.
	o, err := f.svc.Get(t.Context(), "2d1e2d5bf4dc7227b3bfebb81328c15f")
	if err != nil || o.DeliveredAt == nil || time.Since(*o.DeliveredAt) > time.Minute {
		t.Errorf("delivered without date: %+v, %v", o.DeliveredAt, err)
	}
}

func TestRunReportsCorruptSummary(t *testing.T) {
	const bad = "7033745709b7cf1bac7d2533663592de" // the oldest order
	_, ts := newFake(t, func(f *fake) { f.corrupt = bad })
	var out, errOut bytes.Buffer
	err := Main(t.Context(), []string{"-data", sample, "-url", ts.URL, "-limit", "50", "-progress=false"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "1 mismatches, 0 unexpected") {
		t.Fatalf("Main: %v, want 1 mismatch", err)
	}
	for _, want := range []string{"read model equal to the log fold 49, status as expected 50, mismatches 1\n",
		"mismatch  " + bad + ": read model differs from the log fold: total_cents: log ", "result          FAILED"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// A daily_sales read model that differs from the log folds is a
// mismatch of its own, named by day and currency with the fields that
// differ, after the check waited for it up to its catch-up bound.
func TestRunReportsDailySalesMismatch(t *testing.T) {
	_, ts := newFake(t, func(f *fake) { f.salesOff = true })
	start := time.Now()
	rep, err := Run(t.Context(), Config{Data: sample, URL: ts.URL, Limit: 50, CatchUp: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("Run took %v, less than its catch-up bound", d)
	}
	if len(rep.Mismatches) != 0 || len(rep.Sales.Mismatches) != 1 || rep.Err() == nil ||
		!strings.Contains(rep.Err().Error(), "1 daily sales mismatches") {
		t.Fatalf("mismatches %d, sales %+v, err %v", len(rep.Mismatches), rep.Sales, rep.Err())
	}
	var out bytes.Buffer
	_ = rep.Print(&out)
	for _, want := range []string{"day and currency rows: mismatches 1\n",
		"  mismatch  " + rep.Sales.From + " BRL: items: log ", "result          FAILED: 0 mismatches, 0 unexpected rejections, 1 daily sales mismatches\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// Without the orders' log folds there is nothing to sum: the daily sales
// check says so instead of reporting the read model.
func TestRunSkipsDailySalesWithoutFolds(t *testing.T) {
	_, ts := newFake(t, nil)
	rep, err := Run(t.Context(), Config{Data: sample, URL: ts.URL, Limit: 5, CheckOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if s := rep.Sales; s.Skipped != "5 orders' log folds could not be read" || len(s.Mismatches) != 0 {
		t.Errorf("daily sales check: %+v", s)
	}
}

func TestRunReportsStaleSummary(t *testing.T) {
	const stuck = "7033745709b7cf1bac7d2533663592de"
	_, ts := newFake(t, func(f *fake) { f.stuck, f.wait = stuck, 50*time.Millisecond })
	start := time.Now()
	rep, err := Run(t.Context(), Config{Data: sample, URL: ts.URL, Limit: 10, CatchUp: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The check kept asking for the stuck summary until its catch-up bound.
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("Run took %v, less than its catch-up bound", d)
	}
	if len(rep.Mismatches) != 1 || rep.Equal != 9 || !strings.Contains(rep.Mismatches[0], "read model stale at version 1, want 4") {
		t.Errorf("mismatches %d %+v, equal %d", len(rep.Mismatches), rep.Mismatches, rep.Equal)
	}
}

func TestRunCheckOnlyEmptyService(t *testing.T) {
	f, ts := newFake(t, nil)
	rep, err := Run(t.Context(), Config{Data: sample, URL: ts.URL, Limit: 5, CheckOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Commands != 0 || f.store.EventCount() != 0 || len(rep.Mismatches) != 5 || rep.Err() == nil ||
		!strings.Contains(rep.Mismatches[0], "404 not-found") {
		t.Errorf("commands %d, events %d, mismatches %d %+v", rep.Commands, f.store.EventCount(), len(rep.Mismatches), rep.Mismatches)
	}
}

func TestRunUnreachable(t *testing.T) {
	ts := httptest.NewServer(http.NotFoundHandler())
	ts.Close() // nothing listens there now
	rep, err := Run(t.Context(), Config{Data: sample, URL: ts.URL, Limit: 1, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Commands != 1 || len(rep.Unexpected) != 1 || rep.Skipped != 3 || rep.Rejected["place: unreachable"] != 1 || len(rep.Mismatches) != 1 {
		t.Errorf("%+v", rep)
	}
}

func TestMainFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := Main(t.Context(), []string{"-h"}, &out, &errOut); !errors.Is(err, flag.ErrHelp) || !strings.Contains(errOut.String(), "Usage: orderd import-olist [flags]") ||
		!strings.Contains(errOut.String(), "or: orderd replay [flags]") ||
		!strings.Contains(errOut.String(), "-check-only") {
		t.Errorf("-h: %v\n%s", err, errOut.String())
	}
	for _, args := range [][]string{{"-nope"}, {"extra"}, {"-concurrency", "0"}, {"-timeout", "0s"},
		{"-url", "ftp://x", "-progress=false"}, {"-data", t.TempDir(), "-progress=false"}, {"-limit", "-1", "-progress=false"}} {
		if err := Main(t.Context(), args, &out, &errOut); err == nil {
			t.Errorf("Main(%q) = nil, want an error", args)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, ts := newFake(t, nil)
	if _, err := Run(ctx, Config{Data: sample, URL: ts.URL}); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a canceled context: %v", err)
	}
}
