package envtestbench

import (
	"os"
	"strings"
	"testing"
)

// docs/guide.md quotes TestWebsite as it is compiled and run here.
func TestGuideQuotesTestWebsite(t *testing.T) {
	src, err := os.ReadFile("guide_integration_test.go")
	if err != nil {
		t.Fatal(err)
	}
	guide, err := os.ReadFile("../../docs/guide.md")
	if err != nil {
		t.Fatal(err)
	}
	fn := string(src[strings.Index(string(src), "func TestWebsite("):])
	if !strings.Contains(string(guide), "```go\n//go:build integration\n\n"+fn+"```\n") {
		t.Errorf("docs/guide.md does not quote TestWebsite of guide_integration_test.go as it is:\n%s", fn)
	}
}
