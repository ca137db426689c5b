package http

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
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

// decode reads a JSON body strictly and validates it. An empty body is
// allowed when optional. Malformed (400) is a body that is not one JSON
// object, a field given twice, an unknown field or one in other case
// than the API's lower-case names (encoding/json would take the last of
// two, and match names case-blind); invalid (422) a value of another type
// than its field's, under its path as the validator writes paths
// (items[0].quantity), and what the validator refuses.
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
	// JSON v2 refuses duplicate names and data after the value, and
	// matches names case-sensitively; strings that are not UTF-8 become
	// U+FFFD, as with encoding/json. The syntax is checked as a whole
	// first: a body that is not JSON is malformed whatever its values.
	opts := json.JoinOptions(json.RejectUnknownMembers(true), jsontext.AllowInvalidUTF8(true))
	if err := json.Unmarshal(body, new(jsontext.Value), opts); err != nil {
		return malformed("invalid JSON: " + strings.TrimPrefix(err.Error(), "jsontext: "))
	}
	if err := json.Unmarshal(body, dst, opts); err != nil {
		var se *json.SemanticError
		switch {
		case errors.As(err, &se) && errors.Is(se.Err, json.ErrUnknownName):
			return malformed(fmt.Sprintf("unknown field %s (field names are lower case)", pointerPath(se.JSONPointer)))
		case errors.As(err, &se) && se.GoType != nil:
			return invalid(domain.FieldError{Field: pointerPath(se.JSONPointer), Detail: "must be " + jsonKind(se.GoType.Kind())})
		}
		return malformed("invalid JSON: " + err.Error())
	}
	if err := validate.Struct(dst); err != nil {
		var ve validator.ValidationErrors
		if !errors.As(err, &ve) {
			return malformed(err.Error())
		}
		fields := make([]domain.FieldError, len(ve))
		for i, fe := range ve {
			// "placeRequest.items[0].sku" is items[0].sku.
			_, field, _ := strings.Cut(fe.Namespace(), ".")
			fields[i] = domain.FieldError{Field: field, Detail: describe(fe)}
		}
		return invalid(fields...)
	}
	return nil
}

// pointerPath writes a JSON pointer (RFC 6901) into a request body as the
// validator writes paths: /items/0/quantity is items[0].quantity (the
// bodies have arrays, never maps, so a number is an index).
func pointerPath(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		switch _, err := strconv.Atoi(tok); {
		case err == nil:
			b.WriteString("[" + tok + "]")
		case b.Len() > 0:
			b.WriteString("." + tok)
		default:
			b.WriteString(tok)
		}
	}
	return b.String()
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
