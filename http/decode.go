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
	"strings"
	"time"

	"github.com/go-playground/validator/v10"
	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/domain"
)

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
	// A missing Content-Type is no media type either: ParseMediaType refuses "".
	if mt, _, err := mime.ParseMediaType(req.Header.Get(echo.HeaderContentType)); err != nil ||
		(mt != echo.MIMEApplicationJSON && !strings.HasSuffix(mt, "+json")) {
		return echo.NewHTTPError(http.StatusUnsupportedMediaType, "the body must be application/json")
	}
	if trimmed[0] != '{' {
		return malformed("the body must be a JSON object")
	}
	if _, err := scanKeys(body, -1); err != nil {
		return malformed(err.Error())
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			// te.Field leaves out the array indexes (items.quantity); the
			// validator's paths have them (items[0].quantity).
			field, _ := scanKeys(body, te.Offset)
			if field == "" {
				field = te.Field
			}
			return invalid(domain.FieldError{Field: field, Detail: "must be " + jsonKind(te.Type.Kind())})
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

// scanKeys reads body, a JSON object, token by token. It refuses what
// encoding/json would silently accept: a field given twice (the last
// would win) and a field name in other case than the API's lower-case
// names (encoding/json matches them case-blind); syntax errors are left
// to the decoder. With offset >= 0 it returns, once the scan gets there,
// the path of the value of body that ends at offset (a string, number,
// true, false or null) or opens there (an object or array), as the
// validator writes paths: items[0].quantity; "" when no value does. The
// decoder's type errors give their offsets so
// (json.UnmarshalTypeError.Offset).
func scanKeys(body []byte, offset int64) (string, error) {
	type frame struct {
		array   bool
		key     string          // the member being read, in an object
		keys    map[string]bool // the object's members so far
		index   int             // the element being read, in an array
		wantKey bool            // an object's next token is a key (or its end)
	}
	var stack []*frame
	path := func() string {
		var b strings.Builder
		for _, f := range stack {
			switch {
			case f.array:
				fmt.Fprintf(&b, "[%d]", f.index)
			case b.Len() > 0:
				b.WriteString("." + f.key)
			default:
				b.WriteString(f.key)
			}
		}
		return b.String()
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", nil
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && !stack[len(stack)-1].array {
				stack[len(stack)-1].wantKey = true
			}
			continue
		}
		if top != nil && top.wantKey {
			key, _ := tok.(string)
			switch {
			case key != strings.ToLower(key):
				return "", fmt.Errorf("field %q: field names are lower case", key)
			case top.keys[key]:
				return "", fmt.Errorf("field %q is given twice", key)
			}
			top.key, top.keys[key], top.wantKey = key, true, false
			continue
		}
		if top != nil && top.array {
			top.index++
		}
		if offset >= 0 && dec.InputOffset() == offset {
			return path(), nil
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{array: true, index: -1})
		default:
			if top != nil && !top.array {
				top.wantKey = true
			}
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
