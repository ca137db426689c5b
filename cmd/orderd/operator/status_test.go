package operator

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/admin"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/outbox"
	"github.com/orderd/orderd/projector"
)

// statusRows reads the table "orderd status" printed: for each projection,
// its cells by column heading. Cells are cut at the columns' offsets in the
// heading line (tabwriter aligns them), so cells with spaces read whole.
func statusRows(t *testing.T, out string) map[string]map[string]string {
	t.Helper()
	lines := strings.Split(out, "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "PROJECTION ") {
		t.Fatalf("no table heading in:\n%s", out)
	}
	head := lines[0]
	starts := regexp.MustCompile(`\S+( \S+)*`).FindAllStringIndex(head, -1)
	rows := map[string]map[string]string{}
	for _, l := range lines[1:] {
		if strings.TrimSpace(l) == "" {
			break // the notes follow an empty line
		}
		row := map[string]string{}
		for i, s := range starts {
			end := len(l)
			if i+1 < len(starts) {
				end = min(starts[i+1][0], len(l))
			}
			if s[0] < end {
				row[head[s[0]:s[1]]] = strings.TrimSpace(l[s[0]:end])
			}
		}
		rows[row["PROJECTION"]] = row
	}
	return rows
}

// TestStatusTable prints a status with every kind of cell and note, and
// no server: the service's projection, order_summaries, while a deploy's
// version is built, then after a switch back with dead letters and a
// repaired drift.
func TestStatusTable(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	lag, readers, pct := uint64(12), uint64(2), 49
	behind := 3.25
	long := "apply order-9: " + strings.Repeat("field x is not valid; ", 10) + "\nsecond line"
	api, err := orderhttp.NewClient(orderhttp.ClientConfig{URL: "http://orderd:8080"})
	if err != nil {
		t.Fatal(err)
	}
	c := &command{api: api}
	show := func(p admin.ProjectionStatus) string {
		t.Helper()
		var b bytes.Buffer
		if err := printStatus(&b, c, []admin.ProjectionStatus{p}, now); err != nil {
			t.Fatal(err)
		}
		t.Logf("\n%s", b.String())
		return b.String()
	}
	wantCells := func(out string, want map[string]string) {
		t.Helper()
		rows := statusRows(t, out)
		if len(rows) != 1 {
			t.Errorf("%d rows, want 1:\n%s", len(rows), out)
		}
		for col, v := range want {
			if got := rows["order_summaries"][col]; got != v {
				t.Errorf("order_summaries %s = %q, want %q", col, got, v)
			}
		}
	}
	wantNotes := func(out string, notes ...string) {
		t.Helper()
		for _, s := range notes {
			if !strings.Contains(out, s) {
				t.Errorf("notes lack %q", s)
			}
		}
	}

	building := show(admin.ProjectionStatus{ProjectionStatus: jobs.ProjectionStatus{Name: "order_summaries", Version: 3, ActiveCollection: "order_summaries_r1", ActiveVersion: 2,
		ShadowCollection: "order_summaries_r2", ShadowVersion: 3, PreviousCollection: "order_summaries", PreviousVersion: 1,
		ConsumerLag: &lag, ConsumerLagVersion: 3, ActiveLag: &readers, ShadowLag: &lag,
		LastVerify: &jobs.VerifySummary{Job: "v1", State: jobs.StateSucceeded, FinishedAt: now.Add(-2 * time.Minute), Drift: 3},
		LastRebuild: &jobs.JobSummary{Job: "job-7", State: jobs.StateRunning, Events: 4900,
			JobPhase: jobs.JobPhase{Phase: "scanning", Step: 1, Steps: 3, Percent: &pct, PhaseETASeconds: 12}}},
		Partitions: []projector.PartitionStatus{
			{Partition: 0, Consumer: "proj_order_summaries_p00", Owner: "projector-1", PinnedAt: now.Add(-8 * time.Second),
				Lag: &lag, LagSeconds: &behind, Applied: 1520, ApplyRate: 12.44},
			{Partition: 1, Consumer: "proj_order_summaries_p01"},
		}})
	// The instance folds v3, being built: its consumers' lag is the
	// build's, not what readers of v2 see.
	wantCells(building, map[string]string{"VERSION": "v2 (building v3, previous v1)", "ACTIVE COLLECTION": "order_summaries_r1", "LAG": "2",
		"BUILD LAG": "12 (v3)", "DEAD LETTERS": "0", "LAST VERIFY": "drift 3 2m ago", "LAST REBUILD": "running 1/3 scanning 49% ETA 12s", "LAST ERROR": "-"})
	// The partitions' table: its own heading, one row per partition.
	_, parts, ok := strings.Cut(building, "\n\nPROJECTION ")
	if !ok {
		t.Fatalf("no partition table in:\n%s", building)
	}
	lines := strings.Split(parts, "\n")
	if got := strings.Fields(lines[0]); !slices.Equal(got, []string{"PARTITION", "OWNER", "PINNED", "FOR", "LAG", "BEHIND", "APPLIED", "RATE/S"}) {
		t.Errorf("partition heading %q", lines[0])
	}
	for i, want := range [][]string{
		{"order_summaries", "0", "projector-1", "8s", "12", "3.2s", "1520", "12.4"},
		{"order_summaries", "1", "-", "-", "-", "-", "0", "0.0"},
	} {
		if got := strings.Fields(lines[1+i]); !slices.Equal(got, want) {
			t.Errorf("partition row %d: %q, want %q", i, got, want)
		}
	}
	wantNotes(building,
		"orderd rebuild order_summaries -cancel job-7",
		"filling order_summaries_r2",
		"http://orderd:8080/v1/admin/projections/order_summaries/rebuilds/job-7",
		"orderd verify order_summaries -repair",
		"order_summaries (version 1) is kept for the rebuild grace after the last switch; read it again with: orderd switch-back order_summaries")

	switchedBack := show(admin.ProjectionStatus{ProjectionStatus: jobs.ProjectionStatus{Name: "order_summaries", Version: 2, ActiveCollection: "order_summaries", ActiveVersion: 1,
		SwitchedBackFrom: 2, DeadLetters: 2, LastError: long,
		LastVerify: &jobs.VerifySummary{Job: "v2", State: jobs.StateSucceeded, FinishedAt: now.Add(-5 * time.Hour), Drift: 4, Repaired: 4}}})
	wantCells(switchedBack, map[string]string{"VERSION": "v1", "ACTIVE COLLECTION": "order_summaries", "LAG": "-", "BUILD LAG": "-", "DEAD LETTERS": "2",
		"LAST VERIFY": "repaired 4 5h ago", "LAST REBUILD": "-", "LAST ERROR": truncate(long, statusErrorWidth)})
	if e := statusRows(t, switchedBack)["order_summaries"]["LAST ERROR"]; len([]rune(e)) != statusErrorWidth || !strings.HasSuffix(e, "...") || strings.Contains(e, "\n") {
		t.Errorf("last error not cut to one line of %d characters: %q", statusErrorWidth, e)
	}
	wantNotes(switchedBack,
		"order_summaries: 2 dead letters",
		"'http://orderd:8080/v1/admin/dead-letters?projection=order_summaries'",
		"order_summaries: version 2 was switched back from and is not built again on its own; build it with: orderd rebuild order_summaries")
	if strings.Contains(switchedBack, "orderd verify order_summaries -repair") {
		t.Errorf("a repair suggested for a verify that repaired everything")
	}

	for d, want := range map[time.Duration]string{0: "just now", -time.Second: "just now", 42 * time.Second: "42s ago",
		2*time.Minute + 5*time.Second: "2m ago", 5 * time.Hour: "5h ago", 47 * time.Hour: "47h ago", 72 * time.Hour: "3d ago"} {
		if got := ago(d); got != want {
			t.Errorf("ago(%v) = %q, want %q", d, got, want)
		}
	}
}

// The relay's line says who holds its lease and how far its checkpoint
// has come, and what to do when nobody holds it.
func TestPrintRelay(t *testing.T) {
	now := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		relay outbox.RelayStatus
		want  []string
	}{
		{outbox.RelayStatus{}, []string{"no relay has run", "relay role"}},
		{outbox.RelayStatus{Owner: "api-1", Epoch: 4, LeaseUntil: now.Add(7 * time.Second), CheckpointRecordedAt: now.Add(-3 * time.Second), CheckpointSavedAt: now.Add(-time.Second)},
			[]string{"held by api-1 (epoch 4, lease for 7s more)", "2026-11-27T09:59:57Z (3s ago)", "saved 1s ago"}},
		{outbox.RelayStatus{Owner: "api-1", Epoch: 4, LeaseUntil: now.Add(-time.Minute), CheckpointRecordedAt: now.Add(-2 * time.Minute), CheckpointSavedAt: now.Add(-2 * time.Minute)},
			[]string{"held by nobody (last api-1", "relay role running?", "(2m ago)"}},
	} {
		var b bytes.Buffer
		if err := printRelay(&b, c.relay, now); err != nil {
			t.Fatal(err)
		}
		for _, w := range c.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("relay %+v: %q lacks %q", c.relay, b.String(), w)
			}
		}
	}
}
