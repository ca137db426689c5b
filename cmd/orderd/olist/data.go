package olist

import (
	"bufio"
	"cmp"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/orderd/orderd/domain"
)

// The files Load reads, relative to the data directory.
const (
	OrdersFile = "olist_orders_dataset.csv"
	ItemsFile  = "olist_order_items_dataset.csv"
)

// timeLayout is the dataset's timestamp format; the zone is taken as UTC.
const timeLayout = "2006-01-02 15:04:05"

// Order is one row of the orders file. Times are UTC (see the package doc);
// a zero time means the step did not happen.
type Order struct {
	ID, CustomerID string
	Status         domain.Status
	PurchasedAt    time.Time
	ApprovedAt     time.Time
	CarrierAt      time.Time // order_delivered_carrier_date
	DeliveredAt    time.Time // order_delivered_customer_date
}

// Item is one row of the items file. Seq is order_item_id (1-based within
// the order); amounts are BRL cents.
type Item struct {
	OrderID, ProductID       string
	Seq                      int
	PriceCents, FreightCents int64
}

// Dataset is a loaded sample: Orders sorted by purchase time, then id;
// Items in file order (never empty).
type Dataset struct {
	Orders  []Order
	Items   []Item
	byOrder map[string][]Item // each order's rows, in order_item_id order
}

// Load reads OrdersFile and ItemsFile from dir. Errors name the file and
// line: a missing column, a malformed id, status, timestamp or amount, a
// duplicate order id, or an empty items file.
func Load(dir string) (*Dataset, error) {
	d := &Dataset{byOrder: map[string][]Item{}}
	seen := map[string]bool{}
	err := readCSV(dir, OrdersFile, []string{"order_id", "customer_id", "order_status",
		"order_purchase_timestamp", "order_approved_at", "order_delivered_carrier_date",
		"order_delivered_customer_date"}, func(f []string) error {
		o := Order{ID: f[0], CustomerID: f[1], Status: domain.Status(f[2])}
		if err := validIDs(f[0], f[1]); err != nil {
			return err
		}
		if seen[o.ID] {
			return fmt.Errorf("order %s appears twice", o.ID)
		}
		seen[o.ID] = true
		if !domain.ValidStatus(f[2]) {
			return fmt.Errorf("order_status %q is not one of %v", f[2], domain.Statuses)
		}
		var err error
		for i, t := range []*time.Time{&o.PurchasedAt, &o.ApprovedAt, &o.CarrierAt, &o.DeliveredAt} {
			if *t, err = parseTime(f[3+i]); err != nil {
				return err
			}
		}
		if o.PurchasedAt.IsZero() {
			return errors.New("order_purchase_timestamp is empty")
		}
		d.Orders = append(d.Orders, o)
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = readCSV(dir, ItemsFile, []string{"order_id", "order_item_id", "product_id", "price",
		"freight_value"}, func(f []string) error {
		if err := validIDs(f[0], f[2]); err != nil {
			return err
		}
		it := Item{OrderID: f[0], ProductID: f[2]}
		var err error
		if it.Seq, err = strconv.Atoi(f[1]); err != nil || it.Seq < 1 {
			return fmt.Errorf("order_item_id %q is not a positive integer", f[1])
		}
		if it.PriceCents, err = ParseCents(f[3]); err != nil {
			return fmt.Errorf("price: %w", err)
		}
		if it.FreightCents, err = ParseCents(f[4]); err != nil {
			return fmt.Errorf("freight_value: %w", err)
		}
		d.Items = append(d.Items, it)
		d.byOrder[it.OrderID] = append(d.byOrder[it.OrderID], it)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(d.Items) == 0 {
		return nil, fmt.Errorf("%s: no rows: a line cannot be chosen for orders without items", ItemsFile)
	}
	for _, its := range d.byOrder {
		slices.SortStableFunc(its, func(a, b Item) int { return cmp.Compare(a.Seq, b.Seq) })
	}
	slices.SortFunc(d.Orders, func(a, b Order) int {
		return cmp.Or(a.PurchasedAt.Compare(b.PurchasedAt), cmp.Compare(a.ID, b.ID))
	})
	return d, nil
}

// readCSV calls row for each record of dir/name with the fields of cols, in
// that order. Errors are prefixed "name:line: ".
func readCSV(dir, name string, cols []string, row func(f []string) error) error {
	file, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	defer file.Close()
	r := csv.NewReader(bufio.NewReader(file))
	header, err := r.Read()
	if err != nil {
		return fmt.Errorf("%s: header: %w", name, err)
	}
	header[0] = strings.TrimPrefix(header[0], "\ufeff")
	idx := make([]int, len(cols))
	for i, c := range cols {
		if idx[i] = slices.Index(header, c); idx[i] < 0 {
			return fmt.Errorf("%s:1: no column %q", name, c)
		}
	}
	f := make([]string, len(cols))
	for {
		rec, err := r.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err) // *csv.ParseError says the line
		}
		line, _ := r.FieldPos(0)
		for i, j := range idx {
			f[i] = rec[j]
		}
		if err := row(f); err != nil {
			return fmt.Errorf("%s:%d: %w", name, line, err)
		}
	}
}

func validIDs(ids ...string) error {
	for _, id := range ids {
		if err := domain.ValidateID("id", id); err != nil {
			return err
		}
	}
	return nil
}

// parseTime parses a dataset timestamp as UTC; "" is the zero time.
func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("timestamp %q is not like %q", s, timeLayout)
	}
	return t, nil
}

// amount is what ParseCents accepts: 1 to 13 ASCII digits, then
// optionally a dot and 1 or 2 digits.
var amount = regexp.MustCompile(`^[0-9]{1,13}(\.[0-9]{1,2})?$`)

// ParseCents parses a non-negative decimal amount with at most two decimals
// ("58.90", "58.9", "58") into integer minor units (5890, 5890, 5800)
// without floating point. It rejects signs, spaces, exponents, empty parts
// ("58.", ".90"), more than two decimals and more than 13 integer digits.
func ParseCents(s string) (int64, error) {
	if !amount.MatchString(s) {
		return 0, fmt.Errorf("%q is not an amount like 58.90 (digits, at most two decimals)", s)
	}
	whole, frac, _ := strings.Cut(s, ".")
	n, err := strconv.ParseInt(whole+frac+"00"[len(frac):], 10, 64) // at most 15 digits: fits
	if err != nil {
		return 0, fmt.Errorf("amount %q: %w", s, err)
	}
	return n, nil
}
