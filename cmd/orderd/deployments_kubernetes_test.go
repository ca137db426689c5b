package main

import (
	"encoding/base64"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

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
	// ConfigMaps and Secrets are read alike: whole by envFrom, a key at a
	// time by valueFrom.
	envFrom := []struct {
		kind, ref string // the object kind and the envFrom field naming one
		data      map[string]map[string]string
	}{{"ConfigMap", "configMapRef", configMaps}, {"Secret", "secretRef", secrets}}
	for _, x := range depList(ct["envFrom"]) {
		ef := depMap(x)
		for _, from := range envFrom {
			ref := depMap(ef[from.ref])
			if ref == nil {
				continue
			}
			data, ok := from.data[depStr(ref["name"])]
			if !ok {
				c.errorf("%s: envFrom %s %s, which the manifests do not define", where, from.kind, depStr(ref["name"]))
			}
			for k, v := range data {
				own[k], source[k] = v, from.kind+" "+depStr(ref["name"])
			}
		}
	}
	// keyRef sets env name to the key that vf's field (secretKeyRef,
	// configMapKeyRef) names in an object of kind, defined as data.
	keyRef := func(name string, vf map[string]any, field, kind string, data map[string]map[string]string) {
		on, key := depStr(depDig(vf, field, "name")), depStr(depDig(vf, field, "key"))
		v, ok := data[on][key]
		if !ok {
			c.errorf("%s: env %s reads key %s of %s %s, which the manifests do not define", where, name, key, kind, on)
		}
		own[name], source[name] = v, kind+" "+on
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
			keyRef(name, vf, "secretKeyRef", "Secret", secrets)
		case vf["configMapKeyRef"] != nil:
			keyRef(name, vf, "configMapKeyRef", "ConfigMap", configMaps)
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
