//go:build integration

package envtest_test

import (
	"os"
	"testing"

	"github.com/opkit/opkit/reconcile/envtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashHelperEnv) == "panic" {
		crashHelper() // never returns: see TestDeadTestBinaryLeavesNothing
	}
	envtest.Main(m, envtest.Options{ShardedListAndWatch: true})
}
