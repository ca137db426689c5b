package operator

import (
	"cmp"
	"context"
	"fmt"
	"io"

	"github.com/orderd/orderd/cmd/orderd/internal/cli"
)

const switchBackUsage = `Usage: orderd switch-back <projection> [flags]

Points the readers of a read model (projection) back at the collection the
last switch replaced: after a rebuild, or after a new version of the
projection's definition was built and switched to on a deploy. The
replaced collection is kept, and kept up to date by the projectors of its
version, for the rebuild grace (ORDERD_REBUILD_GRACE) after that switch;
the collection switched away from becomes the one kept. A version switched
back from is not built again on its own; deploying a higher version is.

` + adminUsage + `
Examples:
  export ADMIN_TOKEN=...                   # the server's token
  orderd status                            shows each projection's versions
  orderd switch-back order_summaries       read the previous collection again

The exit status is 0 when the switch was made.

Flags:
`

// SwitchBack runs "orderd switch-back", like Rebuild: the result goes to
// stdout. It returns nil for -h and when the switch was made.
func SwitchBack(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.FlagSet("switch-back", switchBackUsage, stderr)
	op, err := parse(fs, args, getenv, false, true)
	if op == nil {
		return err // nil for -h
	}
	name := op.projection
	st, err := op.api.SwitchBack(ctx, name)
	if err != nil {
		return op.unknownProjection(ctx, op.fail(ctx, err))
	}
	fmt.Fprintf(stdout, "%s: readers read %s (version %d) again; %s (version %d) is kept until the rebuild grace after the last switch is over\n",
		name, st.ActiveCollection, st.ActiveVersion, cmp.Or(st.PreviousCollection, "-"), st.PreviousVersion)
	return nil
}
