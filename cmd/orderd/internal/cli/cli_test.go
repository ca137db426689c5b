package cli

import "testing"

// TestServiceURL: the subcommands find the service where the server was
// told to listen, without a flag.
func TestServiceURL(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{nil, "http://127.0.0.1:8080"},
		{map[string]string{"ORDERD_HTTP_ADDR": "127.0.0.1:9191"}, "http://127.0.0.1:9191"},
		{map[string]string{"ORDERD_HTTP_ADDR": ":9191"}, "http://127.0.0.1:9191"},
		{map[string]string{"ORDERD_HTTP_ADDR": "0.0.0.0:9191"}, "http://127.0.0.1:9191"},
		{map[string]string{"ORDERD_HTTP_ADDR": "[::1]:9191"}, "http://[::1]:9191"},
		{map[string]string{"ORDERD_HTTP_ADDR": ":9191", "ORDERD_URL": "http://orderd.internal"}, "http://orderd.internal"},
		{map[string]string{"ORDERD_HTTP_ADDR": "no port"}, "http://127.0.0.1:8080"},
	} {
		if got := ServiceURL(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("ServiceURL(%v) = %s, want %s", tc.env, got, tc.want)
		}
	}
}
