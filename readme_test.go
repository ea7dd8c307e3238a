package opkit_test

import (
	"os"
	"strings"
	"testing"
)

// The README's whole-operator main is Example_operator, word for word,
// so that what a newcomer copies compiles.
func TestTheREADMEShowsExampleOperator(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	main := between(string(readme), "```go\nfunc main() {\n", "\n}\n```")
	body := between(string(example), "\nfunc Example_operator() {\n", "\n}\n")
	if main == "" || body == "" {
		t.Fatalf("README's main found: %v; Example_operator found: %v", main != "", body != "")
	}
	if main != body {
		t.Errorf("the README's main is not Example_operator's body:\nREADME:\n%s\nexample_test.go:\n%s", main, body)
	}
}

// between returns what s holds between the first start and the end after
// it, or "".
func between(s, start, end string) string {
	_, after, ok := strings.Cut(s, start)
	if !ok {
		return ""
	}
	in, _, ok := strings.Cut(after, end)
	if !ok {
		return ""
	}
	return in
}
