package http

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/go-playground/validator/v10"
	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/domain"
)

// placeRequest is the body of POST /v1/orders. Amounts are minor units.
// freight_cents is an optional whole-order charge on top of the lines'
// own freight_cents.
type placeRequest struct {
	OrderID      string        `json:"order_id" validate:"omitempty,id"`
	CustomerID   string        `json:"customer_id" validate:"required,id"`
	Currency     string        `json:"currency" validate:"required,len=3,uppercase,alpha"`
	Items        []itemRequest `json:"items" validate:"required,min=1,max=500,dive"`
	FreightCents int64         `json:"freight_cents" validate:"min=0,max=1000000000000"`
	At           string        `json:"at" validate:"omitempty,rfc3339"`
}

// itemRequest is one line: unit_price_cents per unit, the optional
// freight_cents for the whole line (Olist's freight_value per item).
type itemRequest struct {
	SKU            string `json:"sku" validate:"required,id"`
	Quantity       int64  `json:"quantity" validate:"required,min=1,max=1000000"`
	UnitPriceCents *int64 `json:"unit_price_cents" validate:"required,min=0,max=1000000000000"`
	FreightCents   int64  `json:"freight_cents" validate:"min=0,max=1000000000000"`
}

// stepRequest is the optional body of approve, invoice, process, ship and
// deliver; reasonRequest of cancel and mark-unavailable.
type stepRequest struct {
	At string `json:"at" validate:"omitempty,rfc3339"`
}

type reasonRequest struct {
	At     string `json:"at" validate:"omitempty,rfc3339"`
	Reason string `json:"reason" validate:"max=500"`
}

// lifecycle maps each lifecycle route to its body decoder.
var lifecycle = map[string]func(c echo.Context) (domain.Command, error){
	"approve": step(func(at time.Time) domain.Command { return domain.Approve{At: at} }),
	"invoice": step(func(at time.Time) domain.Command { return domain.Invoice{At: at} }),
	"process": step(func(at time.Time) domain.Command { return domain.StartProcessing{At: at} }),
	"ship":    step(func(at time.Time) domain.Command { return domain.Ship{At: at} }),
	"deliver": step(func(at time.Time) domain.Command { return domain.Deliver{At: at} }),
	"cancel": reason(func(at time.Time, r string) domain.Command {
		return domain.Cancel{At: at, Reason: r}
	}),
	"mark-unavailable": reason(func(at time.Time, r string) domain.Command {
		return domain.MarkUnavailable{At: at, Reason: r}
	}),
}

func step(make func(time.Time) domain.Command) func(echo.Context) (domain.Command, error) {
	return func(c echo.Context) (domain.Command, error) {
		var req stepRequest
		if err := decode(c, &req, true); err != nil {
			return nil, err
		}
		return make(parseTime(req.At)), nil
	}
}

func reason(make func(time.Time, string) domain.Command) func(echo.Context) (domain.Command, error) {
	return func(c echo.Context) (domain.Command, error) {
		var req reasonRequest
		if err := decode(c, &req, true); err != nil {
			return nil, err
		}
		return make(parseTime(req.At), req.Reason), nil
	}
}

// parseTime parses a validated RFC 3339 time; "" is the zero time (the
// service then uses its receive time).
func parseTime(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

func (s *Server) place(c echo.Context) error {
	var req placeRequest
	if err := decode(c, &req, false); err != nil {
		return err
	}
	cmd := domain.PlaceOrder{CustomerID: req.CustomerID, Currency: req.Currency, FreightCents: req.FreightCents, At: parseTime(req.At)}
	for _, it := range req.Items {
		cmd.Items = append(cmd.Items, domain.Line{SKU: it.SKU, Quantity: it.Quantity, UnitPriceCents: *it.UnitPriceCents,
			FreightCents: it.FreightCents})
	}
	res, err := s.execute(c, req.OrderID, cmd)
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderLocation, "/v1/orders/"+res.OrderID)
	return respond(c, http.StatusCreated, res)
}

func (s *Server) lifecycle(name string, decodeBody func(echo.Context) (domain.Command, error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		cmd, err := decodeBody(c)
		if err != nil {
			return err
		}
		res, err := s.execute(c, c.Param("id"), cmd)
		if err != nil {
			return err
		}
		return respond(c, http.StatusOK, res)
	}
}

// execute reads the command headers and runs cmd.
func (s *Server) execute(c echo.Context, orderID string, cmd domain.Command) (domain.Result, error) {
	opt, err := commandOptions(c)
	if err != nil {
		return domain.Result{}, err
	}
	start := time.Now()
	res, err := s.cfg.Commands.Execute(c.Request().Context(), orderID, cmd, opt)
	s.metrics.command(domain.CommandName(cmd), res, err, time.Since(start))
	return res, err
}

func respond(c echo.Context, status int, res domain.Result) error {
	h := c.Response().Header()
	h.Set("ETag", etag(res.Version))
	if res.Replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	return c.JSON(status, map[string]any{"order_id": res.OrderID, "version": res.Version, "status": res.Status})
}

func etag(v int64) string { return `"` + strconv.FormatInt(v, 10) + `"` }

// commandOptions reads Idempotency-Key, If-Match and X-Correlation-ID. A
// malformed header is a validation error (422). A weak If-Match tag,
// W/"<version>", is well formed but wraps domain.ErrPreconditionFailed
// (412): If-Match uses the strong comparison (RFC 9110 §13.1.1), under
// which a weak tag matches no version, whatever the order's state.
func commandOptions(c echo.Context) (domain.ExecOptions, error) {
	h := c.Request().Header
	opt := domain.ExecOptions{CommandID: c.Response().Header().Get(echo.HeaderXRequestID)}
	if k := h.Get("Idempotency-Key"); k != "" {
		if !token(k, 128) {
			return opt, invalid(domain.FieldError{Field: "Idempotency-Key", Detail: "1 to 128 visible ASCII characters"})
		}
		opt.IdempotencyKey = k
	}
	var weak string
	if m := h.Get("If-Match"); m != "" {
		tag, isWeak := strings.CutPrefix(m, "W/")
		v, err := strconv.ParseInt(strings.Trim(tag, `"`), 10, 64)
		if err != nil || v < 0 {
			return opt, invalid(domain.FieldError{Field: "If-Match", Detail: `an entity tag "<version>" as sent in ETag`})
		}
		if isWeak {
			weak = m
		}
		opt.IfMatch = &v
	}
	if id := h.Get("X-Correlation-ID"); id != "" {
		if !token(id, 128) {
			return opt, invalid(domain.FieldError{Field: "X-Correlation-ID", Detail: "1 to 128 visible ASCII characters"})
		}
		opt.CorrelationID = id
	}
	// Checked last: a precondition is evaluated only on an otherwise
	// valid request (RFC 9110 §13.2.1).
	if weak != "" {
		return opt, fmt.Errorf("If-Match %s: a weak entity tag never matches (If-Match compares strong tags only, RFC 9110 §13.1.1): %w",
			weak, domain.ErrPreconditionFailed)
	}
	return opt, nil
}

func token(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

var validate = func() *validator.Validate {
	v := validator.New(validator.WithRequiredStructEnabled())
	v.RegisterTagNameFunc(func(f reflect.StructField) string {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		return name
	})
	_ = v.RegisterValidation("id", func(fl validator.FieldLevel) bool {
		return domain.ValidateID("id", fl.Field().String()) == nil
	})
	_ = v.RegisterValidation("rfc3339", func(fl validator.FieldLevel) bool {
		_, err := time.Parse(time.RFC3339Nano, fl.Field().String())
		return err == nil
	})
	return v
}()

// decode reads a JSON body strictly (unknown fields and trailing data are
// errors) and validates it. An empty body is allowed when optional.
func decode(c echo.Context, dst any, optional bool) error {
	req := c.Request()
	body, err := io.ReadAll(req.Body)
	if err != nil {
		var he *echo.HTTPError
		if errors.As(err, &he) {
			return he // body limit
		}
		return malformed("reading the body: " + err.Error())
	}
	trimmed := bytes.Trim(body, jsonSpace)
	if len(trimmed) == 0 {
		if optional {
			return nil
		}
		return malformed("a JSON body is required")
	}
	if ct := req.Header.Get(echo.HeaderContentType); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != echo.MIMEApplicationJSON && !strings.HasSuffix(mt, "+json")) {
			return echo.NewHTTPError(http.StatusUnsupportedMediaType, "the body must be application/json")
		}
	} else {
		return echo.NewHTTPError(http.StatusUnsupportedMediaType, "the body must be application/json")
	}
	if trimmed[0] != '{' {
		return malformed("the body must be a JSON object")
	}
	if err := checkKeys(body); err != nil {
		return malformed(err.Error())
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return invalid(domain.FieldError{Field: te.Field, Detail: "must be " + jsonKind(te.Type.Kind())})
		}
		return malformed("invalid JSON: " + err.Error())
	}
	if len(bytes.Trim(body[dec.InputOffset():], jsonSpace)) > 0 {
		return malformed("invalid JSON: data after the object")
	}
	if err := validate.Struct(dst); err != nil {
		var ve validator.ValidationErrors
		if !errors.As(err, &ve) {
			return malformed(err.Error())
		}
		fields := make([]domain.FieldError, len(ve))
		for i, fe := range ve {
			fields[i] = domain.FieldError{Field: fieldPath(fe.Namespace()), Detail: describe(fe)}
		}
		return invalid(fields...)
	}
	return nil
}

// checkKeys refuses what encoding/json would silently accept: a field
// given twice (the last would win) and a field name in other case than
// the API's lower-case names (encoding/json matches them case-blind).
// Syntax errors are left to the decoder.
func checkKeys(body []byte) error {
	type frame struct {
		object, wantKey bool
		keys            map[string]bool
	}
	var stack []*frame
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			if t == '{' || t == '[' {
				stack = append(stack, &frame{object: t == '{', wantKey: t == '{', keys: map[string]bool{}})
				continue
			}
			stack = stack[:len(stack)-1]
		case string:
			if top != nil && top.object && top.wantKey {
				switch {
				case t != strings.ToLower(t):
					return fmt.Errorf("field %q: field names are lower case", t)
				case top.keys[t]:
					return fmt.Errorf("field %q is given twice", t)
				}
				top.keys[t], top.wantKey = true, false
				continue
			}
		}
		// A value ended: the enclosing object expects a key next.
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].wantKey = true
		}
	}
}

// jsonSpace is the white space JSON allows between tokens (RFC 8259 §2);
// bytes.TrimSpace would also take \v, \f and Unicode spaces.
const jsonSpace = " \t\r\n"

// jsonKind names a Go kind the way a JSON client thinks of it.
func jsonKind(k reflect.Kind) string {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number within range"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Bool:
		return "true or false"
	}
	return "of another type"
}

// fieldPath turns "placeRequest.items[0].sku" into "items[0].sku".
func fieldPath(ns string) string {
	_, rest, ok := strings.Cut(ns, ".")
	if !ok {
		return ns
	}
	return rest
}

func describe(fe validator.FieldError) string {
	switch fe.Tag() {
	case "required":
		return "is required"
	case "id":
		return fmt.Sprintf("1 to %d letters, digits, '_' or '-'", domain.MaxIDLength)
	case "rfc3339":
		return "an RFC 3339 time, e.g. 2017-10-02T10:56:33Z"
	case "len":
		return "must have length " + fe.Param()
	case "min":
		return "must be at least " + fe.Param()
	case "max":
		return "must be at most " + fe.Param()
	case "uppercase", "alpha":
		return "an ISO 4217 code: three upper-case letters"
	}
	return "fails " + fe.Tag()
}

func (s *Server) getOrder(c echo.Context) error {
	o, err := s.cfg.Commands.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return notFoundIfInvalid(err)
	}
	c.Response().Header().Set("ETag", etag(o.Version))
	return c.JSON(http.StatusOK, o)
}

func (s *Server) getEvents(c echo.Context) error {
	o, events, err := s.cfg.Commands.Events(c.Request().Context(), c.Param("id"))
	if err != nil {
		return notFoundIfInvalid(err)
	}
	out := make([]json.RawMessage, len(events))
	for i, e := range events {
		if out[i], err = domain.MarshalEvent(e); err != nil {
			return err
		}
	}
	c.Response().Header().Set("ETag", etag(o.Version))
	return c.JSON(http.StatusOK, map[string]any{"order_id": o.ID, "version": o.Version, "events": out})
}

// notFoundIfInvalid answers a GET with an id that cannot exist as 404: the
// id was checked before any query and there is nothing to find.
func notFoundIfInvalid(err error) error {
	if errors.Is(err, domain.ErrValidation) {
		return fmt.Errorf("%v: %w", err, domain.ErrNotFound)
	}
	return err
}
