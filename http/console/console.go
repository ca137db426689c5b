package console

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// Prefix is the path every console route starts with; the page is at
// Prefix itself, where its relative links resolve, and at Prefix+"index.html".
const Prefix = "/console/"

// files maps each path to the embedded file it serves and its media type.
var files = map[string]struct{ name, contentType string }{
	Prefix:                 {"static/index.html", "text/html; charset=utf-8"},
	Prefix + "index.html":  {"static/index.html", "text/html; charset=utf-8"},
	Prefix + "console.js":  {"static/console.js", "text/javascript; charset=utf-8"},
	Prefix + "console.css": {"static/console.css", "text/css; charset=utf-8"},
}

// securityHeaders keep the shell from loading anything but its own files
// and from being framed, and keep URLs out of Referer headers.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
		"connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
	"Referrer-Policy":        "no-referrer",
	"X-Content-Type-Options": "nosniff",
	"X-Frame-Options":        "DENY",
	"Cache-Control":          "no-cache",
}

// Handler serves the console's files to GET (the page at Prefix and at
// Prefix+"index.html", console.js and console.css under Prefix), and 404
// elsewhere. The files are the same for every request and carry no data.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := files[r.URL.Path]
		if !ok || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		b, err := fs.ReadFile(static, f.name)
		if err != nil {
			http.Error(w, "console asset missing", http.StatusInternalServerError)
			return
		}
		for k, v := range securityHeaders {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", f.contentType)
		_, _ = w.Write(b)
	})
}
