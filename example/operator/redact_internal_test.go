package operator

import "testing"

func TestRedactURLsHidesPasswords(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                                "nats://127.0.0.1:4222",
		"nats://user:secret@nats:4222":                         "nats://user:xxxxx@nats:4222",
		"nats://a:pw1@n1:4222,nats://b:pw2@n2:4222":            "nats://a:xxxxx@n1:4222,nats://b:xxxxx@n2:4222",
		"nats://s3cr3t-token@n1:4222, nats://user:p%40ss@n2:1": "nats://xxxxx@n1:4222,nats://user:xxxxx@n2:1",
		"nats://user:secret@[::1:4222":                         "<unparsable URL>",
	} {
		if got := redactURLs(in); got != want {
			t.Errorf("redactURLs(%q) = %q, want %q", in, got, want)
		}
	}
}
