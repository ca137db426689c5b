package console_test

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/orderd/orderd/http/console"
)

// TestHandler serves each file with its media type and the security
// headers, and nothing else.
func TestHandler(t *testing.T) {
	h := console.Handler()
	types := map[string]string{"/console/": "text/html", "/console/index.html": "text/html", "/console/console.js": "text/javascript", "/console/console.css": "text/css"}
	for p := range types {
		if !strings.HasPrefix(p, console.Prefix) {
			t.Errorf("path %s is not under %s", p, console.Prefix)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		if rec.Code != http.StatusOK || rec.Body.Len() < 100 {
			t.Errorf("GET %s: %d, %d bytes", p, rec.Code, rec.Body.Len())
		}
		if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, types[p]) {
			t.Errorf("GET %s: Content-Type %q, want %s", p, ct, types[p])
		}
		if rec.Header().Get("X-Content-Type-Options") != "nosniff" || rec.Header().Get("X-Frame-Options") != "DENY" {
			t.Errorf("GET %s: headers %v", p, rec.Header())
		}
	}
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/console/index"}, {http.MethodGet, "/console/static/console.js"}, {http.MethodGet, "/other"},
		{http.MethodPost, "/console/"}, {http.MethodDelete, "/console/console.js"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(r.method, r.path, nil))
		if rec.Code != http.StatusNotFound {
			t.Errorf("%s %s: %d, want 404", r.method, r.path, rec.Code)
		}
	}
}

// TestShell: the page loads only its own script and style sheet (no
// CDN), and its login field cannot put the token in a URL: the field has
// no name, so no form submission carries it.
func TestShell(t *testing.T) {
	rec := httptest.NewRecorder()
	console.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, console.Prefix, nil))
	page := rec.Body.String()
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"#]+)"`).FindAllStringSubmatch(page, -1) {
		if m[1] != "console.js" && m[1] != "console.css" {
			t.Errorf("the page loads %q", m[1])
		}
	}
	field := regexp.MustCompile(`<input id="token"[^>]*>`).FindString(page)
	if field == "" || strings.Contains(field, "name=") || !strings.Contains(field, `type="password"`) {
		t.Errorf("token field %q: want a password field without a name", field)
	}

	rec = httptest.NewRecorder()
	console.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, console.Prefix+"console.js", nil))
	// The SVG namespace is a name, not a URL the page fetches.
	script := strings.ReplaceAll(rec.Body.String(), "'http://www.w3.org/2000/svg'", "")
	for _, bad := range []string{"localStorage", "innerHTML", "eval(", "http://", "https://"} {
		if strings.Contains(script, bad) {
			t.Errorf("the script uses %q", bad)
		}
	}
	if !strings.Contains(script, "sessionStorage") || !strings.Contains(script, "'Bearer ' + t") {
		t.Error("the script does not keep the token in sessionStorage and send it as a bearer token")
	}
}
