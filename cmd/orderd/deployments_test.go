package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
	"gopkg.in/yaml.v3"

	orderhttp "github.com/orderd/orderd/http"
)

// The deployment files (deployments/) are checked offline: nothing is
// started. The checks hold the files to what the program reads (the
// settings bind reads, Validate, the routes of the HTTP server) and to each
// other (ports, selectors, names).

// deploymentsDir is deployments/ as seen from this package's directory.
const deploymentsDir = "../../deployments"

// TestDeployments runs every check on the committed files.
func TestDeployments(t *testing.T) {
	names, err := deployEnvNames()
	if err != nil {
		t.Fatalf("bind with an empty environment: %v", err)
	}
	for _, n := range []string{"ORDERD_HTTP_ADDR", "MONGODB_URI", "NATS_URL", "ORDERD_ROLES", "ADMIN_TOKEN"} {
		if !names[n] {
			t.Fatalf("bind did not read %s; the recording getenv misses settings", n)
		}
	}
	errs := checkDeployments(deploymentsDir)
	for _, e := range errs {
		t.Error(e)
	}
}

// TestDeploymentsChecksCatchBreaks breaks a copy of the files one way at a
// time and requires the checks to report it, so that none of them passes
// vacuously.
func TestDeploymentsChecksCatchBreaks(t *testing.T) {
	cases := []struct {
		name, file, old, new, want string
	}{
		{"yaml syntax", "kubernetes/secret.yaml", "type: Opaque\n", "type: Opaque\n  oops: [\n", "does not parse"},
		{"unknown compose variable", "compose.yaml", "ORDERD_LOG_LEVEL: info", "ORDERD_LOG_LEVL: info", "ORDERD_LOG_LEVL is not a setting orderd reads"},
		{"invalid compose role", "compose.yaml", "ORDERD_ROLES: api\n", "ORDERD_ROLES: api,relais\n", `role "relais"`},
		{"compose api beside the relay", "compose.yaml", "ORDERD_ROLES: api\n", "ORDERD_ROLES: api,relay\n", "unready while NATS is down"},
		{"kubernetes api beside the relay", "kubernetes/api.yaml", "value: api\n", "value: api,relay\n", "unready while NATS is down"},
		{"compose number", "compose.yaml", `ORDERD_STREAM_REPLICAS: "3"`, `ORDERD_STREAM_REPLICAS: "three"`, "not a number"},
		{"compose replicas beyond the cluster", "compose.yaml", `ORDERD_STREAM_REPLICAS: "3"`, `ORDERD_STREAM_REPLICAS: "5"`, "JetStream servers"},
		{"compose healthcheck route", "compose.yaml", `/readyz"]`, `/ready"]`, "GET /ready answered 404"},
		{"compose healthcheck on liveness only", "compose.yaml", `/readyz"]`, `/healthz"]`, "does not call /readyz"},
		{"compose published port", "compose.yaml", `"127.0.0.1:8081:8080"`, `"127.0.0.1:8081:8090"`, "container port 8090"},
		{"compose http addr loopback", "compose.yaml", "ORDERD_HTTP_ADDR: 0.0.0.0:8080", "ORDERD_HTTP_ADDR: 127.0.0.1:8080", "loopback"},
		{"compose instance ids", "compose.yaml", "ORDERD_INSTANCE_ID: projector-2", "ORDERD_INSTANCE_ID: projector-1", "ORDERD_INSTANCE_ID projector-1 is also service projector-1's"},
		{"compose replica set name", "compose.yaml", "/?replicaSet=rs0", "/?replicaSet=rs1", `replicaSet "rs1"`},
		{"compose mongo host", "compose.yaml", "mongodb://mongo-1:27017,", "mongodb://mongo-9:27017,", "mongo-9"},
		{"compose nats host", "compose.yaml", "NATS_URL: nats://nats-1:4222,", "NATS_URL: nats://nats-1:4223,", "port 4223"},
		{"compose nats healthcheck port", "compose.yaml", "127.0.0.1:8222/healthz", "127.0.0.1:8223/healthz", "monitoring port"},
		{"compose nats cluster name", "compose.yaml", `"nats-3", "--cluster_name", "orderd"`, `"nats-3", "--cluster_name", "orders"`, "cluster_name"},
		{"compose no jetstream", "compose.yaml", "\"--jetstream\", \"--store_dir\", \"/data\", \"--http_port\", \"8222\"]\n    volumes:\n      - nats-2-data", "\"--store_dir\", \"/data\", \"--http_port\", \"8222\"]\n    volumes:\n      - nats-2-data", "without JetStream"},
		{"compose depends_on target", "compose.yaml", "condition: service_completed_successfully", "condition: service_healthy", "has no healthcheck"},
		{"compose admin token default", "compose.yaml", "ADMIN_TOKEN: ${ADMIN_TOKEN:?set ADMIN_TOKEN to the admin API token, see deployments/README.md}", "ADMIN_TOKEN: ${ADMIN_TOKEN:-change-me}", "literal"},
		{"compose role missing", "compose.yaml", "ORDERD_ROLES: jobs", "ORDERD_ROLES: projector", "no orderd service runs the jobs role"},
		{"compose ports on a non-api role", "compose.yaml", "      ORDERD_REBUILD_MAX_EVENTS_PER_SECOND: \"0\"\n", "      ORDERD_REBUILD_MAX_EVENTS_PER_SECOND: \"0\"\n    ports:\n      - \"9090:8080\"\n", "serves no API"},
		{"compose non-api role without healthcheck", "compose.yaml", "      ORDERD_REBUILD_MAX_EVENTS_PER_SECOND: \"0\"\n    healthcheck: *orderd-healthcheck\n", "      ORDERD_REBUILD_MAX_EVENTS_PER_SECOND: \"0\"\n", "service jobs-1: an orderd instance needs a healthcheck"},
		{"compose non-api healthcheck on an API route", "compose.yaml", "      ORDERD_INSTANCE_ID: projector-2\n    healthcheck: *orderd-healthcheck\n",
			"      ORDERD_INSTANCE_ID: projector-2\n    healthcheck:\n      test: [\"CMD\", \"wget\", \"-q\", \"-O\", \"/dev/null\", \"http://127.0.0.1:8080/readyz?x=1\", \"http://127.0.0.1:8080/openapi.json\"]\n",
			"GET /openapi.json answered 404 on an orderd without the api role"},
		{"compose undeclared volume", "compose.yaml", "  nats-3-data:\n", "", "nats-3-data is not declared"},
		{"dockerfile tags", "Dockerfile", "-tags noembed ", "", "-tags noembed"},
		{"dockerfile cgo", "Dockerfile", "ENV CGO_ENABLED=0 ", "ENV ", "CGO_ENABLED=0"},
		{"dockerfile expose", "Dockerfile", "EXPOSE 8080", "EXPOSE 8081", "EXPOSE"},
		{"dockerfile root", "Dockerfile", "USER 10001:10001", "USER root", "USER"},
		{"dockerfile entrypoint", "Dockerfile", `ENTRYPOINT ["orderd", "serve"]`, `ENTRYPOINT orderd serve`, "exec form"},
		{"dockerfile env", "Dockerfile", "ENV ORDERD_HTTP_ADDR=", "ENV ORDERD_ADDR=", "ORDERD_ADDR is not a setting orderd reads"},
		{"runtime without wget", "Dockerfile", "FROM alpine:3.22", "FROM gcr.io/distroless/static-debian12:nonroot", `"wget"`},
		{"k8s configmap value type", "kubernetes/configmap.yaml", `ORDERD_STREAM_REPLICAS: "3"`, "ORDERD_STREAM_REPLICAS: 3", "not a string"},
		{"k8s unknown configmap key", "kubernetes/configmap.yaml", "ORDERD_LOG_LEVEL: info", "LOG_LEVEL: info", "LOG_LEVEL is not a setting orderd reads"},
		{"k8s unknown env", "kubernetes/jobs.yaml", "- name: ORDERD_JOB_CONCURRENCY", "- name: ORDERD_JOBS_CONCURRENCY", "ORDERD_JOBS_CONCURRENCY is not a setting orderd reads"},
		{"k8s invalid value", "kubernetes/jobs.yaml", `value: "2"`, `value: "two"`, "not a number"},
		{"k8s invalid role", "kubernetes/projector.yaml", "value: projector", "value: projectors", `role "projectors"`},
		{"k8s readiness route", "kubernetes/api.yaml", "path: /readyz", "path: /readiness", "GET /readiness answered 404"},
		{"k8s container port", "kubernetes/api.yaml", "containerPort: 8080", "containerPort: 8081", "8081"},
		{"k8s projector probe on an API route", "kubernetes/projector.yaml", "path: /readyz", "path: /v1/order-summaries", "GET /v1/order-summaries answered 404 on an orderd without the api role"},
		{"k8s jobs without readiness probe", "kubernetes/jobs.yaml", "          readinessProbe:\n            httpGet:\n              path: /readyz\n              port: http\n            periodSeconds: 5\n            timeoutSeconds: 3\n            failureThreshold: 2\n", "", "readinessProbe path \"\"; want /readyz"},
		{"k8s probe port", "kubernetes/api.yaml", "path: /readyz\n              port: http", "path: /readyz\n              port: 9090", "port 9090"},
		{"k8s secret key", "kubernetes/secret.yaml", "  ADMIN_TOKEN: replace-me", "  ADMIN_TOKN: replace-me", "ADMIN_TOKEN"},
		{"k8s admin token not from secret", "kubernetes/api.yaml", "            - name: ADMIN_TOKEN\n              valueFrom:\n                secretKeyRef:\n                  name: orderd-secrets\n                  key: ADMIN_TOKEN\n", "", "does not read ADMIN_TOKEN from a Secret"},
		{"k8s admin token literal", "kubernetes/configmap.yaml", "  ORDERD_LOG_LEVEL: info\n", "  ORDERD_LOG_LEVEL: info\n  ADMIN_TOKEN: abc\n", "ADMIN_TOKEN comes from ConfigMap"},
		{"k8s instance id", "kubernetes/jobs.yaml", "fieldPath: metadata.name", "fieldPath: metadata.namespace", "ORDERD_INSTANCE_ID"},
		{"k8s api replicas", "kubernetes/api.yaml", "replicas: 2", "replicas: 1", "replicas"},
		{"k8s pdb selector", "kubernetes/projector.yaml", "  minAvailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: orderd\n      app.kubernetes.io/component: projector", "  minAvailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: orderd\n      app.kubernetes.io/component: projectors", "selects no Deployment"},
		{"k8s pdb missing", "kubernetes/projector.yaml", "---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: orderd-projector\n", "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: orderd-projector\n", "no PodDisruptionBudget"},
		{"k8s service selector", "kubernetes/api.yaml", "  type: ClusterIP\n  selector:\n    app.kubernetes.io/name: orderd\n    app.kubernetes.io/component: api", "  type: ClusterIP\n  selector:\n    app.kubernetes.io/name: orderd\n    app.kubernetes.io/component: projector", "Service orderd-api selects"},
		{"k8s deployment selector", "kubernetes/jobs.yaml", "  selector:\n    matchLabels:\n      app.kubernetes.io/name: orderd\n      app.kubernetes.io/component: jobs", "  selector:\n    matchLabels:\n      app.kubernetes.io/name: orderd\n      app.kubernetes.io/component: job", "template labels"},
		{"k8s namespace", "kubernetes/secret.yaml", "  name: orderd-secrets\n", "  name: orderd-secrets\n  namespace: prod\n", "namespace"},
		{"k8s resources", "kubernetes/projector.yaml", "              cpu: 250m\n", "", "requests.cpu"},
		{"k8s kustomization", "kubernetes/kustomization.yaml", "  - jobs.yaml\n", "", "jobs.yaml is not listed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDeployments(t)
			p := filepath.Join(dir, filepath.FromSlash(tc.file))
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(b), tc.old); n != 1 {
				t.Fatalf("%s holds %q %d times; the case needs it once", tc.file, tc.old, n)
			}
			if err := os.WriteFile(p, []byte(strings.Replace(string(b), tc.old, tc.new, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			errs := checkDeployments(dir)
			for _, e := range errs {
				if strings.Contains(e, tc.want) {
					t.Logf("reported: %s", e)
					return
				}
			}
			t.Errorf("no report containing %q after the break; reports:\n  %s", tc.want, strings.Join(errs, "\n  "))
		})
	}
}

func copyDeployments(t *testing.T) string {
	t.Helper()
	// Keep the name: compose.yaml builds from its parent (context ..).
	dst := filepath.Join(t.TempDir(), "deployments")
	err := filepath.WalkDir(deploymentsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(deploymentsDir, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// deployEnvNames returns the environment variables the service reads: the
// names bind asks getenv for (ADMIN_TOKEN among them).
func deployEnvNames() (map[string]bool, error) {
	names := map[string]bool{}
	c := DefaultConfig()
	err := c.bind(flag.NewFlagSet("env", flag.ContinueOnError), func(k string) string { names[k] = true; return "" })
	return names, err
}

// deployConfig builds the Config that serve would build from env, checks
// it as serve does, and adds what a production build (-tags noembed)
// requires.
func deployConfig(env map[string]string) (Config, roles, error) {
	c := DefaultConfig()
	if err := c.bind(flag.NewFlagSet("env", flag.ContinueOnError), func(k string) string { return env[k] }); err != nil {
		return c, roles{}, err
	}
	if err := c.Validate(); err != nil {
		return c, roles{}, err
	}
	var errs []error
	r, _ := c.roles()
	if c.Mongo.URI == "" || (c.NATS.URL == "" && r.needsBus()) {
		errs = append(errs, errors.New("MONGODB_URI, and NATS_URL for roles but api alone, are required by the production build (-tags noembed)"))
	}
	if c.Mongo.URI != "" {
		if _, err := connstring.ParseAndValidate(c.Mongo.URI); err != nil {
			errs = append(errs, fmt.Errorf("MONGODB_URI: %w", err))
		}
	}
	for _, u := range depNATSURLs(c.NATS.URL) {
		if u.err != nil {
			errs = append(errs, fmt.Errorf("NATS_URL: %w", u.err))
		}
	}
	return c, r, errors.Join(errs...)
}

type depNATSURL struct {
	host string
	port int
	err  error
}

// depNATSURLs splits a NATS_URL as nats.Connect does (comma-separated).
func depNATSURLs(s string) []depNATSURL {
	var out []depNATSURL
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		u, err := url.Parse(part)
		if err != nil {
			out = append(out, depNATSURL{err: err})
			continue
		}
		if u.Scheme != "nats" && u.Scheme != "tls" {
			out = append(out, depNATSURL{err: fmt.Errorf("%q: want nats:// or tls://", part)})
			continue
		}
		port := 4222
		if p := u.Port(); p != "" {
			port, err = strconv.Atoi(p)
		}
		out = append(out, depNATSURL{host: u.Hostname(), port: port, err: err})
	}
	return out
}

// deployChecker collects the reports of one run over a deployments dir.
type deployChecker struct {
	dir    string
	known  map[string]bool
	errs   []string
	docker *dockerfileInfo
	api    http.Handler // the HTTP server of an instance with the api role
	ops    http.Handler // of one without: health, readiness and metrics only
}

func (c *deployChecker) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

func checkDeployments(dir string) []string {
	c := &deployChecker{dir: dir}
	known, err := deployEnvNames()
	if err != nil {
		c.errorf("bind: %v", err)
	}
	c.known = known
	ok := func(context.Context) error { return nil }
	c.api = orderhttp.NewServer(orderhttp.Config{
		Ready:    map[string]orderhttp.Check{"store": ok, "bus": ok},
		Gatherer: prometheus.NewRegistry(),
	}).Handler()
	c.ops = orderhttp.NewServer(orderhttp.Config{
		OpsOnly:  true,
		Ready:    map[string]orderhttp.Check{"store": ok, "bus": ok},
		Gatherer: prometheus.NewRegistry(),
	}).Handler()
	c.checkYAMLFiles()
	c.checkDockerfile()
	c.checkCompose()
	c.checkKubernetes()
	return c.errs
}

// checkRoute requires GET target (path and query) to answer 200 on the
// HTTP server of an instance with roles r, as the probes want it, with
// every dependency reachable: the API with the api role, else health,
// readiness and metrics only.
func (c *deployChecker) checkRoute(where string, r roles, target string) {
	if !strings.HasPrefix(target, "/") {
		c.errorf("%s: probe path %q does not start with /", where, target)
		return
	}
	h, what := c.api, "orderd's API"
	if !r.api {
		h, what = c.ops, "an orderd without the api role (health, readiness, metrics)"
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	if rec.Code != http.StatusOK {
		c.errorf("%s: GET %s answered %d on %s; want 200 (a probe needs a real route)", where, target, rec.Code, what)
	}
}

// checkEnvNames reports every name orderd does not read.
func (c *deployChecker) checkEnvNames(where string, env map[string]string) {
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !c.known[k] {
			c.errorf("%s: %s is not a setting orderd reads", where, k)
		}
	}
}

// ---- YAML ----

func depYAMLDocs(p string) ([]any, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var docs []any
	for {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return docs, err
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
}

func (c *deployChecker) checkYAMLFiles() {
	n := 0
	err := filepath.WalkDir(c.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ext := filepath.Ext(p); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		n++
		docs, err := depYAMLDocs(p)
		rel, _ := filepath.Rel(c.dir, p)
		if err != nil {
			c.errorf("%s: does not parse: %v", rel, err)
		} else if len(docs) == 0 {
			c.errorf("%s: holds no document", rel)
		}
		return nil
	})
	if err != nil {
		c.errorf("walk %s: %v", c.dir, err)
	}
	if n == 0 {
		c.errorf("no YAML file under %s", c.dir)
	}
}

// ---- Dockerfile ----

func depMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func depList(v any) []any {
	l, _ := v.([]any)
	return l
}

func depStr(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}

// depStrs reads a command given as a list or as one string.
func depStrs(v any) []string {
	if s, ok := v.(string); ok {
		return strings.Fields(s)
	}
	var out []string
	for _, x := range depList(v) {
		out = append(out, depStr(x))
	}
	return out
}

// depFlagValue returns the value of the first of names in args ("--x v",
// "-x v" or "--x=v").
func depFlagValue(args []string, names ...string) (string, bool) {
	for i, a := range args {
		for _, n := range names {
			for _, dash := range []string{"-", "--"} {
				if a == dash+n && i+1 < len(args) {
					return args[i+1], true
				}
				if v, ok := strings.CutPrefix(a, dash+n+"="); ok {
					return v, true
				}
			}
		}
	}
	return "", false
}

func depHasFlag(args []string, names ...string) bool {
	for _, a := range args {
		for _, n := range names {
			if a == "-"+n || a == "--"+n || strings.HasPrefix(a, "-"+n+"=") || strings.HasPrefix(a, "--"+n+"=") {
				return true
			}
		}
	}
	return false
}

var depURLInText = regexp.MustCompile(`https?://[^\s"']+`)

// ---- compose ----

var depComposeVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}`)

// depComposeEnvForTest are the variables the test gives compose interpolation.
var depComposeEnvForTest = map[string]string{"ADMIN_TOKEN": "test-admin-token"}

// interpolate resolves ${VAR}, ${VAR:?err}, ${VAR:-default} as compose does,
// with depComposeEnvForTest as the shell environment.
func (c *deployChecker) interpolate(where, s string) string {
	s = depComposeVar.ReplaceAllStringFunc(s, func(m string) string {
		g := depComposeVar.FindStringSubmatch(m)
		v, ok := depComposeEnvForTest[g[1]]
		switch {
		case ok:
			return v
		case strings.Contains(g[2], "-"):
			return g[3]
		default:
			c.errorf("%s: interpolates ${%s}, which the test does not provide", where, g[1])
			return ""
		}
	})
	return strings.ReplaceAll(s, "$$", "$")
}
