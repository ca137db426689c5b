# orderd: event-sourced order service. `make run` and `make test` are all a
# fresh machine needs (Go from /usr/local/go or PATH; modules from the proxy).
export PATH := $(PATH):/usr/local/go/bin
GO      ?= go
MODULE  := $(shell $(GO) list -m)
# A count, not a duration: Go 1.26's fuzz coordinator can report its own
# -fuzztime deadline as a failure ("context deadline exceeded", no crasher;
# go.dev/issue/75804, fixed in Go 1.27). A count has no deadline to race.
FUZZTIME ?= 20000x

.PHONY: all build run test test-short lint lint-api node fuzz chaos bench bench-1m replay clean browser screenshots

all: lint build

build:
	$(GO) build -o bin/orderd ./cmd/orderd

## run: the whole service on embedded servers, data under ./data
run: build
	./bin/orderd serve -data-dir ./data

## test: lint, every test with the race detector, then a short fuzz run
# -vet=off: lint's go vet ./... has run every analyzer go test would, on
# the same packages and their tests.
test: lint browser
	$(GO) test -race -count=1 -vet=off -timeout 20m ./...
	$(MAKE) fuzz FUZZTIME=$(FUZZTIME)

lint: lint-api
	$(GO) vet ./...
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './data/*')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@ext=$$($(GO) list -deps -f '{{if not .Standard}}{{.ImportPath}}{{end}}' ./domain | grep -v '^$(MODULE)/domain$$' || true); \
	  if [ -n "$$ext" ]; then echo "domain must import only the standard library, found:"; echo "$$ext"; exit 1; fi
	@tags=$$(grep -n 'bson:"' domain/*.go || true); \
	  if [ -n "$$tags" ]; then echo "domain keeps no storage tags (the adapter's documents do):"; echo "$$tags"; exit 1; fi
	@v1=$$(grep -rn --include='*.go' '"go.mongodb.org/mongo-driver/' . | grep -v -e '^./data/' -e 'mongo-driver/v2/' || true); \
	  if [ -n "$$v1" ]; then echo "the MongoDB driver is v2; these import v1:"; echo "$$v1"; exit 1; fi
	@drv=$$($(GO) list -f '{{.ImportPath}} {{join .Imports " "}}' ./... | grep ' go.mongodb.org/mongo-driver/' | cut -d' ' -f1 | \
	  grep -v -e '^$(MODULE)/mongodb' -e '^$(MODULE)/internal/' -e '^$(MODULE)/cmd/' -e 'test$$' || true); \
	  if [ -n "$$drv" ]; then echo "only the mongodb adapter, internal/, cmd/ and test helpers import the MongoDB driver; also:"; echo "$$drv"; exit 1; fi
	@ports=$$($(GO) list -f '{{.ImportPath}} {{join .Imports " "}}' ./projection/... ./projector/... ./jobs/... ./admin/... ./outbox/... | grep -E ' $(MODULE)/mongodb( |$$)' | cut -d' ' -f1 || true); \
	  if [ -n "$$ports" ]; then echo "projection, projector, jobs, admin and outbox declare what they need of the storage; only cmd/ gives them the mongodb adapter, yet these import it:"; echo "$$ports"; exit 1; fi
	@up=$$($(GO) list -f '{{.ImportPath}} {{join .Imports " "}}' ./jobs | grep -E ' $(MODULE)/projector( |$$)' | cut -d' ' -f1 || true); \
	  if [ -n "$$up" ]; then echo "a worker imports no other worker's nouns; jobs imports projector"; exit 1; fi
	@svc=$$($(GO) list -f '{{.ImportPath}} {{join .Imports " "}}' ./mongodb | grep -E ' $(MODULE)/(admin|http)( |$$)' | cut -d' ' -f1 || true); \
	  if [ -n "$$svc" ]; then echo "the mongodb adapter imports no service package (admin, http)"; exit 1; fi
	$(GO) build -tags noembed -o /dev/null ./cmd/orderd

## lint-api: http/openapi.json under Redocly's recommended rules and Spectral's
## spectral:oas ruleset (tools/apilint); an error in either fails, warnings are shown;
## and http/api/api.gen.go must be what the document generates (go generate ./http/api)
APILINT := tools/apilint
# The generator as pinned in the go:generate line of http/api/doc.go.
OAPI_CODEGEN = $(shell sed -n 's|^//go:generate go run \([^ ]*\) .*|\1|p' http/api/doc.go)
lint-api: $(APILINT)/node_modules/.installed
	@rc=0; \
	REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
	  $(APILINT)/node_modules/.bin/redocly lint --config $(APILINT)/redocly.yaml --format=stylish http/openapi.json || rc=1; \
	$(APILINT)/node_modules/.bin/spectral lint --ruleset $(APILINT)/.spectral.yaml http/openapi.json || rc=1; \
	gen=$$(mktemp); \
	(cd http/api && $(GO) run $(OAPI_CODEGEN) -config oapi-codegen.yaml -o $$gen ../openapi.json) || rc=1; \
	if ! cmp -s $$gen http/api/api.gen.go; then \
	  echo "http/api/api.gen.go is not what http/openapi.json generates: run go generate ./http/api"; rc=1; fi; \
	rm -f $$gen; \
	exit $$rc

# The linters' pinned install, redone when the lock file changes: npm ci
# empties node_modules first, so the stamp exists only after a whole
# install. No install scripts: the linters need none (core-js prints a
# banner, @scarf/scarf reports the install to its vendor).
$(APILINT)/node_modules/.installed: $(APILINT)/package.json $(APILINT)/package-lock.json | node
	npm ci --prefix $(APILINT) --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $@

## node: Debian's nodejs and npm, which run the API linters
node:
	@pkgs=$$(command -v node >/dev/null || echo nodejs; command -v npm >/dev/null || echo npm); \
	if [ -n "$$pkgs" ]; then \
	  echo "installing Debian's $$pkgs for the API linters"; \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$pkgs; fi

## browser: Debian's chromium, which the console's browser tests drive (they fail without it)
browser:
	@if [ ! -x /usr/bin/chromium ]; then \
	  echo "installing Debian's chromium for the console tests"; \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq chromium; fi

## screenshots: the console's pages, against data the test creates, into docs/console
screenshots: browser
	$(GO) test ./cmd/orderd -run '^TestConsole$$' -count=1 -console.screenshots

## fuzz: each fuzz target for FUZZTIME executions on top of its committed seed corpus
# The targets are found in the sources: go test -list builds and links a
# test binary of each package just to name them.
fuzz:
	@for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' domain/*_test.go); do \
	  $(GO) test ./domain -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) || exit 1; done
	@for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' http/*_test.go); do \
	  $(GO) test ./http -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) || exit 1; done

## chaos: the fault tests' long variants: more load, more kills, longer outages; the atomicity races at full size
chaos:
	$(GO) test ./mongodb -run '^TestAtomicity$$' -count=1 -timeout 20m -v -chaos.long
	$(GO) test ./cmd/orderd -run '^TestChaos' -count=1 -timeout 20m -v -chaos.long
	$(GO) test ./projector -run '^TestNATSCluster' -count=1 -timeout 20m -v -chaos.long

## bench: raw store limit, command throughput, accepted-to-visible latency, rebuild rate against the raw scan,
## rebuild under load, the relay's publish rate against raw async publishes, projection apply rate with
## 1-3 projectors against raw updates, the read routes' latency against the raw look-up
bench:
	$(GO) test ./outbox -run '^$$' -bench . -benchtime 1x -timeout 10m
	$(GO) test ./cmd/orderd -run '^$$' -bench . -benchtime 1x -timeout 60m

## bench-1m: BenchmarkRebuild's peak RSS and rate (the summaries' and the daily sales rollup's) and
## BenchmarkReadRoutes on a log of REBUILD_EVENTS events, 1 partition
REBUILD_EVENTS ?= 1000000
bench-1m:
	$(GO) test ./cmd/orderd -run '^$$' -bench '^BenchmarkRebuild$$' -benchtime 1x -timeout 4h \
	  -rebuild.events=$(REBUILD_EVENTS) -rebuild.partitions=1 -rebuild.sorted-scan=false
	$(GO) test ./cmd/orderd -run '^$$' -bench '^BenchmarkReadRoutes$$' -benchtime 1x -timeout 4h \
	  -readroutes.events=$(REBUILD_EVENTS)

## replay: import the Olist sample into a running `make run` and check it
replay: build
	./bin/orderd import-olist -data testdata/olist-sample

clean:
	rm -rf bin
