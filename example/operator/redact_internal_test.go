package operator

import (
	"strings"
	"testing"
)

func TestRedactURLsHidesPasswords(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                                "nats://127.0.0.1:4222",
		"nats://user:secret@nats:4222":                         "nats://user:xxxxx@nats:4222",
		"nats://a:pw1@n1:4222,nats://b:pw2@n2:4222":            "nats://a:xxxxx@n1:4222,nats://b:xxxxx@n2:4222",
		"nats://s3cr3t-token@n1:4222, nats://user:p%40ss@n2:1": "nats://xxxxx@n1:4222,nats://user:xxxxx@n2:1",
		"nats://user:secret@[::1:4222":                         "<unparsable URL>",
		// nats.go reads a member without a scheme as nats://...
		"nats://n1:4222,user:s3cret@n2:4222": "nats://n1:4222,nats://user:xxxxx@n2:4222",
		"nats//user:s3cret@nats:4222":        "<unparsable URL>",
	} {
		if got := redactURLs(in); got != want {
			t.Errorf("redactURLs(%q) = %q, want %q", in, got, want)
		}
	}
}

// Neither a usage error nor a connect error shows a password.
func TestNoPasswordInNATSErrors(t *testing.T) {
	for _, u := range []string{"user:s3cret@nats:4222", "nats://user:s3cret@[::1:4222", "nats//user:s3cret@nats:4222", "nats://n1:4222,user:s3cret@n2:4222"} {
		o := Options{NATSURL: u, Concurrency: 1, TriggerBindAddress: "0", MetricsBindAddress: "0", HealthProbeBindAddress: "0"}
		err := o.Validate()
		if err == nil {
			t.Errorf("Validate(%q) accepted it", u)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Validate(%q) = %v: shows the password", u, err)
		}
	}
	connectErr := `parse "nats://b:s3cret@[::1:4222": missing ']' in host`
	if got := redactIn(connectErr, "nats://a:pw@127.0.0.1:1,nats://b:s3cret@[::1:4222"); strings.Contains(got, "s3cret") {
		t.Errorf("redactIn left the password: %q", got)
	}
	if got := redactIn("dial nats://user:s3cret@n2:4222: refused", "n1:4222,user:s3cret@n2:4222"); strings.Contains(got, "s3cret") {
		t.Errorf("redactIn left the password of a member without a scheme: %q", got)
	}
}
