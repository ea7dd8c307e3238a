package envtestbench

import (
	"os"
	"strings"
	"testing"
)

// The README quotes TestWebsite as it is compiled and run here.
func TestREADMEQuotesTestWebsite(t *testing.T) {
	src, err := os.ReadFile("readme_integration_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	fn := string(src[strings.Index(string(src), "func TestWebsite("):])
	if !strings.Contains(string(readme), "```go\n//go:build integration\n\n"+fn+"```\n") {
		t.Errorf("README.md does not quote TestWebsite of readme_integration_test.go as it is:\n%s", fn)
	}
}
