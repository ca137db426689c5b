package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
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
		{"compose non-api healthcheck on an API route", "compose.yaml", "      ORDERD_INSTANCE_ID: projector-2\n      ORDERD_PROJECTOR_WORKERS: \"1\"\n    healthcheck: *orderd-healthcheck\n",
			"      ORDERD_INSTANCE_ID: projector-2\n      ORDERD_PROJECTOR_WORKERS: \"1\"\n    healthcheck:\n      test: [\"CMD\", \"wget\", \"-q\", \"-O\", \"/dev/null\", \"http://127.0.0.1:8080/readyz?x=1\", \"http://127.0.0.1:8080/openapi.json\"]\n",
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
	if c.MongoURI == "" || (c.NATSURL == "" && r.needsBus()) {
		errs = append(errs, errors.New("MONGODB_URI, and NATS_URL for roles but api alone, are required by the production build (-tags noembed)"))
	}
	if c.MongoURI != "" {
		if _, err := connstring.ParseAndValidate(c.MongoURI); err != nil {
			errs = append(errs, fmt.Errorf("MONGODB_URI: %w", err))
		}
	}
	for _, u := range depNATSURLs(c.NATSURL) {
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

type dockerfileInfo struct {
	env        map[string]string // ENV of the runtime stage
	expose     []int
	user       string
	entrypoint []string
	from       string
	tools      map[string]bool // commands a healthcheck or hook can run in the image
	healthy    bool            // a HEALTHCHECK other than NONE
}

// busybox applets a healthcheck or hook may use.
var depBusyboxTools = []string{"sh", "wget", "sleep", "cat", "test", "nc"}

func (c *deployChecker) checkDockerfile() {
	const where = "Dockerfile"
	b, err := os.ReadFile(filepath.Join(c.dir, "Dockerfile"))
	if err != nil {
		c.errorf("%s: %v", where, err)
		return
	}
	// Logical lines: comments dropped, continuations joined.
	var lines []string
	cur := ""
	for _, l := range strings.Split(string(b), "\n") {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "#") || (t == "" && cur == "") {
			continue
		}
		if strings.HasSuffix(t, "\\") {
			cur += strings.TrimSuffix(t, "\\") + " "
			continue
		}
		lines = append(lines, cur+t)
		cur = ""
	}
	d := &dockerfileInfo{}
	stageEnv := map[string]string{}
	built, cgoOff := false, false
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			f := strings.Fields(rest)
			if len(f) == 0 {
				c.errorf("%s: FROM without an image", where)
				continue
			}
			*d = dockerfileInfo{from: f[0], tools: map[string]bool{}}
			stageEnv = map[string]string{}
			d.env = stageEnv
			name := path.Base(strings.SplitN(f[0], ":", 2)[0])
			if name == "alpine" || name == "busybox" {
				for _, t := range depBusyboxTools {
					d.tools[t] = true
				}
			}
		case "ENV":
			for k, v := range depDockerEnv(rest) {
				stageEnv[k] = v
			}
		case "RUN":
			if strings.Contains(rest, "go build") {
				if !strings.Contains(rest, "-tags noembed") || !strings.Contains(rest, "./cmd/orderd") {
					c.errorf("%s: the go build of ./cmd/orderd lacks -tags noembed (production builds leave the embedded servers out)", where)
				}
				built = true
				cgoOff = stageEnv["CGO_ENABLED"] == "0" || strings.Contains(rest, "CGO_ENABLED=0")
			}
			if _, pkgs, ok := strings.Cut(rest, "apk add"); ok {
				for _, p := range strings.Fields(strings.Split(pkgs, "&&")[0]) {
					if !strings.HasPrefix(p, "-") {
						d.tools[p] = true
					}
				}
			}
		case "EXPOSE":
			for _, p := range strings.Fields(rest) {
				n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
				if err != nil {
					c.errorf("%s: EXPOSE %s: %v", where, p, err)
				}
				d.expose = append(d.expose, n)
			}
		case "USER":
			d.user = rest
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &d.entrypoint); err != nil {
				c.errorf("%s: ENTRYPOINT %s: want the exec form [\"orderd\", \"serve\"] so that orderd is PID 1 and gets SIGTERM", where, rest)
			}
		case "HEALTHCHECK":
			d.healthy = strings.ToUpper(strings.Fields(rest + " x")[0]) != "NONE"
		}
	}
	c.docker = d
	if !built {
		c.errorf("%s: no RUN go build ... -tags noembed ./cmd/orderd", where)
	} else if !cgoOff {
		c.errorf("%s: the build stage does not set CGO_ENABLED=0 (the runtime image has no C library of the build image)", where)
	}
	uid, _, _ := strings.Cut(d.user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		c.errorf("%s: USER %q: want a numeric non-root uid (runAsNonRoot can verify only numbers)", where, d.user)
	}
	if len(d.entrypoint) != 2 || path.Base(d.entrypoint[0]) != "orderd" || d.entrypoint[1] != "serve" {
		c.errorf("%s: ENTRYPOINT %q: want [\"orderd\", \"serve\"]", where, d.entrypoint)
	}
	if len(d.expose) == 0 {
		c.errorf("%s: no EXPOSE", where)
	}
	c.checkEnvNames(where+" ENV", d.env)
	if addr, ok := d.env["ORDERD_HTTP_ADDR"]; ok {
		if p := c.httpPort(where, addr); p != 0 && !slices.Contains(d.expose, p) {
			c.errorf("%s: EXPOSE %v does not include the port of ORDERD_HTTP_ADDR=%s", where, d.expose, addr)
		}
	}
}

// depDockerEnv reads "K=V K2=V2" and the old "K V" form.
func depDockerEnv(s string) map[string]string {
	env := map[string]string{}
	f := strings.Fields(s)
	if len(f) == 0 {
		return env
	}
	if !strings.Contains(f[0], "=") {
		env[f[0]] = strings.TrimSpace(strings.TrimPrefix(s, f[0]))
		return env
	}
	for _, kv := range f {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = strings.Trim(v, `"'`)
	}
	return env
}

// httpPort returns the port of an ORDERD_HTTP_ADDR, reporting one that a
// container cannot be reached on.
func (c *deployChecker) httpPort(where, addr string) int {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		c.errorf("%s: ORDERD_HTTP_ADDR=%q: %v", where, addr, err)
		return 0
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		c.errorf("%s: ORDERD_HTTP_ADDR=%s listens on loopback: nothing outside the container reaches it (use 0.0.0.0)", where, addr)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n <= 0 {
		c.errorf("%s: ORDERD_HTTP_ADDR=%q: want a fixed port", where, addr)
		return 0
	}
	return n
}

// checkTool requires the image to have the command a healthcheck or hook runs.
func (c *deployChecker) checkTool(where, cmd string) {
	if c.docker == nil {
		return
	}
	if !c.docker.tools[path.Base(cmd)] {
		c.errorf("%s: runs %q, which the runtime image (%s) does not have", where, cmd, c.docker.from)
	}
}

// ---- generic helpers over decoded YAML ----

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

// depComposeFile is the compose file under deployments/.
const depComposeFile = "compose.yaml"

func (c *deployChecker) checkCompose() {
	const file = depComposeFile
	docs, err := depYAMLDocs(filepath.Join(c.dir, file))
	if err != nil || len(docs) != 1 {
		c.errorf("%s: want one YAML document (err %v)", file, err)
		return
	}
	top := depMap(docs[0])
	services := map[string]map[string]any{}
	for name, def := range depMap(top["services"]) {
		services[name] = depMap(def)
	}
	if len(services) == 0 {
		c.errorf("%s: no services", file)
		return
	}
	names := slices.Sorted(maps.Keys(services))
	declaredVolumes := depMap(top["volumes"])

	// Generic: dependencies exist and their conditions can be met; named
	// volumes are declared.
	for _, name := range names {
		svc := services[name]
		where := file + ": service " + name
		for dep, cond := range composeDepends(svc["depends_on"]) {
			target, ok := services[dep]
			switch {
			case !ok:
				c.errorf("%s: depends on %s, which is not a service", where, dep)
			case cond == "service_healthy" && !depHasHealthcheck(target):
				c.errorf("%s: waits for %s to be healthy, but %s has no healthcheck", where, dep, dep)
			case cond == "service_completed_successfully" && depStr(target["restart"]) != "" && depStr(target["restart"]) != "no":
				c.errorf("%s: waits for %s to complete, but %s restarts (%s)", where, dep, dep, depStr(target["restart"]))
			case cond != "service_started" && cond != "service_healthy" && cond != "service_completed_successfully":
				c.errorf("%s: depends_on %s: unknown condition %q", where, dep, cond)
			}
		}
		for _, v := range depList(svc["volumes"]) {
			src := ""
			if s, ok := v.(string); ok {
				src, _, _ = strings.Cut(s, ":")
			} else {
				src = depStr(depMap(v)["source"])
			}
			if src != "" && !strings.ContainsAny(src[:1], "./~$") {
				if _, ok := declaredVolumes[src]; !ok {
					c.errorf("%s: volume %s is not declared under the top-level volumes", where, src)
				}
			}
		}
	}

	// The orderd image: built from deployments/Dockerfile by one service,
	// used by the others.
	image := ""
	for _, name := range names {
		b := depMap(services[name]["build"])
		if b == nil {
			continue
		}
		df := depStr(b["dockerfile"])
		if df == "" {
			df = "Dockerfile"
		}
		p := filepath.Join(c.dir, filepath.FromSlash(depStr(b["context"])), filepath.FromSlash(df))
		if _, err := os.Stat(p); err != nil {
			c.errorf("%s: service %s builds %s (context %s), which does not exist", file, name, df, depStr(b["context"]))
		}
		if filepath.Clean(p) == filepath.Clean(filepath.Join(c.dir, "Dockerfile")) {
			image = depStr(services[name]["image"])
			if image == "" {
				c.errorf("%s: service %s builds orderd without naming the image; the other orderd services cannot share it", file, name)
			}
		}
	}
	if image == "" {
		c.errorf("%s: no service builds deployments/Dockerfile", file)
		return
	}

	var orderd []string
	for _, name := range names {
		if depStr(services[name]["image"]) == image {
			orderd = append(orderd, name)
		}
	}
	instances := map[string]string{}
	allRoles := roles{}
	for _, name := range orderd {
		svc := services[name]
		where := file + ": service " + name
		env := maps.Clone(c.dockerEnv())
		own := c.composeEnv(where, svc)
		c.checkEnvNames(where, own)
		maps.Copy(env, own)
		cfg, r, err := deployConfig(env)
		if err != nil {
			c.errorf("%s: %v", where, err)
			continue
		}
		allRoles = roles{allRoles.api || r.api, allRoles.relay || r.relay, allRoles.projector || r.projector, allRoles.jobs || r.jobs}
		c.checkAPIAlone(where, r)
		if id := env["ORDERD_INSTANCE_ID"]; id == "" {
			c.errorf("%s: no ORDERD_INSTANCE_ID", where)
		} else if other, dup := instances[id]; dup {
			c.errorf("%s: ORDERD_INSTANCE_ID %s is also service %s's: lease owners must differ", where, id, other)
		} else {
			instances[id] = name
		}
		if env["ORDERD_LOG_FORMAT"] != "json" {
			c.errorf("%s: ORDERD_LOG_FORMAT is %q; want json", where, env["ORDERD_LOG_FORMAT"])
		}
		c.checkComposeStore(where, cfg, svc, services)
		c.checkComposeNATS(where, cfg, svc, services)

		ports := c.composePorts(where, svc["ports"])
		hc := depMap(svc["healthcheck"])
		port := c.httpPort(where, cfg.HTTPAddr)
		if r.api {
			if own["ADMIN_TOKEN"] == "" {
				c.errorf("%s: an api instance without ADMIN_TOKEN has the admin routes off", where)
			} else if raw, ok := composeRawEnv(svc)["ADMIN_TOKEN"]; ok && !depAdminTokenFromShell.MatchString(raw) {
				c.errorf("%s: ADMIN_TOKEN is %q: a default or literal token in the compose file; take it from the environment (${ADMIN_TOKEN:?...}) or an env file", where, raw)
			}
			for _, p := range ports {
				if p != port {
					c.errorf("%s: publishes container port %d, but orderd listens on %s", where, p, cfg.HTTPAddr)
				}
			}
		} else if len(ports) > 0 {
			c.errorf("%s: publishes ports, but without the api role orderd serves no API (only health, readiness and metrics)", where)
		}
		if c.docker != nil && port != 0 && !slices.Contains(c.docker.expose, port) {
			c.errorf("%s: listens on port %d, which the Dockerfile does not EXPOSE (%v)", where, port, c.docker.expose)
		}
		// Every role serves /readyz, checking what its roles need.
		test := depStrs(hc["test"])
		if len(test) < 2 || test[0] == "NONE" {
			c.errorf("%s: an orderd instance needs a healthcheck on /readyz", where)
			continue
		}
		if test[0] == "CMD" {
			c.checkTool(where+" healthcheck", test[1])
		}
		urls := depURLInText.FindAllString(strings.Join(test, " "), -1)
		readyz := false
		for _, raw := range urls {
			u, err := url.Parse(raw)
			if err != nil {
				c.errorf("%s: healthcheck URL %s: %v", where, raw, err)
				continue
			}
			readyz = readyz || u.Path == "/readyz"
			if u.Port() != strconv.Itoa(port) {
				c.errorf("%s: healthcheck calls port %s, but orderd listens on %s", where, u.Port(), cfg.HTTPAddr)
			}
			c.checkRoute(where+" healthcheck", r, u.RequestURI())
		}
		if !readyz {
			c.errorf("%s: healthcheck %q does not call /readyz (what its roles need is reachable)", where, test)
		}
	}
	for role, on := range map[string]bool{"api": allRoles.api, "relay": allRoles.relay, "projector": allRoles.projector, "jobs": allRoles.jobs} {
		if !on {
			c.errorf("%s: no orderd service runs the %s role", file, role)
		}
	}
}

// checkAPIAlone refuses an api instance that also runs a role needing
// NATS: its /readyz would take it out of the load balancer during a NATS
// outage, while commands need only the store.
func (c *deployChecker) checkAPIAlone(where string, r roles) {
	if r.api && r.needsBus() {
		c.errorf("%s: the api role beside relay, projector or jobs is unready while NATS is down, though commands need only the store; run those roles in other instances", where)
	}
}

func (c *deployChecker) dockerEnv() map[string]string {
	if c.docker == nil {
		return map[string]string{}
	}
	return c.docker.env
}

// composeEnv reads environment (map or list) and env_file, interpolated.
func (c *deployChecker) composeEnv(where string, svc map[string]any) map[string]string {
	env := map[string]string{}
	for _, f := range depStrs(svc["env_file"]) {
		b, err := os.ReadFile(filepath.Join(c.dir, filepath.FromSlash(f)))
		if err != nil {
			c.errorf("%s: env_file: %v", where, err)
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				k, v, _ := strings.Cut(l, "=")
				env[k] = v
			}
		}
	}
	for k, v := range composeRawEnv(svc) {
		env[k] = c.interpolate(where+" "+k, v)
	}
	return env
}

// depAdminTokenFromShell is an ADMIN_TOKEN that compose takes from the shell
// or fails without: no default.
var depAdminTokenFromShell = regexp.MustCompile(`^\$\{ADMIN_TOKEN(:?\?[^}]*)?\}$`)

// composeRawEnv reads environment (map or list) uninterpolated.
func composeRawEnv(svc map[string]any) map[string]string {
	env := map[string]string{}
	switch e := svc["environment"].(type) {
	case map[string]any:
		for k, v := range e {
			env[k] = depStr(v)
		}
	case []any:
		for _, kv := range e {
			k, v, _ := strings.Cut(depStr(kv), "=")
			env[k] = v
		}
	}
	return env
}

func composeDepends(v any) map[string]string {
	deps := map[string]string{}
	switch d := v.(type) {
	case []any:
		for _, x := range d {
			deps[depStr(x)] = "service_started"
		}
	case map[string]any:
		for k, x := range d {
			cond := depStr(depMap(x)["condition"])
			if cond == "" {
				cond = "service_started"
			}
			deps[k] = cond
		}
	}
	return deps
}

func depHasHealthcheck(svc map[string]any) bool {
	hc := depMap(svc["healthcheck"])
	if hc == nil || hc["disable"] == true {
		return false
	}
	t := depStrs(hc["test"])
	return len(t) > 0 && t[0] != "NONE"
}

// composePorts returns the container side of each published port.
func (c *deployChecker) composePorts(where string, v any) []int {
	var out []int
	for _, p := range depList(v) {
		s := depStr(p)
		if m := depMap(p); m != nil {
			s = depStr(m["target"])
		}
		s, _, _ = strings.Cut(s, "/")
		parts := strings.Split(s, ":")
		n, err := strconv.Atoi(parts[len(parts)-1])
		if err != nil {
			c.errorf("%s: port %v: %v", where, p, err)
			continue
		}
		out = append(out, n)
	}
	return out
}

var (
	depRSInitiateID   = regexp.MustCompile(`rs\.initiate\(\s*\{\s*_id:\s*"([^"]+)"`)
	depRSInitiateHost = regexp.MustCompile(`host:\s*"([^"]+)"`)
)

// checkComposeStore holds MONGODB_URI to the MongoDB services: each host is
// one, each runs --replSet with the URI's replicaSet, a one-shot service
// initiates that set with exactly these members, and orderd waits for it.
func (c *deployChecker) checkComposeStore(where string, cfg Config, svc map[string]any, services map[string]map[string]any) {
	cs, err := connstring.ParseAndValidate(cfg.MongoURI)
	if err != nil {
		return // reported by deployConfig
	}
	hosts := map[string]bool{}
	for _, h := range cs.Hosts {
		if !strings.Contains(h, ":") {
			h += ":27017"
		}
		hosts[h] = true
		name, port, _ := strings.Cut(h, ":")
		m, ok := services[name]
		if !ok {
			c.errorf("%s: MONGODB_URI names host %s, which is not a service", where, name)
			continue
		}
		args := depStrs(m["command"])
		if p, ok := depFlagValue(args, "port"); ok && p != port || !ok && port != "27017" {
			c.errorf("%s: MONGODB_URI reaches %s on port %s, where mongod does not listen", where, name, port)
		}
		if rs, _ := depFlagValue(args, "replSet"); rs != cs.ReplicaSet {
			c.errorf("%s: MONGODB_URI has replicaSet %q, but %s runs --replSet %q", where, cs.ReplicaSet, name, rs)
		}
	}
	if len(cs.Hosts) > 1 && cs.ReplicaSet == "" {
		c.errorf("%s: MONGODB_URI lists %d hosts without replicaSet", where, len(cs.Hosts))
	}
	if cs.ReplicaSet == "" {
		return
	}
	deps := composeDepends(svc["depends_on"])
	found := false
	for name, m := range services {
		script := strings.Join(depStrs(m["command"]), " ") + " " + strings.Join(depStrs(m["entrypoint"]), " ")
		id := depRSInitiateID.FindStringSubmatch(script)
		if id == nil {
			continue
		}
		found = true
		if id[1] != cs.ReplicaSet {
			c.errorf("%s: MONGODB_URI has replicaSet %q, but %s initiates %q", where, cs.ReplicaSet, name, id[1])
		}
		members := map[string]bool{}
		for _, h := range depRSInitiateHost.FindAllStringSubmatch(script, -1) {
			members[h[1]] = true
		}
		if !maps.Equal(members, hosts) {
			c.errorf("%s: MONGODB_URI hosts %v differ from the members %s initiates %v", where, slices.Sorted(maps.Keys(hosts)), name, slices.Sorted(maps.Keys(members)))
		}
		if deps[name] != "service_completed_successfully" {
			c.errorf("%s: does not wait for %s (depends_on condition service_completed_successfully)", where, name)
		}
	}
	if !found {
		c.errorf("%s: no service runs rs.initiate for replica set %s", where, cs.ReplicaSet)
	}
}

// checkComposeNATS holds NATS_URL to the NATS services: each host is a
// JetStream server of one cluster, healthy before orderd starts, with
// enough servers for ORDERD_STREAM_REPLICAS.
func (c *deployChecker) checkComposeNATS(where string, cfg Config, svc map[string]any, services map[string]map[string]any) {
	deps := composeDepends(svc["depends_on"])
	cluster := map[string]bool{}
	var clusterName *string
	var queue []string
	for _, u := range depNATSURLs(cfg.NATSURL) {
		if u.err != nil {
			continue
		}
		m, ok := services[u.host]
		if !ok {
			c.errorf("%s: NATS_URL names host %s, which is not a service", where, u.host)
			continue
		}
		args := depStrs(m["command"])
		port := "4222"
		if p, ok := depFlagValue(args, "p", "port"); ok {
			port = p
		}
		if strconv.Itoa(u.port) != port {
			c.errorf("%s: NATS_URL reaches %s on port %d, but it listens on %s", where, u.host, u.port, port)
		}
		if deps[u.host] != "service_healthy" {
			c.errorf("%s: does not wait for %s to be healthy", where, u.host)
		}
		queue = append(queue, u.host)
	}
	names := map[string]string{}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if cluster[name] {
			continue
		}
		cluster[name] = true
		m := services[name]
		sw := depComposeFile + ": service " + name
		args := depStrs(m["command"])
		if !depHasFlag(args, "js", "jetstream") {
			c.errorf("%s: NATS server without JetStream (-js)", sw)
		}
		cn, _ := depFlagValue(args, "cluster_name")
		if clusterName == nil {
			clusterName = &cn
		} else if cn != *clusterName {
			c.errorf("%s: cluster_name %q differs from %q", sw, cn, *clusterName)
		}
		sn, _ := depFlagValue(args, "n", "server_name")
		if other, dup := names[sn]; dup || sn == "" {
			c.errorf("%s: server_name %q is empty or also %s's", sw, sn, other)
		}
		names[sn] = name
		if routes, ok := depFlagValue(args, "routes"); ok {
			for _, r := range strings.Split(routes, ",") {
				u, err := url.Parse(strings.TrimSpace(r))
				if err != nil {
					c.errorf("%s: route %s: %v", sw, r, err)
					continue
				}
				if _, ok := services[u.Hostname()]; !ok {
					c.errorf("%s: route to %s, which is not a service", sw, u.Hostname())
					continue
				}
				queue = append(queue, u.Hostname())
			}
		}
		mon, _ := depFlagValue(args, "m", "http_port")
		for _, raw := range depURLInText.FindAllString(strings.Join(depStrs(depMap(m["healthcheck"])["test"]), " "), -1) {
			u, err := url.Parse(raw)
			if err != nil || u.Port() != mon || u.Path != "/healthz" {
				c.errorf("%s: healthcheck %s does not call /healthz on the monitoring port %q", sw, raw, mon)
			}
		}
	}
	if len(cluster) > 0 && cfg.StreamReplicas > len(cluster) {
		c.errorf("%s: ORDERD_STREAM_REPLICAS=%d, but the cluster has %d JetStream servers", where, cfg.StreamReplicas, len(cluster))
	}
}

// ---- Kubernetes ----

type k8sObject struct {
	file string
	kind string
	name string
	obj  map[string]any
}

func (o k8sObject) String() string { return o.file + ": " + o.kind + " " + o.name }

// depDig follows keys through nested maps.
func depDig(v any, keys ...string) any {
	for _, k := range keys {
		v = depMap(v)[k]
	}
	return v
}

func depLabels(v any) map[string]string {
	out := map[string]string{}
	for k, x := range depMap(v) {
		out[k] = depStr(x)
	}
	return out
}

// depSelects reports whether selector (matchLabels or a Service selector)
// selects pods labelled labels.
func depSelects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

type k8sDeployment struct {
	k8sObject
	replicas  int
	podLabels map[string]string
	container map[string]any
	roles     roles
	httpPort  int
}

func (c *deployChecker) checkKubernetes() {
	dir := filepath.Join(c.dir, "kubernetes")
	entries, err := os.ReadDir(dir)
	if err != nil {
		c.errorf("kubernetes: %v", err)
		return
	}
	var objs []k8sObject
	var kustomization map[string]any
	var manifests []string
	for _, e := range entries {
		if e.IsDir() || (filepath.Ext(e.Name()) != ".yaml" && filepath.Ext(e.Name()) != ".yml") {
			continue
		}
		rel := "kubernetes/" + e.Name()
		docs, err := depYAMLDocs(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // reported by checkYAMLFiles
		}
		if e.Name() == "kustomization.yaml" {
			kustomization = depMap(docs[0])
			continue
		}
		manifests = append(manifests, e.Name())
		for _, d := range docs {
			m := depMap(d)
			o := k8sObject{file: rel, kind: depStr(m["kind"]), name: depStr(depDig(m, "metadata", "name")), obj: m}
			if o.kind == "" || o.name == "" || depStr(m["apiVersion"]) == "" {
				c.errorf("%s: a document without apiVersion, kind or metadata.name", rel)
				continue
			}
			if ns := depDig(m, "metadata", "namespace"); ns != nil {
				c.errorf("%s: sets metadata.namespace %v; the manifests are namespace-less", o, ns)
			}
			objs = append(objs, o)
		}
	}
	if kustomization != nil {
		listed := map[string]bool{}
		for _, r := range depList(kustomization["resources"]) {
			listed[depStr(r)] = true
			if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(depStr(r)))); err != nil {
				c.errorf("kubernetes/kustomization.yaml: resource %s: %v", depStr(r), err)
			}
		}
		for _, m := range manifests {
			if !listed[m] {
				c.errorf("kubernetes/kustomization.yaml: %s is not listed under resources", m)
			}
		}
		if kustomization["namespace"] != nil {
			c.errorf("kubernetes/kustomization.yaml: sets a namespace; the manifests are namespace-less")
		}
	}

	configMaps := map[string]map[string]string{}
	secrets := map[string]map[string]string{}
	for _, o := range objs {
		switch o.kind {
		case "ConfigMap":
			data := map[string]string{}
			for k, v := range depMap(o.obj["data"]) {
				s, ok := v.(string)
				if !ok {
					c.errorf("%s: data.%s is %v, not a string (Kubernetes takes only strings)", o, k, v)
				}
				data[k] = s
			}
			configMaps[o.name] = data
		case "Secret":
			data := map[string]string{}
			for k, v := range depMap(o.obj["data"]) {
				b, err := base64.StdEncoding.DecodeString(depStr(v))
				if err != nil {
					c.errorf("%s: data.%s is not base64: %v", o, k, err)
				}
				data[k] = string(b)
			}
			for k, v := range depMap(o.obj["stringData"]) {
				s, ok := v.(string)
				if !ok {
					c.errorf("%s: stringData.%s is not a string", o, k)
				}
				data[k] = s
			}
			secrets[o.name] = data
		}
	}
	tokenSecret := false
	for _, data := range secrets {
		if data["ADMIN_TOKEN"] != "" {
			tokenSecret = true
		}
	}
	if !tokenSecret {
		c.errorf("kubernetes: no Secret provides ADMIN_TOKEN")
	}

	var deps []*k8sDeployment
	allRoles := roles{}
	for _, o := range objs {
		if o.kind != "Deployment" {
			continue
		}
		d := c.checkK8sDeployment(o, configMaps, secrets)
		if d == nil {
			continue
		}
		deps = append(deps, d)
		r := d.roles
		allRoles = roles{allRoles.api || r.api, allRoles.relay || r.relay, allRoles.projector || r.projector, allRoles.jobs || r.jobs}
		c.checkAPIAlone("kubernetes: Deployment "+o.name, r)
	}
	for role, on := range map[string]bool{"api": allRoles.api, "relay": allRoles.relay, "projector": allRoles.projector, "jobs": allRoles.jobs} {
		if !on {
			c.errorf("kubernetes: no Deployment runs the %s role", role)
		}
	}
	// Selectors of different Deployments must not overlap.
	for i, a := range deps {
		for _, b := range deps[i+1:] {
			if depSelects(depLabels(depDig(a.obj, "spec", "selector", "matchLabels")), b.podLabels) ||
				depSelects(depLabels(depDig(b.obj, "spec", "selector", "matchLabels")), a.podLabels) {
				c.errorf("kubernetes: the selectors of %s and %s overlap", a, b)
			}
		}
	}

	covered := map[*k8sDeployment]bool{}
	services := 0
	for _, o := range objs {
		switch o.kind {
		case "PodDisruptionBudget":
			sel := depLabels(depDig(o.obj, "spec", "selector", "matchLabels"))
			var matched []*k8sDeployment
			for _, d := range deps {
				if depSelects(sel, d.podLabels) {
					matched = append(matched, d)
				}
			}
			if len(matched) != 1 {
				c.errorf("%s: selects no Deployment's pods or several (%d); want exactly one", o, len(matched))
				continue
			}
			d := matched[0]
			covered[d] = true
			ma, ok := depDig(o.obj, "spec", "minAvailable").(int)
			if !ok {
				c.errorf("%s: want an integer minAvailable", o)
			} else if ma >= d.replicas {
				c.errorf("%s: minAvailable %d with %d replicas of %s blocks every voluntary eviction (drains)", o, ma, d.replicas, d.name)
			}
		case "Service":
			services++
			sel := depLabels(depDig(o.obj, "spec", "selector"))
			n := 0
			for _, d := range deps {
				if !depSelects(sel, d.podLabels) {
					continue
				}
				n++
				if !d.roles.api {
					c.errorf("%s selects the pods of %s, which serve no API (no api role)", o, d)
					continue
				}
				for _, p := range depList(depDig(o.obj, "spec", "ports")) {
					target := depMap(p)["targetPort"]
					if target == nil {
						target = depMap(p)["port"]
					}
					if got := depContainerPort(d.container, target); got != d.httpPort {
						c.errorf("%s: targetPort %v is port %d of %s, but orderd listens on %d", o, target, got, d.name, d.httpPort)
					}
				}
			}
			if n == 0 {
				c.errorf("%s selects no Deployment's pods", o)
			}
		}
	}
	if services == 0 {
		c.errorf("kubernetes: no Service for the API")
	}
	for _, d := range deps {
		if d.replicas >= 2 && !covered[d] {
			c.errorf("%s: %d replicas and no PodDisruptionBudget", d, d.replicas)
		}
	}
}

// depContainerPort resolves a port (number or name) of a container.
func depContainerPort(container map[string]any, port any) int {
	if n, ok := port.(int); ok {
		return n
	}
	for _, p := range depList(container["ports"]) {
		if depStr(depMap(p)["name"]) == depStr(port) {
			n, _ := depMap(p)["containerPort"].(int)
			return n
		}
	}
	return 0
}

func (c *deployChecker) checkK8sDeployment(o k8sObject, configMaps, secrets map[string]map[string]string) *k8sDeployment {
	spec := depMap(o.obj["spec"])
	d := &k8sDeployment{k8sObject: o, replicas: 1, podLabels: depLabels(depDig(spec, "template", "metadata", "labels"))}
	if r, ok := spec["replicas"].(int); ok {
		d.replicas = r
	}
	sel := depLabels(depDig(spec, "selector", "matchLabels"))
	if !depSelects(sel, d.podLabels) {
		c.errorf("%s: selector.matchLabels %v do not match the template labels %v", o, sel, d.podLabels)
	}
	pod := depMap(depDig(spec, "template", "spec"))
	if depDig(pod, "securityContext", "runAsNonRoot") != true {
		c.errorf("%s: the pod does not set securityContext.runAsNonRoot", o)
	}
	for _, x := range depList(pod["containers"]) {
		ct := depMap(x)
		img := depStr(ct["image"])
		img = path.Base(strings.SplitN(img, "@", 2)[0])
		if name, _, _ := strings.Cut(img, ":"); name == "orderd" {
			if d.container != nil {
				c.errorf("%s: several orderd containers", o)
			}
			d.container = ct
		}
	}
	if d.container == nil {
		c.errorf("%s: no orderd container (image orderd)", o)
		return nil
	}
	where := o.String()
	ct := d.container

	// The environment as the kubelet builds it.
	env := maps.Clone(c.dockerEnv())
	own := map[string]string{}
	source := map[string]string{}
	for _, x := range depList(ct["envFrom"]) {
		ef := depMap(x)
		if ref := depMap(ef["configMapRef"]); ref != nil {
			data, ok := configMaps[depStr(ref["name"])]
			if !ok {
				c.errorf("%s: envFrom ConfigMap %s, which the manifests do not define", where, depStr(ref["name"]))
			}
			for k, v := range data {
				own[k], source[k] = v, "ConfigMap "+depStr(ref["name"])
			}
		}
		if ref := depMap(ef["secretRef"]); ref != nil {
			data, ok := secrets[depStr(ref["name"])]
			if !ok {
				c.errorf("%s: envFrom Secret %s, which the manifests do not define", where, depStr(ref["name"]))
			}
			for k, v := range data {
				own[k], source[k] = v, "Secret "+depStr(ref["name"])
			}
		}
	}
	seen := map[string]bool{}
	for _, x := range depList(ct["env"]) {
		e := depMap(x)
		name := depStr(e["name"])
		if seen[name] {
			c.errorf("%s: env %s is set twice", where, name)
		}
		seen[name] = true
		if v, ok := e["value"]; ok {
			s, isStr := v.(string)
			if !isStr {
				c.errorf("%s: env %s value %v is not a string (Kubernetes takes only strings)", where, name, v)
			}
			own[name], source[name] = s, "a literal value"
			continue
		}
		vf := depMap(e["valueFrom"])
		switch {
		case vf["fieldRef"] != nil:
			fp := depStr(depDig(vf, "fieldRef", "fieldPath"))
			own[name], source[name] = "field-"+fp, "fieldRef "+fp
			if fp == "metadata.name" {
				own[name] = o.name + "-5d8f7c9b4-x2k7q"
			}
		case vf["secretKeyRef"] != nil:
			sn, key := depStr(depDig(vf, "secretKeyRef", "name")), depStr(depDig(vf, "secretKeyRef", "key"))
			v, ok := secrets[sn][key]
			if !ok {
				c.errorf("%s: env %s reads key %s of Secret %s, which the manifests do not define", where, name, key, sn)
			}
			own[name], source[name] = v, "Secret "+sn
		case vf["configMapKeyRef"] != nil:
			cn, key := depStr(depDig(vf, "configMapKeyRef", "name")), depStr(depDig(vf, "configMapKeyRef", "key"))
			v, ok := configMaps[cn][key]
			if !ok {
				c.errorf("%s: env %s reads key %s of ConfigMap %s, which the manifests do not define", where, name, key, cn)
			}
			own[name], source[name] = v, "ConfigMap "+cn
		default:
			c.errorf("%s: env %s has neither value nor a known valueFrom", where, name)
		}
	}
	c.checkEnvNames(where, own)
	maps.Copy(env, own)
	cfg, r, err := deployConfig(env)
	if err != nil {
		c.errorf("%s: %v", where, err)
		return nil
	}
	d.roles = r
	if source["ORDERD_INSTANCE_ID"] != "fieldRef metadata.name" {
		c.errorf("%s: ORDERD_INSTANCE_ID comes from %q; want the pod name (valueFrom.fieldRef metadata.name), distinct per replica", where, source["ORDERD_INSTANCE_ID"])
	}
	if env["ORDERD_LOG_FORMAT"] != "json" {
		c.errorf("%s: ORDERD_LOG_FORMAT is %q; want json", where, env["ORDERD_LOG_FORMAT"])
	}
	if s := source["ADMIN_TOKEN"]; s != "" && !strings.HasPrefix(s, "Secret ") {
		c.errorf("%s: ADMIN_TOKEN comes from %s; it belongs in a Secret", where, s)
	}
	for _, k := range []string{"cpu", "memory"} {
		if depDig(ct, "resources", "requests", k) == nil {
			c.errorf("%s: no resources.requests.%s", where, k)
		}
	}
	if depDig(ct, "resources", "limits", "memory") == nil {
		c.errorf("%s: no resources.limits.memory", where)
	}
	if cmd := depStrs(depDig(ct, "lifecycle", "preStop", "exec", "command")); len(cmd) > 0 {
		c.checkTool(where+" preStop", cmd[0])
	}

	probes := map[string]map[string]any{}
	for _, p := range []string{"startupProbe", "livenessProbe", "readinessProbe"} {
		if m := depMap(ct[p]); m != nil {
			probes[p] = m
		}
	}
	if r.api {
		if !strings.HasPrefix(source["ADMIN_TOKEN"], "Secret ") || !depTokenIn(secrets, own["ADMIN_TOKEN"]) {
			c.errorf("%s: the api Deployment does not read ADMIN_TOKEN from a Secret", where)
		}
		if d.replicas < 2 {
			c.errorf("%s: the api runs %d replicas; want at least 2", where, d.replicas)
		}
	}
	// Every role listens on ORDERD_HTTP_ADDR: the API, or health,
	// readiness and metrics only; its probes go there.
	d.httpPort = c.httpPort(where, cfg.HTTPAddr)
	if c.docker != nil && d.httpPort != 0 && !slices.Contains(c.docker.expose, d.httpPort) {
		c.errorf("%s: listens on port %d, which the Dockerfile does not EXPOSE (%v)", where, d.httpPort, c.docker.expose)
	}
	declared := false
	for _, p := range depList(ct["ports"]) {
		n, _ := depMap(p)["containerPort"].(int)
		if n == d.httpPort {
			declared = true
		} else {
			c.errorf("%s: containerPort %d, but orderd listens on %s", where, n, cfg.HTTPAddr)
		}
	}
	if !declared {
		c.errorf("%s: no containerPort for ORDERD_HTTP_ADDR %s", where, cfg.HTTPAddr)
	}
	want := map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if p := depStr(depDig(probes[name], "httpGet", "path")); p != want[name] {
			c.errorf("%s: %s path %q; want %s", where, name, p, want[name])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(probes)) {
		hg := depMap(probes[name]["httpGet"])
		if hg == nil {
			c.errorf("%s: %s is not an httpGet probe", where, name)
			continue
		}
		if port := depContainerPort(ct, hg["port"]); port != d.httpPort {
			c.errorf("%s: %s calls port %v (port %d), but orderd listens on %s", where, name, hg["port"], port, cfg.HTTPAddr)
		}
		c.checkRoute(where+" "+name, r, depStr(hg["path"]))
	}
	return d
}

func depTokenIn(secrets map[string]map[string]string, v string) bool {
	if v == "" {
		return false
	}
	for _, data := range secrets {
		if data["ADMIN_TOKEN"] == v {
			return true
		}
	}
	return false
}
