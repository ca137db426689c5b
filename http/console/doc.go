// Package console is the operator console: a browser front end to the
// admin API, served under /console/ by the HTTP server (package http).
//
// It is a static shell (one HTML page, one script, one style sheet,
// embedded in the binary, no build step) that holds no data: every figure
// it shows comes from the JSON API, fetched by the script with the admin
// token the operator types in. The token is kept in the browser's session
// storage and sent only in the Authorization header, never in a URL, so
// it appears in no server log, history or Referer. An answer 401 sends the
// operator back to the login form; other errors are shown as the problem
// documents (RFC 9457) the API returns.
//
// Pages (routes in the URL fragment, which never reaches the server):
// projections (lag, apply rate, dead letters, last verify, rebuild and
// error, with a chart of the last minutes sampled by the page), rebuild
// (start, progress, tasks, cancel), verify (start with or without repair,
// the report and both digests), dead letters (list, retry one or all of a
// stream) and order (an order's events beside each read model's document
// and the fold of its log).
package console
