//go:build integration

package testcluster_test

import (
	"os"
	"testing"

	"github.com/opkit/opkit/internal/testcluster"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashHelperEnv) != "" {
		crashHelper() // never returns: see TestCrashedBinaryLeavesNoProcesses
	}
	testcluster.Main(m)
}
