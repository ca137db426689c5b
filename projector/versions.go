package projector

import (
	"context"
	"errors"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/projection"
)

// retireAll deletes what the projection's other versions and the
// projections of RunnerConfig.Retired left once nothing uses them: their
// durable consumers, for each version that the pointer names neither as
// active, shadow nor previous collection (its projectors write nothing
// any more) and that no process runs (none answers its roll call). A
// rolling upgrade leaves the old version's consumers behind, each holding
// its place in the stream and kept by JetStream for ever. An old binary
// started again afterwards creates its consumers anew (from the stream's
// start) and writes nothing, since the pointer names no collection of its
// version. Any member may run it at any time: deleting what another
// member already deleted is not an error.
func (r *Runner) retireAll(ctx context.Context) error {
	ptr, err := r.proj.Pointer(ctx, 0)
	if err != nil {
		return err
	}
	st, err := r.js.Stream(ctx, r.cfg.Stream)
	if err != nil {
		return err
	}
	var consumers []string
	names := st.ConsumerNames(ctx)
	for c := range names.Name() {
		consumers = append(consumers, c)
	}
	if err := names.Err(); err != nil {
		return err
	}
	named := map[int]bool{ptr.ActiveVer(): true, ptr.ShadowVer(): true, ptr.PreviousVer(): true, r.proj.Version(): true}
	if err := r.retireUnless(ctx, st, consumers, r.name, named); err != nil {
		return err
	}
	for _, name := range r.cfg.Retired {
		if err := r.retireUnless(ctx, st, consumers, name, nil); err != nil {
			return err
		}
	}
	return nil
}

// retireUnless deletes, of st's consumers, those of each version of
// projection name but those in keep, when no process runs that version.
func (r *Runner) retireUnless(ctx context.Context, st jetstream.Stream, consumers []string, name string, keep map[int]bool) error {
	byVersion := map[int][]string{}
	for _, c := range consumers {
		if v, ok := consumerVersion(name, c); ok && !keep[v] {
			byVersion[v] = append(byVersion[v], c)
		}
	}
	for _, v := range slices.Sorted(maps.Keys(byVersion)) {
		live, err := RollCall(ctx, r.js.Conn(), projection.VersionKey(name, v))
		if err != nil {
			return err
		}
		if len(live) > 0 {
			continue
		}
		for _, c := range byVersion[v] {
			if err := st.DeleteConsumer(ctx, c); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return err
			}
		}
		r.log.Info("projection version retired: its consumers deleted", "projection", name, "retired_version", v, "consumers", len(byVersion[v]))
	}
	return nil
}

// consumerName matches a consumer's name after "proj_<name>_": "pNN" for
// a partition of version 1, "v<n>_pNN" for one of version n, and "v<n>"
// for a Sequenced projection's one consumer of version n
// (Runner.ConsumerName).
var consumerName = regexp.MustCompile(`^(?:v([0-9]+)_p[0-9]{2,}|p[0-9]{2,}|v([0-9]+))$`)

// consumerVersion returns the version of projection name whose partition
// consumer consumer is, and false when it is not one.
func consumerVersion(name, consumer string) (int, bool) {
	rest, ok := strings.CutPrefix(consumer, "proj_"+name+"_")
	m := consumerName.FindStringSubmatch(rest)
	if !ok || m == nil {
		return 0, false
	}
	n := m[1] + m[2]
	if n == "" {
		return 1, true
	}
	v, err := strconv.Atoi(n)
	return v, err == nil && v > 1
}
