package main

import (
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
)

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
	cs, err := connstring.ParseAndValidate(cfg.Mongo.URI)
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
	for _, u := range depNATSURLs(cfg.NATS.URL) {
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
	if len(cluster) > 0 && cfg.Stream.Replicas > len(cluster) {
		c.errorf("%s: ORDERD_STREAM_REPLICAS=%d, but the cluster has %d JetStream servers", where, cfg.Stream.Replicas, len(cluster))
	}
}

// ---- Kubernetes ----
