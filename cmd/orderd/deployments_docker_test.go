package main

import (
	"encoding/json"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

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
