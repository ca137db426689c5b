package main

import "net/url"

// redact hides the password of a connection string for logs.
func redact(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return "(unparsable URI)"
	}
	return u.Redacted()
}
