package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/orderd/orderd/cmd/orderd/operator"
	"github.com/orderd/orderd/jobs"
)

// TestStatusShowsARunningRebuild starts a rebuild in 2 partitions, paced
// so that it is still scanning when looked at, and reads it four ways at
// once: its job route, the admin API's projections route, "orderd
// status" and the console's projections page (in Chromium). All four say
// running, scanning, with progress; the projections' view used to read
// the stored state, queued until the end.
func TestStatusShowsARunningRebuild(t *testing.T) {
	m := runMainDir(t, t.TempDir(), func(c *Config) {
		c.HTTP.AdminToken = testAdminToken
		c.Jobs.Settle = 200 * time.Millisecond
		c.Jobs.BatchStreams = 1
		c.Jobs.MaxEventsPerSecond = 3 // each partition: about 8 s for the orders below
	})
	c := newClient(t, m)
	env := map[string]string{"ADMIN_TOKEN": testAdminToken, "ORDERD_URL": "http://" + m.HTTPAddr}
	auth := []string{"Authorization", "Bearer " + testAdminToken}
	var last commandAnswer
	for i := range 48 {
		last = c.place(fmt.Sprintf("order-rs-%02d", i), "cust-rs", 1, 1000, 100)
	}
	c.summaryEqualsOrder(last.OrderID, last.Version)

	// The console, signed in by the link make run prints, on its first
	// screen; it reads the projections route every 2 s.
	p := &page{t: t, tab: browserTab(t)}
	p.onFailure(t)
	p.run(20*time.Second, "open the console", chromedp.Navigate("http://"+m.HTTPAddr+"/console/#token="+testAdminToken))
	p.waitJS(20*time.Second, "the projections page", `document.querySelector('tr[data-projection="order_summaries"] td.last-rebuild') !== null`)

	var job jobs.Job
	c.must(202, "POST", "/v1/admin/projections/order_summaries/rebuilds", `{"partitions":2}`, auth...).decode(t, &job)
	jobPath := "/v1/admin/projections/order_summaries/rebuilds/" + job.ID

	var seen string
	ok := waitFor(40*time.Second, 100*time.Millisecond, func() bool {
		var j jobs.Job
		c.must(200, "GET", jobPath, "", auth...).decode(t, &j)
		if j.State.Final() {
			seen += fmt.Sprintf(" (then the job ended %s)", j.State)
			return true
		}
		if j.State != jobs.StateRunning || j.Phase != "scanning" || j.Events == 0 || j.Percent == nil {
			seen = fmt.Sprintf("job route: %s, phase %+v, %d events", j.State, j.JobPhase, j.Events)
			return false
		}
		var list struct {
			Projections []jobs.ProjectionStatus `json:"projections"`
		}
		c.must(200, "GET", "/v1/admin/projections", "", auth...).decode(t, &list)
		var r *jobs.JobSummary
		for _, p := range list.Projections {
			if p.Name == "order_summaries" {
				r = p.LastRebuild
			}
		}
		if r == nil || r.Job != job.ID || r.State != jobs.StateRunning || r.Phase != "scanning" || r.Percent == nil || r.Events == 0 {
			seen = fmt.Sprintf("job route running; projections route: last rebuild %+v", r)
			return false
		}
		out := runCLI(t, operator.Status, env)
		if out.err != nil {
			seen = out.String()
			return false
		}
		cell := statusRows(t, out.stdout)["order_summaries"]["LAST REBUILD"]
		if !strings.HasPrefix(cell, "running 1/3 scanning ") || !strings.Contains(cell, "%") {
			seen = fmt.Sprintf("job route and projections route running; orderd status LAST REBUILD %q", cell)
			return false
		}
		shown := eval[string](p, `(document.querySelector('tr[data-projection="order_summaries"] td.last-rebuild') || {}).textContent || ''`)
		if !strings.Contains(shown, "running") || !strings.Contains(shown, "1/3 scanning") || !strings.Contains(shown, "%") {
			seen = fmt.Sprintf("job route, projections route and orderd status running; the console's LAST REBUILD %q", shown)
			return false
		}
		seen = ""
		return true
	})
	if !ok || seen != "" {
		t.Fatalf("the rebuild was never shown running with progress by all four at once; last: %s", seen)
	}
	ok = waitFor(60*time.Second, 200*time.Millisecond, func() bool {
		c.must(200, "GET", jobPath, "", auth...).decode(t, &job)
		return job.State.Final()
	})
	if !ok || job.State != jobs.StateSucceeded {
		t.Fatalf("rebuild: %s %s", job.State, job.Error)
	}
}
