package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
)

// -console.screenshots: save a PNG of each console page into docs/console
// (make screenshots).
var consoleScreenshots = flag.Bool("console.screenshots", false, "save a PNG of each console page into docs/console (make screenshots)")

// chromiumPath is Debian's chromium; `make browser` installs it.
const chromiumPath = "/usr/bin/chromium"

// browserTab starts a headless Chromium with a fresh profile and returns a
// tab in it, closed when the test ends. A missing Chromium fails the test:
// a skipped browser test would pass CI without testing anything.
func browserTab(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath
	if _, err := os.Stat(path); err != nil {
		if path, err = exec.LookPath("chromium"); err != nil {
			t.Fatalf("no Chromium at %s or on PATH: run `make browser` (apt-get install chromium)", chromiumPath)
		}
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1366, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tab, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	// The first call starts the browser, which lives as long as the
	// context of that call: it takes no timeout (the test's bounds it).
	if err := chromedp.Do(tab); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return tab
}

// page drives one tab of the console for one (sub)test.
type page struct {
	t   *testing.T
	tab context.Context
}

// onFailure saves a full-page screenshot into the test's artifact
// directory (kept with go test -artifacts) if the test has failed.
func (p *page) onFailure(t *testing.T) {
	dir := t.ArtifactDir()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		name := filepath.Join(dir, "failure.png")
		if err := p.screenshot(name); err != nil {
			t.Logf("screenshot on failure: %v", err)
			return
		}
		t.Logf("screenshot of the page at the failure: %s", name)
	})
}

func (p *page) screenshot(name string) error {
	ctx, cancel := context.WithTimeout(p.tab, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		return err
	}
	return os.WriteFile(name, png, 0o644)
}

// save writes the page's screenshot to docs/console/<name>.png when
// -console.screenshots is set.
func (p *page) save(name string) {
	p.t.Helper()
	if !*consoleScreenshots {
		return
	}
	dir := filepath.Join("..", "..", "docs", "console")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := p.screenshot(filepath.Join(dir, name+".png")); err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
}

// run runs actions, bounded by d.
func (p *page) run(d time.Duration, what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab, d)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// waitJS waits, at most d, until the JavaScript expression is truthy.
func (p *page) waitJS(d time.Duration, what, expr string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab, d+5*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool]("!!("+expr+")",
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(d)))
	if err != nil {
		p.t.Fatalf("wait %v for %s: %v", d, what, err)
	}
}

// eval evaluates a JavaScript expression in the page into a T.
func eval[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// eval evaluates a JavaScript expression in the page and decodes its
// JSON value into v.
func (p *page) eval(expr string, v any) {
	p.t.Helper()
	raw := eval[json.RawMessage](p, expr)
	if err := json.Unmarshal(raw, v); err != nil {
		p.t.Fatalf("evaluate %s: %s: %v", expr, raw, err)
	}
}

// open shows a console route (the URL fragment) in the loaded console and
// waits for the page to be shown. Only the fragment changes, as when an
// operator follows the console's own links.
func (p *page) open(route, pageName string) {
	p.t.Helper()
	eval[string](p, fmt.Sprintf(`location.hash = %q`, route))
	p.waitJS(10*time.Second, "page "+pageName, fmt.Sprintf(`document.getElementById('page').dataset.page === %q && !document.getElementById('page').hidden`, pageName))
}

// fitsWindow checks that the page shown is no wider than the window
// (a horizontal scroll bar hides columns off to the right) and that its
// column headers are labels, not the API's snake_case keys.
func (p *page) fitsWindow(what string) {
	p.t.Helper()
	var size struct{ Scroll, Inner int }
	p.eval(`({Scroll: document.documentElement.scrollWidth, Inner: window.innerWidth})`, &size)
	if size.Scroll > size.Inner {
		var wide []string
		p.eval(`Array.from(document.querySelectorAll('#page *')).filter(e => e.getBoundingClientRect().right > window.innerWidth + 1 && e.parentElement.getBoundingClientRect().right <= window.innerWidth + 1).slice(0, 8).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ').join('.') : '') + ' ' + Math.round(e.getBoundingClientRect().width) + 'px')`, &wide)
		p.t.Errorf("%s: the document is %d px wide in a %d px window; first elements past the edge: %q", what, size.Scroll, size.Inner, wide)
	}
	var raw []string
	p.eval(`Array.from(document.querySelectorAll('#page thead th')).map(th => th.textContent.trim()).filter(s => /\b[a-z0-9]+_[a-z0-9_]+\b/.test(s))`, &raw)
	if len(raw) != 0 {
		p.t.Errorf("%s: column headers with raw keys: %q", what, raw)
	}
}

// idleCharts checks the projections page's charts whose samples are all
// zero: each must say so, not claim a maximum of 1.0 nor that nothing
// has been sampled yet, and at least one such chart must be on the page.
func (p *page) idleCharts() {
	p.t.Helper()
	var idle []struct{ Caption, Axis string }
	p.eval(`Array.from(document.querySelectorAll('figure.chart')).filter(f => f.dataset.max === '0').map(f => ({Caption: f.querySelector('figcaption').textContent, Axis: Array.from(f.querySelectorAll('svg text')).map(t => t.textContent).join(' | ') + ' | ' + f.querySelector('svg').getAttribute('aria-label')}))`, &idle)
	if len(idle) == 0 {
		p.t.Fatal("no idle chart on the projections page to check")
	}
	for _, c := range idle {
		if strings.Contains(c.Caption, "max 1.0") || strings.Contains(c.Axis, "1.0") || strings.Contains(c.Caption, "nothing yet") ||
			strings.Contains(c.Caption, "no samples") || !strings.Contains(c.Caption, "0 in all") {
			p.t.Errorf("idle chart: caption %q, axis %q; want no max of 1.0 and a caption that says every sample was 0", c.Caption, c.Axis)
		}
	}
}

// headersWhole checks that no column header on the page is broken inside
// a word: each word of each header is laid out on one line.
func (p *page) headersWhole(what string) {
	p.t.Helper()
	var broken []string
	p.eval(`Array.from(document.querySelectorAll('#page th')).filter(th => th.getClientRects().length > 0).flatMap(th => {
		const out = [];
		const walk = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
		for (let n = walk.nextNode(); n; n = walk.nextNode()) {
			for (const m of n.textContent.matchAll(/\S+/g)) {
				const r = document.createRange();
				r.setStart(n, m.index);
				r.setEnd(n, m.index + m[0].length);
				const tops = new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top)));
				if (tops.size > 1) out.push(th.textContent.trim() + ': ' + m[0]);
			}
		}
		return out;
	})`, &broken)
	if len(broken) != 0 {
		p.t.Errorf("%s: column headers broken inside a word: %q", what, broken)
	}
}

// lines returns how many lines of text the element el (a JavaScript
// expression) is laid out on.
func lines(p *page, el string) int {
	p.t.Helper()
	return eval[int](p, `(() => { const r = document.createRange(); r.selectNodeContents(`+el+`);
		return new Set(Array.from(r.getClientRects()).filter(x => x.width > 0).map(x => Math.round(x.top))).size; })()`)
}

// TestConsole boots the service, places and moves orders, and drives
// every page of the operator console in headless Chromium.
func TestConsole(t *testing.T) {
	m := runAdminMain(t)
	c := newClient(t, m)
	tab := browserTab(t)
	base := "http://" + m.HTTPAddr + "/console/"

	// Orders: con-1..con-4 placed, moved along, and projected.
	steps := map[string][]string{
		"con-1": {"approve"},
		"con-2": {"approve", "ship"},
		"con-3": {"approve", "invoice", "ship", "deliver"},
		"con-4": {"cancel"},
	}
	for i, id := range []string{"con-1", "con-2", "con-3", "con-4"} {
		a := c.place(id, fmt.Sprintf("cust-con-%d", i%2), int64(i+1), 1990, 500)
		for _, s := range steps[id] {
			a = c.step(id, s)
		}
		c.summaryEqualsOrder(id, a.Version)
	}
	c.waitStats("cust-con-0", func(s customerStats) bool { return s.OrderCount == 2 })
	c.waitStats("cust-con-1", func(s customerStats) bool { return s.OrderCount == 2 })

	sub := func(name string, f func(t *testing.T, p *page)) {
		t.Run(name, func(t *testing.T) {
			p := &page{t: t, tab: tab}
			p.onFailure(t)
			f(t, p)
		})
	}
	var rebuildRoute, verifyRoute string // the job pages the subtests left
	ok := true
	ok = ok && t.Run("login", func(t *testing.T) {
		p := &page{t: t, tab: tab}
		p.onFailure(t)
		p.run(20*time.Second, "open the console", chromedp.Navigate(base))
		p.run(10*time.Second, "login form", chromedp.WaitVisible("#token"))
		// A wrong token is refused by the API (401) and the form stays.
		p.run(10*time.Second, "sign in with a wrong token",
			chromedp.SendKeys("#token", "not-the-token"), chromedp.Click("#login-form button"))
		p.waitJS(10*time.Second, "the 401 shown on the login form",
			`document.getElementById('login-message').textContent.includes('401') && !document.getElementById('login').hidden`)
		p.run(10*time.Second, "sign in",
			chromedp.SendKeys("#token", testAdminToken), chromedp.Click("#login-form button"))
		p.waitJS(10*time.Second, "the projections page", `document.querySelectorAll('tr[data-projection]').length === 2`)
		var leaks []string
		p.eval(fmt.Sprintf(`[location.href, document.documentElement.outerHTML, ...performance.getEntriesByType('resource').map(e => e.name)].filter(s => s.includes(%q))`, testAdminToken), &leaks)
		if len(leaks) != 0 {
			t.Errorf("the token is in a URL or in the page: %q", leaks)
		}
		var stored string
		p.eval(`sessionStorage.getItem('orderd.adminToken')`, &stored)
		if stored != testAdminToken {
			t.Errorf("session storage holds %q, want the token", stored)
		}
	})
	if !ok {
		t.Fatal("not signed in: the pages cannot be tested")
	}

	sub("projections", func(t *testing.T, p *page) {
		p.open("#/projections", "projections")
		for _, name := range []string{"order_summaries"} {
			row := fmt.Sprintf(`document.querySelector('tr[data-health=%q]')`, name)
			p.waitJS(20*time.Second, name+"'s health line with lag 0",
				row+` && `+row+`.querySelector('td.lag').dataset.lag === '0' && `+row+`.querySelector('td.lag').textContent.includes('0')`)
			// The apply rate is the server's: two of its samples (5 s apart).
			p.waitJS(20*time.Second, name+" with an apply rate", row+`.querySelector('td.rate').dataset.rate !== ''`)
			p.waitJS(20*time.Second, name+"'s lag chart",
				fmt.Sprintf(`document.querySelector('[data-chart-of=%q] polyline.lag') !== null`, name))
			var cells []string
			p.eval(`Array.from(`+row+`.querySelectorAll('td')).map(td => td.textContent)`, &cells)
			if len(cells) != 6 || !strings.Contains(cells[0], "✓ up to date") || !strings.Contains(cells[1], "✓ 0") ||
				cells[2] == "" || strings.Contains(cells[2], "unknown") || !strings.Contains(cells[4], "✓ 0") || !strings.Contains(cells[5], "none") {
				t.Errorf("%s health line: %q", name, cells)
			}
			detail := fmt.Sprintf(`document.querySelector('tr[data-projection=%q]')`, name)
			p.eval(`Array.from(`+detail+`.querySelectorAll('td')).map(td => td.textContent)`, &cells)
			if len(cells) != 4 || !strings.Contains(cells[2], "never") || !strings.Contains(cells[3], "never") {
				t.Errorf("%s details: %q", name, cells)
			}
			// The pointer's generation says what it counts, in place.
			var gen struct{ Text, Title string }
			p.eval(detail+` && (g => ({Text: g.textContent, Title: g.title}))(`+detail+`.querySelector('td.collections .generation'))`, &gen)
			if !strings.Contains(gen.Text, "writes of the pointer") || !strings.Contains(gen.Title, "Each write") {
				t.Errorf("%s's generation: %q (title %q), want it explained", name, gen.Text, gen.Title)
			}
			// The versions: the one readers read, nothing built or kept.
			var version string
			p.eval(detail+`.querySelector('td.collections .version').textContent`, &version)
			if want := fmt.Sprintf("version %d", projection.OrderSummaries.Ver()); version != want ||
				strings.Contains(cells[0], "previous") || strings.Contains(cells[0], "building") {
				t.Errorf("%s versions: %q in %q, want %q", name, version, cells[0], want)
			}
		}
		// Above the lines, one line answers "is everything healthy?".
		p.waitJS(20*time.Second, "the health summary: healthy",
			`document.getElementById('health-summary').dataset.state === 'ok'`)
		var summary struct {
			Text           string
			Top, HealthTop float64
		}
		p.eval(`(() => { const s = document.getElementById('health-summary'); return {Text: s.textContent, Top: s.getBoundingClientRect().top, HealthTop: document.getElementById('health-table').getBoundingClientRect().top}; })()`, &summary)
		if !strings.HasPrefix(summary.Text, "✓ Healthy") || !strings.Contains(summary.Text, "relay running") || !strings.Contains(summary.Text, "this instance ready") {
			t.Errorf("health summary %q, want healthy with the relay running and this instance ready", summary.Text)
		}
		if summary.Top >= summary.HealthTop {
			t.Errorf("the health summary (%v px down) is not above the health lines (%v px)", summary.Top, summary.HealthTop)
		}

		// The relay's line: this process holds the lease and runs the
		// relay, so it counts the catch-ups; the checkpoint has an age.
		relay := `document.querySelector('tr[data-health="relay"]')`
		p.waitJS(40*time.Second, "the relay's line with its holder, checkpoint age and catch-ups",
			relay+` && `+relay+`.querySelector('[data-relay-owner]')?.dataset.relayOwner && `+relay+`.querySelector('td.checkpoint-age').dataset.age !== '' && `+relay+`.querySelector('td.catchups').dataset.catchups === '0'`)
		// The partitions are folded: listed, not shown.
		var fold struct {
			Open    bool
			Tables  int
			Visible bool
		}
		p.eval(`(() => { const d = document.getElementById('partitions-fold'); return {Open: d.open, Tables: d.querySelectorAll('table.partitions').length, Visible: d.querySelector('table.partitions').checkVisibility()}; })()`, &fold)
		if fold.Open || fold.Tables != 2 || fold.Visible {
			t.Errorf("partitions: %+v, want a table per projection, folded away", fold)
		}
		// Nothing has moved since the service started: the charts are flat
		// at zero and must say so instead of drawing an axis up to 1.0.
		p.idleCharts()

		// Orders placed while the server samples: the apply rate rises
		// above zero and the lag returns to 0.
		for i := range 30 {
			c.place(fmt.Sprintf("con-load-%d", i), "cust-con-load", 1, 100, 0)
			time.Sleep(150 * time.Millisecond) // pacing of the load, not a wait for the page
		}
		for _, name := range []string{"order_summaries", "daily_sales"} {
			p.waitJS(30*time.Second, name+"'s apply rate above 0 in the chart",
				fmt.Sprintf(`Number(document.querySelector('[data-chart-of=%q] figure[data-series=rate]').dataset.max) > 0`, name))
			p.waitJS(20*time.Second, name+" back to lag 0",
				fmt.Sprintf(`document.querySelector('tr[data-health=%q] td.lag').dataset.lag === '0'`, name))
		}

		// A reload shows the server's history at once: every chart has
		// samples, none says it has none.
		p.run(20*time.Second, "reload the console", chromedp.Reload())
		p.waitJS(20*time.Second, "the projections page after the reload",
			`document.getElementById('page').dataset.page === 'projections' && document.querySelectorAll('#projections-charts figure.chart').length === 5`)
		var charts []struct {
			Caption string
			Samples int
		}
		p.eval(`Array.from(document.querySelectorAll('#projections-charts figure.chart')).map(f => ({Caption: f.querySelector('figcaption').textContent, Samples: Number(f.dataset.samples)}))`, &charts)
		for _, ch := range charts {
			if ch.Samples < 2 || strings.Contains(ch.Caption, "no samples") || strings.Contains(ch.Caption, "nothing yet") {
				t.Errorf("after a reload: chart %q with %d samples, want the server's history", ch.Caption, ch.Samples)
			}
		}
		var rateMax float64
		p.eval(`Number(document.querySelector('[data-chart-of="order_summaries"] figure[data-series=rate]').dataset.max)`, &rateMax)
		if rateMax <= 0 {
			t.Errorf("after a reload the apply rate chart's max is %v: the load before it is gone", rateMax)
		}

		// The first screen at 1,280 px: the health lines and the charts
		// above the fold, headers whole, nothing wider than the window.
		p.run(10*time.Second, "a 1280 px wide window", chromedp.EmulateViewport(1280, 900))
		defer p.run(10*time.Second, "the window's own size", chromedp.EmulateReset())
		p.waitJS(10*time.Second, "the page laid out at 1280 px", `window.innerWidth === 1280`)
		var bottom float64
		p.eval(`document.querySelector('#projections-charts').getBoundingClientRect().bottom`, &bottom)
		if bottom > 900 {
			t.Errorf("the charts end %v px down: below the first screen of 900 px", bottom)
		}
		p.headersWhole("#/projections at 1280 px")
		p.fitsWindow("#/projections at 1280 px")
		if n := lines(p, `document.getElementById('health-summary')`); n != 1 {
			t.Errorf("the health summary takes %d lines at 1280 px, want 1", n)
		}
		p.save("projections")
	})

	sub("rebuild", func(t *testing.T, p *page) {
		p.open("#/rebuild", "rebuild")
		p.waitJS(10*time.Second, "projections to choose from", `document.querySelector('#rebuild-projection option[value=order_summaries]') !== null`)
		p.run(10*time.Second, "start a rebuild with 2 partitions",
			chromedp.SetValue("#rebuild-projection", "order_summaries"),
			chromedp.SetValue("#rebuild-partitions", "2"),
			chromedp.Click("#rebuild-start"))
		p.waitJS(10*time.Second, "the job's page", `location.hash.startsWith('#/rebuild/order_summaries/') && document.getElementById('rebuild-job') !== null`)
		p.waitJS(60*time.Second, "the rebuild to succeed", `document.getElementById('rebuild-job').dataset.state === 'succeeded'`)
		var percent, phase string
		var value float64
		p.eval(`document.getElementById('rebuild-percent').textContent`, &percent)
		p.eval(`document.getElementById('rebuild-phase').textContent`, &phase)
		p.eval(`document.getElementById('rebuild-progress').value`, &value)
		if percent != "100 %" || value != 100 || !strings.Contains(phase, "succeeded: 100 %") {
			t.Errorf("finished rebuild shows %q, progress %v, %q", percent, value, phase)
		}
		// The job succeeds a moment before its finish task is marked done.
		p.waitJS(20*time.Second, "every task done", `document.querySelector('#tasks tr[data-task=finish]')?.dataset.state === 'done'`)
		var tasks map[string]string
		p.eval(`Object.fromEntries(Array.from(document.querySelectorAll('#tasks tr[data-task]')).map(tr => [tr.dataset.task, tr.dataset.state]))`, &tasks)
		if len(tasks) != 4 || tasks["plan"] != "done" || tasks["part-0"] != "done" || tasks["part-1"] != "done" || tasks["finish"] != "done" {
			t.Errorf("tasks %v, want plan, part-0, part-1 and finish done", tasks)
		}
		var cancelDisabled bool
		p.eval(`document.getElementById('rebuild-cancel').disabled`, &cancelDisabled)
		if !cancelDisabled {
			t.Error("cancel is offered for a finished rebuild")
		}
		rebuildRoute = eval[string](p, `location.hash`)
		p.save("rebuild")
	})

	sub("switch back", func(t *testing.T, p *page) {
		// The rebuild kept the collection it replaced: the projections
		// page offers to read it again.
		p.open("#/projections", "projections")
		row := `document.querySelector('tr[data-projection="order_summaries"]')`
		p.waitJS(20*time.Second, "the replaced collection kept, with a switch-back button",
			row+` && `+row+`.querySelector('button.switch-back') !== null && `+row+`.textContent.includes('previous v')`)
		var active string
		p.eval(row+`.querySelector('td.collections code').textContent`, &active)
		if active == "order_summaries" {
			t.Fatalf("order_summaries still reads %s after the rebuild", active)
		}
		p.save("switch-back")
		eval[bool](p, `(window.confirm = () => true, true)`) // the confirmation dialog, answered yes
		p.run(10*time.Second, "switch back", chromedp.Click(`tr[data-projection="order_summaries"] button.switch-back`))
		p.waitJS(20*time.Second, "order_summaries reading its base collection again, the rebuilt one kept",
			row+`.querySelector('td.collections code').textContent === 'order_summaries' && `+row+`.textContent.includes('`+active+`')`)
		if got := activeCollection(t, c, "order_summaries"); got != "order_summaries" {
			t.Errorf("the pointer names %s after the switch back, want order_summaries", got)
		}
	})

	sub("verify", func(t *testing.T, p *page) {
		// Drift: a summary written behind the service's back, at the
		// same version, with another status.
		active := activeCollection(t, c, "order_summaries")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		coll := m.mongo.Database(m.Config.Mongo.Database).Collection(active)
		if res, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "con-2"}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: "delivered"}, {Key: "total_cents", Value: 1}}}}); err != nil || res.ModifiedCount != 1 {
			t.Fatalf("drift con-2 in %s: %v %+v", active, err, res)
		}

		startVerify := func(repair bool) {
			p.open("#/verify", "verify")
			p.waitJS(10*time.Second, "projections to choose from", `document.querySelector('#verify-projection option[value=order_summaries]') !== null`)
			p.run(10*time.Second, "choose order_summaries", chromedp.SetValue("#verify-projection", "order_summaries"))
			eval[bool](p, fmt.Sprintf(`document.getElementById('verify-repair').checked = %v`, repair))
			p.run(10*time.Second, "start a verify", chromedp.Click("#verify-start"))
			p.waitJS(10*time.Second, "the job's page", `location.hash.startsWith('#/verify/order_summaries/') && document.getElementById('verify-job') !== null`)
			p.waitJS(60*time.Second, "the verify to succeed", `document.getElementById('verify-job').dataset.state === 'succeeded' && document.getElementById('verify-verdict') !== null`)
		}
		count := func(name string) string {
			var s string
			p.eval(fmt.Sprintf(`document.querySelector('#verify-counts tr[data-count=%q] td').textContent`, name), &s)
			return s
		}

		startVerify(false)
		var fields string
		p.waitJS(5*time.Second, "con-2 reported different", `document.querySelector('#verify-examples tr[data-id="con-2"][data-kind="different"]') !== null`)
		p.eval(`document.querySelector('#verify-examples tr[data-id="con-2"] td:last-child').textContent`, &fields)
		if fields != "status, total_cents" {
			t.Errorf("differing fields of con-2: %q, want status, total_cents", fields)
		}
		var digests string
		p.eval(`document.getElementById('verify-digests-verdict').textContent`, &digests)
		if got := count("different"); got != "1" || digests != "≠ differ" {
			t.Errorf("different %q, digests %q; want 1 and ≠ differ", got, digests)
		}
		var left, right string
		p.eval(`document.querySelectorAll('#verify-digests tbody tr:first-child td code')[0].textContent`, &left)
		p.eval(`document.querySelectorAll('#verify-digests tbody tr:first-child td code')[1].textContent`, &right)
		if left == "" || right == "" || left == right {
			t.Errorf("digests side by side: %q and %q, want two different ones", left, right)
		}
		verifyRoute = eval[string](p, `location.hash`)
		p.save("verify")

		startVerify(true)
		if got := count("repaired"); got != "1" {
			t.Errorf("repaired %q, want 1", got)
		}
		startVerify(false)
		p.waitJS(5*time.Second, "a clean report", `document.getElementById('verify-verdict').dataset.drift === '0' && document.getElementById('verify-no-examples') !== null`)
		p.eval(`document.getElementById('verify-digests-verdict').textContent`, &digests)
		if digests != "= equal" {
			t.Errorf("digests after the repair: %q", digests)
		}
		c.summaryEqualsOrder("con-2", 3)
	})

	sub("log", func(t *testing.T, p *page) {
		// More commits than a page: 12 one-commit orders on top.
		for i := range 12 {
			c.place(fmt.Sprintf("con-log-%d", i), "cust-con-log", 1, 100, 0)
		}
		var whole struct {
			Commits []struct {
				ID       string `json:"id"`
				StreamID string `json:"stream_id"`
			} `json:"commits"`
		}
		c.must(http.StatusOK, "GET", "/v1/admin/log?limit=200", "", "Authorization", "Bearer "+testAdminToken).decode(t, &whole)
		if len(whole.Commits) <= 50 || len(whole.Commits) >= 100 {
			t.Fatalf("%d commits in the log, want between 51 and 99 for two pages", len(whole.Commits))
		}
		want := make([]string, len(whole.Commits))
		for i, cm := range whole.Commits {
			want[i] = cm.ID
		}
		rows := func() []string {
			var ids []string
			p.eval(`Array.from(document.querySelectorAll('#log-table tr.commit')).map(tr => tr.dataset.id)`, &ids)
			return ids
		}

		p.open("#/log", "log")
		p.waitJS(20*time.Second, "the newest page", `document.querySelectorAll('#log-table tr.commit').length === 50`)
		if got := rows(); fmt.Sprint(got) != fmt.Sprint(want[:50]) {
			t.Errorf("first page %q, want the newest 50 %q", got, want[:50])
		}
		p.run(10*time.Second, "older", chromedp.Click("#log-older"))
		p.waitJS(20*time.Second, "every commit", fmt.Sprintf(`document.querySelectorAll('#log-table tr.commit').length === %d`, len(want)))
		if got := rows(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("two pages %q, want %q", got, want)
		}
		var olderHidden bool
		p.eval(`document.getElementById('log-older').hidden`, &olderHidden)
		if !olderHidden {
			t.Error("older is offered past the oldest commit")
		}

		// Filters: by type, by stream, by correlation id.
		filter := func(typ, stream, corr string) []string {
			t.Helper()
			eval[bool](p, fmt.Sprintf(`(document.getElementById('log-type').value = %q, document.getElementById('log-stream').value = %q, document.getElementById('log-correlation').value = %q, true)`, typ, stream, corr))
			p.run(10*time.Second, "filter", chromedp.Click("#log-apply"))
			p.waitJS(20*time.Second, "the filtered page", fmt.Sprintf(`document.getElementById('log-type')?.value === %q && document.getElementById('log-status').textContent.includes('matching') && document.getElementById('log-status').textContent.includes(%q)`, typ, typ+stream+corr))
			return rows()
		}
		if got := filter(domain.TypeOrderDelivered, "", ""); fmt.Sprint(got) != "[con-3:0000000005]" {
			t.Errorf("type OrderDelivered: %q, want con-3's v5", got)
		}
		if got := filter("", "con-3", ""); fmt.Sprint(got) != "[con-3:0000000005 con-3:0000000004 con-3:0000000003 con-3:0000000002 con-3:0000000001]" {
			t.Errorf("stream con-3: %q, want its five commits newest first", got)
		}
		var events struct {
			Events []struct {
				Metadata struct {
					CorrelationID string `json:"correlation_id"`
				} `json:"metadata"`
			} `json:"events"`
		}
		c.must(http.StatusOK, "GET", "/v1/orders/con-2/events", "").decode(t, &events)
		corr := events.Events[1].Metadata.CorrelationID
		if got := filter("", "", corr); fmt.Sprint(got) != "[con-2:0000000002]" {
			t.Errorf("correlation id %s: %q, want con-2's approve", corr, got)
		}

		// A commit's page: its events, and a link to its order.
		p.run(10*time.Second, "open the commit", chromedp.Click(`#log-table tr.commit[data-id="con-2:0000000002"] a.open-commit`))
		p.waitJS(20*time.Second, "the commit's events", `document.querySelectorAll('#commit-events li').length === 1`)
		var ev []string
		p.eval(`Array.from(document.querySelectorAll('#commit-events li dd.mono')).map(dd => dd.textContent)`, &ev)
		if len(ev) != 3 || ev[1] != corr || strings.Contains(strings.Join(ev, ""), "–") {
			t.Errorf("the commit's event id, correlation and causation ids: %q", ev)
		}
		var data string
		p.eval(`document.querySelector('#commit-events pre.data').textContent`, &data)
		if strings.TrimSpace(data) != "{}" {
			t.Errorf("OrderApproved's data shown as %q", data)
		}
		p.run(10*time.Second, "follow the link to the order", chromedp.Click("#commit-order"))
		p.waitJS(20*time.Second, "con-2's order page", `location.hash === '#/order/con-2' && document.querySelectorAll('#timeline li').length === 3`)

		// The live tail: a commit appended while the page is open appears
		// at the top, without a reload.
		p.open("#/log", "log")
		p.waitJS(20*time.Second, "the newest page", `document.querySelectorAll('#log-table tr.commit').length === 50`)
		eval[bool](p, `(window.consoleTailMarker = true)`)
		p.run(10*time.Second, "live tail on", chromedp.Click("#log-tail"))
		p.waitJS(20*time.Second, "the tail open", `document.getElementById('log-tail-status').dataset.state === 'on'`)
		a := c.place("con-tail", "cust-con-tail", 1, 100, 0)
		c.step("con-tail", "approve")
		p.waitJS(20*time.Second, "con-tail's two commits at the top",
			`document.querySelector('#log-table tr.commit')?.dataset.id === 'con-tail:0000000002' && document.querySelectorAll('#log-table tr.commit.new[data-stream="con-tail"]').length === 2`)
		if !eval[bool](p, `window.consoleTailMarker === true`) {
			t.Error("the page was reloaded")
		}
		_ = a
		p.run(10*time.Second, "a 1280 px wide window", chromedp.EmulateViewport(1280, 900))
		p.waitJS(10*time.Second, "the page laid out at 1280 px", `window.innerWidth === 1280`)
		p.headersWhole("#/log at 1280 px")
		p.save("log")
		p.fitsWindow("#/log at 1280 px")
		p.run(10*time.Second, "live tail off", chromedp.Click("#log-tail"))
		p.run(10*time.Second, "a 390 px wide window", chromedp.EmulateViewport(390, 900))
		p.fitsWindow("#/log at 390 px")
		p.open("#/log/commit/con-2:0000000002", "log")
		p.waitJS(20*time.Second, "the commit's events", `document.querySelectorAll('#commit-events li').length === 1`)
		p.fitsWindow("#/log/commit/con-2:0000000002 at 390 px")
		p.run(10*time.Second, "the window's own size", chromedp.EmulateReset())
	})

	sub("dead letters", func(t *testing.T, p *page) {
		// A poison event: v3 of con-dl reaches the projectors while the
		// log holds only v1, a gap the log cannot fill, so the projection
		// parks it.
		a := c.place("con-dl", "cust-con-dl", 1, 700, 0)
		c.summaryEqualsOrder("con-dl", a.Version)
		at := time.Now().UTC()
		event := func(v int64, d domain.EventData) domain.Event {
			return domain.Event{ID: fmt.Sprintf("con-dl-e%d", v), StreamID: "con-dl", StreamType: domain.StreamTypeOrder, Type: d.EventType(),
				Version: v, OccurredAt: domain.Timestamp(at), RecordedAt: domain.Timestamp(at), Data: d,
				Metadata: domain.Metadata{CorrelationID: "corr-con-dl", CausationID: fmt.Sprintf("cmd-con-dl-%d", v), SchemaVersion: domain.CurrentSchema(d.EventType())}}
		}
		v2, v3 := event(2, domain.OrderApproved{}), event(3, domain.OrderShipped{})
		// Under a message id of its own: the relay publishes the log's v3,
		// once appended below, under the event's id, which JetStream's
		// de-duplication would otherwise drop as this message's copy.
		publishEvent(t, m, v3, v3.ID+"-poison")

		p.open("#/dead-letters", "dead-letters")
		p.waitJS(30*time.Second, "the poison event on the page, once for the projection",
			`document.querySelectorAll('#dead-table tr.dead-letter[data-stream="con-dl"]').length === 1`)
		var errText string
		p.eval(`document.querySelector('#dead-table tr.dead-letter[data-stream="con-dl"] td.bad').textContent`, &errText)
		if strings.TrimPrefix(errText, "✗ ") == "" {
			t.Error("dead letter shown without its error")
		}
		t.Logf("dead letter error as shown: %s", errText)
		p.save("dead-letters")
		// The first screen's summary says so (the parking is also the
		// projection's last error).
		p.open("#/projections", "projections")
		p.waitJS(20*time.Second, "the health summary naming the dead letter",
			`document.getElementById('health-summary').dataset.state !== 'ok' && document.getElementById('health-summary').textContent.includes('order_summaries has 1 dead letter')`)
		t.Logf("health summary: %s", eval[string](p, `document.getElementById('health-summary').textContent`))
		p.open("#/dead-letters", "dead-letters")
		p.waitJS(30*time.Second, "the poison event on the page again",
			`document.querySelectorAll('#dead-table tr.dead-letter[data-stream="con-dl"]').length === 1`)

		// Before the fix a retry fails, and the page shows the API's
		// problem document.
		p.run(10*time.Second, "retry one", chromedp.Click(`#dead-table button.retry-one[data-id="order_summaries:con-dl-e3"]`))
		p.waitJS(20*time.Second, "the failed retry's problem document",
			`document.querySelector('#retry-log li[data-result="failed"] .problem[data-problem-type="/problems/retry-failed"][data-status="409"]') !== null`)

		// The fix: the log gets v2 and v3 (the ids of the events parked),
		// which the relay, tailing the log, publishes and the projection
		// applies; then retry all of the stream: the parked v3 is at or
		// below the read model's version by then, so the retry succeeds
		// and the list empties. (Waiting for the relay first: a retry
		// before it would apply the parked copy of v3, which carries the
		// poison's recorded time, not the log's.)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		es := mongodb.NewEventStore(m.mongo.Database(m.Config.Mongo.Database))
		if _, err := es.Append(ctx, domain.Commit{StreamID: "con-dl", StreamType: domain.StreamTypeOrder, ExpectedVersion: 1,
			Events: []domain.Event{v2, v3}}); err != nil {
			t.Fatalf("append v2 and v3 of con-dl: %v", err)
		}
		c.summaryEqualsOrder("con-dl", 3)
		p.waitJS(10*time.Second, "the retry-all button", `document.querySelector('#dead-table button.retry-stream[data-stream="con-dl"]') !== null`)
		p.run(10*time.Second, "retry all of con-dl", chromedp.Click(`#dead-table button.retry-stream[data-stream="con-dl"]`))
		p.waitJS(30*time.Second, "the retry applied and the list empty",
			`document.querySelectorAll('#retry-log li[data-result="applied"]').length === 1 && document.querySelector('#dead-table tr[data-stream="con-dl"]') === null`)
		c.summaryEqualsOrder("con-dl", 3)
	})

	sub("order", func(t *testing.T, p *page) {
		// A read model's document drifted behind the service's back: the
		// page marks the field.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sums := m.mongo.Database(m.Config.Mongo.Database).Collection(activeCollection(t, c, "order_summaries"))
		if res, err := sums.UpdateOne(ctx, bson.D{{Key: "_id", Value: "con-3"}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: "shipped"}}}}); err != nil || res.ModifiedCount != 1 {
			t.Fatalf("drift con-3's summary: %v %+v", err, res)
		}

		p.open("#/order", "order")
		p.run(10*time.Second, "look up con-3",
			chromedp.SendKeys("#order-id", "con-3"), chromedp.Click("#order-form button"))
		p.waitJS(20*time.Second, "the timeline and the read model",
			`document.querySelectorAll('#timeline li').length === 5 && document.querySelectorAll('section.read-model').length === 1`)
		var versions []int
		var types []string
		p.eval(`Array.from(document.querySelectorAll('#timeline li')).map(li => Number(li.dataset.version))`, &versions)
		p.eval(`Array.from(document.querySelectorAll('#timeline li')).map(li => li.dataset.type)`, &types)
		wantTypes := []string{domain.TypeOrderPlaced, domain.TypeOrderApproved, domain.TypeOrderInvoiced, domain.TypeOrderShipped, domain.TypeOrderDelivered}
		if fmt.Sprint(versions) != "[1 2 3 4 5]" || fmt.Sprint(types) != fmt.Sprint(wantTypes) {
			t.Errorf("timeline versions %v types %v, want 1..5 %v", versions, types, wantTypes)
		}
		var ids []string
		p.eval(`Array.from(document.querySelectorAll('#timeline li dd.mono')).map(dd => dd.textContent)`, &ids)
		if len(ids) != 15 || strings.Contains(strings.Join(ids, ""), "–") {
			t.Errorf("each event's id, correlation and causation id: %q", ids)
		}
		var states map[string]string
		p.eval(`Object.fromEntries(Array.from(document.querySelectorAll('section.read-model')).map(s => [s.dataset.projection, s.dataset.state]))`, &states)
		if len(states) != 1 || states["order_summaries"] != "different" {
			t.Errorf("read model states %v, want order_summaries different", states)
		}
		var marked []string
		p.eval(`Array.from(document.querySelectorAll('section.read-model[data-projection="order_summaries"] tr[data-differs="yes"]')).map(tr => tr.dataset.field + ' ' + tr.querySelector('td.mark').textContent)`, &marked)
		if fmt.Sprint(marked) != "[status ≠]" {
			t.Errorf("fields marked as differing: %q, want [status ≠]", marked)
		}
		// At 1,280 px the comparison's last header, one symbol, is one
		// line high.
		p.run(10*time.Second, "a 1280 px wide window", chromedp.EmulateViewport(1280, 900))
		p.waitJS(10*time.Second, "the page laid out at 1280 px", `window.innerWidth === 1280`)
		if n := lines(p, `document.querySelector('section.read-model table.compare thead th:last-child')`); n != 1 {
			t.Errorf("the comparison's \"= / ≠\" header takes %d lines at 1280 px, want 1", n)
		}
		p.fitsWindow("#/order/con-3 at 1280 px")
		p.save("order")
		p.run(10*time.Second, "the window's own size", chromedp.EmulateReset())

		// An unknown order: the API's problem document.
		p.open("#/order/no-such-order", "order")
		p.waitJS(10*time.Second, "the 404 problem document",
			`document.querySelector('#order-events .problem[data-problem-type="/problems/not-found"][data-status="404"]') !== null`)
	})

	// Every page, filled as the subtests above left it, fits the window
	// of a laptop and of a phone: no page is wider than the window, and
	// no column header is a raw JSON key.
	sub("layout", func(t *testing.T, p *page) {
		// An order as the Olist import writes them: ids of 32 hex digits
		// and several items, whose JSON has no place to break a line.
		items := make([]string, 6)
		for i := range items {
			items[i] = fmt.Sprintf(`{"sku":"4244733e06e7ecb4970a6e2683c13e%02x","quantity":%d,"unit_price_cents":%d}`, i, i+1, 1990+i)
		}
		var wide commandAnswer
		c.must(http.StatusCreated, "POST", "/v1/orders", fmt.Sprintf(`{"order_id":%q,"customer_id":%q,"currency":"BRL","items":[%s],"freight_cents":1500}`,
			"e481f51cbdc54678b7cc49136f2d6af7", "9ef432eb6251297304e76186b10a928d", strings.Join(items, ","))).decode(t, &wide)
		c.summaryEqualsOrder(wide.OrderID, wide.Version)
		routes := []struct{ route, page, ready string }{
			{"#/projections", "projections", `document.querySelectorAll('table.partitions').length === 2`},
			{rebuildRoute, "rebuild", `document.querySelector('#rebuild-job[data-state=succeeded] #tasks') !== null`},
			{verifyRoute, "verify", `document.querySelector('#verify-examples tr[data-id="con-2"]') !== null`},
			{"#/dead-letters", "dead-letters", `document.getElementById('dead-updated').textContent.includes('updated')`},
			{"#/order/con-3", "order", `document.querySelectorAll('#timeline li').length === 5 && document.querySelectorAll('section.read-model').length === 1`},
			{"#/order/" + wide.OrderID, "order", `document.querySelectorAll('#timeline li').length === 1 && document.querySelectorAll('section.read-model').length === 1`},
			{"#/log", "log", `document.querySelectorAll('#log-table tr.commit').length === 50`},
			{"#/log/commit/" + wide.OrderID + ":0000000001", "log", `document.querySelectorAll('#commit-events li').length === 1`},
		}
		for _, w := range []int64{1400, 390} {
			p.run(10*time.Second, fmt.Sprintf("a %d px wide window", w), chromedp.EmulateViewport(w, 900))
			for _, r := range routes {
				if r.route == "" {
					t.Errorf("no %s job to show: its subtest failed", r.page)
					continue
				}
				p.open(r.route, r.page)
				p.waitJS(20*time.Second, r.route+" filled", r.ready)
				p.fitsWindow(fmt.Sprintf("%s at %d px", r.route, w))
			}
		}
		p.run(10*time.Second, "the window's own size", chromedp.EmulateReset())
	})

	sub("401 signs out", func(t *testing.T, p *page) {
		eval[bool](p, `sessionStorage.setItem('orderd.adminToken', 'revoked'); location.hash = '#/dead-letters'; true`)
		p.waitJS(10*time.Second, "the login form again",
			`!document.getElementById('login').hidden && document.getElementById('page').hidden && document.getElementById('login-message').textContent.includes('401')`)
		var stored *string
		p.eval(`sessionStorage.getItem('orderd.adminToken')`, &stored)
		if stored != nil {
			t.Errorf("the refused token is still stored: %q", *stored)
		}
	})

	// The development mode's start-up banner prints the console's link with
	// its token: opening it signs in, and the token leaves the address.
	for _, link := range []string{base + "#token=" + testAdminToken, base + "?token=" + testAdminToken} {
		sub("link with the token "+strings.TrimPrefix(link, base)[:1], func(t *testing.T, p *page) {
			eval[bool](p, `sessionStorage.clear(); true`)
			p.run(20*time.Second, "open the link", chromedp.Navigate(link))
			p.waitJS(10*time.Second, "the projections page", `document.querySelectorAll('tr[data-projection]').length === 2`)
			if href := eval[string](p, `location.href`); strings.Contains(href, testAdminToken) {
				t.Errorf("the token stays in the address: %s", href)
			}
			if stored := eval[string](p, `sessionStorage.getItem('orderd.adminToken')`); stored != testAdminToken {
				t.Errorf("session storage holds %q, want the link's token", stored)
			}
		})
	}
}

// activeCollection returns the projection's active collection as the
// admin API names it.
func activeCollection(t *testing.T, c *client, projection string) string {
	t.Helper()
	var body struct {
		Projections []jobs.ProjectionStatus `json:"projections"`
	}
	c.must(http.StatusOK, "GET", "/v1/admin/projections", "", "Authorization", "Bearer "+testAdminToken).decode(t, &body)
	for _, p := range body.Projections {
		if p.Name == projection {
			return p.ActiveCollection
		}
	}
	t.Fatalf("no projection %s in %+v", projection, body)
	return ""
}

// publishEvent publishes e to the service's JetStream stream as the relay
// would, with msgID as Nats-Msg-Id, without it being in the log.
func publishEvent(t *testing.T, m *Main, e domain.Event, msgID string) {
	t.Helper()
	body, err := domain.MarshalEvent(e)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(m.Config.NATS.URL)
	if err != nil {
		t.Fatalf("nats: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg := &nats.Msg{Subject: subjectPrefix + "." + e.StreamID, Data: body, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	if ack, err := js.PublishMsg(ctx, msg); err != nil || ack.Duplicate {
		t.Fatalf("publish %s: %v (ack %+v)", e.ID, err, ack)
	}
}
