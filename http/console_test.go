package http_test

import (
	"bytes"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/http/console"
	"github.com/orderd/orderd/projector"
)

// routeSet returns a server's routes as "METHOD /path", leaving out
// echo's not-found routes of groups.
func routeSet(srv *orderhttp.Server) []string {
	var out []string
	for _, r := range srv.Routes() {
		if slices.Contains(openAPIMethods, strings.ToLower(r.Method)) {
			out = append(out, r.Method+" "+r.Path)
		}
	}
	slices.Sort(out)
	return out
}

// TestConsoleRoutes: the console adds routes only under /console/ (and
// /console, a redirect there), all GET, and only with the admin routes on; its files are public and hold
// no data; the API data it shows needs the token.
func TestConsoleRoutes(t *testing.T) {
	newServer := func(token string) *orderhttp.Server {
		return orderhttp.NewServer(orderhttp.Config{Commands: domain.NewService(nil, nil), ReadModels: newFakeReads(),
			Admin: newFakeAdmin(), AdminToken: token})
	}
	off, on := routeSet(newServer("")), routeSet(newServer(adminToken))
	var added []string
	for _, r := range on {
		if !slices.Contains(off, r) {
			added = append(added, r)
		}
	}
	var consoleRoutes []string
	for _, r := range added {
		method, path, _ := strings.Cut(r, " ")
		switch {
		case strings.HasPrefix(path, "/v1/admin/"):
		case path == strings.TrimSuffix(console.Prefix, "/") && method == http.MethodGet: // the redirect to the console
		case strings.HasPrefix(path, console.Prefix) && method == http.MethodGet:
			consoleRoutes = append(consoleRoutes, path)
		default:
			t.Errorf("route %s is neither under /v1/admin/ nor a GET under %s", r, console.Prefix)
		}
	}
	for _, r := range off {
		if strings.Contains(r, console.Prefix) {
			t.Errorf("route %s without the admin routes", r)
		}
	}
	// The document's /console/{file} and the page at /console/, which the
	// document names only as index.html.
	if want := []string{console.Prefix, console.Prefix + ":file"}; !slices.Equal(consoleRoutes, want) {
		t.Errorf("console routes %v, want %v", consoleRoutes, want)
	}
	// The page (at /console/ and index.html), its script and style sheet.
	paths := []string{console.Prefix, console.Prefix + "index.html", console.Prefix + "console.js", console.Prefix + "console.css"}

	// Two servers with different data serve the same bytes: the files
	// carry no data. They need no token and carry no token either.
	a := newAdminEnv(t, adminToken)
	b := newAdminEnv(t, adminToken)
	b.admin.statuses[0].LastError = "connection reset"
	b.admin.letters = append(b.admin.letters, projector.DeadLetter{ID: "order_summaries:ev-1", Projection: "order_summaries", StreamID: "o-secret"})
	for _, p := range paths {
		ra, rb := a.get(t, p), b.get(t, p)
		if ra.Code != http.StatusOK || rb.Code != http.StatusOK {
			t.Errorf("GET %s: %d and %d, want 200 without a token", p, ra.Code, rb.Code)
			continue
		}
		if !bytes.Equal(ra.Body.Bytes(), rb.Body.Bytes()) || ra.Body.Len() == 0 {
			t.Errorf("GET %s: the two servers answer differently (%d and %d bytes)", p, ra.Body.Len(), rb.Body.Len())
		}
		for _, secret := range []string{adminToken, "o-secret", "connection reset"} {
			if strings.Contains(ra.Body.String(), secret) || strings.Contains(rb.Body.String(), secret) {
				t.Errorf("GET %s: the body holds %q", p, secret)
			}
		}
		if csp := ra.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", p, csp)
		}
		if rp := ra.Header().Get("Referrer-Policy"); rp != "no-referrer" {
			t.Errorf("GET %s: Referrer-Policy %q", p, rp)
		}
	}
	wantNoCalls(t, a.admin)
	wantNoCalls(t, b.admin)

	// Every admin route the console calls answers 401 without the token.
	for _, r := range adminRoutes {
		rec := a.do(t, req{Method: r.Method, Path: r.Path, Body: r.Body})
		wantProblem(t, rec, http.StatusUnauthorized, "/problems/unauthorized")
	}
	wantNoCalls(t, a.admin)

	// /console, as people type it, leads to the console.
	if rec := a.get(t, "/console"); rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != console.Prefix {
		t.Errorf("GET /console: %d to %q, want 301 to %s", rec.Code, rec.Header().Get("Location"), console.Prefix)
	}

	// Nothing else is served under /console/.
	for _, p := range []string{"/console/index", "/console/static/console.js", "/console/../openapi.json",
		"/console/x", "/console/console.js/"} {
		if rec := a.get(t, p); rec.Code == http.StatusOK && p != "/console/../openapi.json" {
			t.Errorf("GET %s: 200", p)
		}
	}
	if rec := a.do(t, req{Method: http.MethodPost, Path: console.Prefix}); rec.Code < 400 {
		t.Errorf("POST %s: %d", console.Prefix, rec.Code)
	}
}
