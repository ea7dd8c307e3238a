package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/example/natsbroker"
	"github.com/opkit/opkit/example/operator"
	"github.com/opkit/opkit/queue"
	"github.com/opkit/opkit/trigger"
)

// triggerOptions are the trigger subcommand's settings.
type triggerOptions struct {
	Namespace, Name, Reason string
	Via                     string
	URL                     string
	Token, TokenFile        string
	NATSURL                 string
	Timeout, Wait           time.Duration
}

func parseTriggerFlags(args []string, stderr io.Writer) (triggerOptions, error) {
	var o triggerOptions
	fs := flag.NewFlagSet("demo-operator trigger", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: demo-operator trigger --namespace NS NAME [flags]

Asks the demo operator to reconcile one DemoEntity now, e.g. from a CI
pipeline after a deployment. The operator re-reads the entity from the API
server; the reason lands in its status.lastTrigger.reason.

  --via http  POST {url}/reconcile/NS/NAME with a bearer token minted for
              the audience %q (kubectl create token SA --audience %s);
              the caller needs "create" on demoentities/reconcile
              (ClusterRole opkit-demo-trigger). Any replica accepts it (a
              follower forwards it to the leader). Exit 0 on 202
              Accepted; with --wait, on the outcome "succeeded" (or
              "requeued"), 1 on any other. A 502, 503 (no leader now) or
              504, and a 429, are retried with backoff (at least the
              answer's Retry-After) until --timeout.
  --via nats  publish {"namespace","name","reason"} to the JetStream
              subject %s; exit 0 once the stream stored it.
              With --wait, ask for the outcome on a reply inbox (the
              operator answers once the reconcile ran) and exit as for
              http.

Flags:
`, operator.TriggerAudience, operator.TriggerAudience, natsbroker.DefaultSubject)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.Namespace, "namespace", "", "namespace of the DemoEntity (required)")
	fs.StringVar(&o.Reason, "reason", "", "why the reconcile is wanted; lands in status.lastTrigger.reason (at most 1024 bytes)")
	fs.StringVar(&o.Via, "via", "http", "how to send the trigger: http or nats")
	fs.StringVar(&o.URL, "url", "http://127.0.0.1:8082", "base URL of the operator's trigger endpoint (--via http)")
	fs.StringVar(&o.Token, "token", "", "bearer token for the trigger endpoint (--via http); prefer --token-file")
	fs.StringVar(&o.TokenFile, "token-file", "", "file holding the bearer token (--via http), e.g. a projected ServiceAccount token")
	fs.StringVar(&o.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL (--via nats)")
	fs.DurationVar(&o.Timeout, "timeout", 15*time.Second, "give up after this long")
	fs.DurationVar(&o.Wait, "wait", 0, "wait up to this long (within --timeout) for the reconcile's outcome and exit 1 unless it succeeded")

	// NAME may stand between flags: parse, take one positional, go on.
	var names []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			return o, err
		}
		if fs.NArg() == 0 {
			break
		}
		names = append(names, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	switch {
	case len(names) != 1:
		return o, usageError(fs, stderr, "want exactly one entity NAME, got %d", len(names))
	case o.Namespace == "":
		return o, usageError(fs, stderr, "--namespace is required")
	}
	o.Name = names[0]
	if errs := validation.IsDNS1123Subdomain(o.Name); len(errs) > 0 {
		return o, usageError(fs, stderr, "NAME %q: %s", o.Name, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
		return o, usageError(fs, stderr, "--namespace %q: %s", o.Namespace, strings.Join(errs, "; "))
	}
	if err := (trigger.Pointer{Key: opkit.Key{Namespace: o.Namespace, Name: o.Name}, Reason: o.Reason}).Check(); err != nil {
		return o, usageError(fs, stderr, "--reason: %v", err) // the name and namespace passed stricter checks
	}
	if o.Timeout <= 0 || o.Wait < 0 || o.Wait > o.Timeout {
		return o, usageError(fs, stderr, "--timeout must be positive, --wait within it")
	}
	switch o.Via {
	case "http":
		if o.Token != "" && o.TokenFile != "" {
			return o, usageError(fs, stderr, "give --token or --token-file, not both")
		}
		if u, err := url.Parse(o.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return o, usageError(fs, stderr, "--url %q: want http(s)://host:port", o.URL)
		}
	case "nats":
		if o.Token != "" || o.TokenFile != "" {
			return o, usageError(fs, stderr, "--token and --token-file apply to --via http only")
		}
	default:
		return o, usageError(fs, stderr, "--via %q: want http or nats", o.Via)
	}
	return o, nil
}

func runTrigger(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseTriggerFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if o.Via == "nats" {
		err = triggerNATS(ctx, o, stdout)
	} else {
		err = triggerHTTP(ctx, o, stdout, stderr)
	}
	if err != nil {
		fmt.Fprintln(stderr, "demo-operator trigger:", err)
		return 1
	}
	return 0
}

func triggerNATS(ctx context.Context, o triggerOptions, stdout io.Writer) error {
	nc, err := nats.Connect(o.NATSURL, nats.Name("demo-operator-trigger"), nats.Timeout(o.Timeout))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", o.NATSURL, err)
	}
	defer nc.Close()
	p := natsbroker.Pointer{Namespace: o.Namespace, Name: o.Name, Reason: o.Reason}
	if o.Wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, o.Wait)
		defer cancel()
		out, err := natsbroker.Request(wctx, nc, natsbroker.DefaultSubject, p)
		if err != nil {
			return err
		}
		return reportOutcome(out, stdout)
	}
	seq, err := natsbroker.Publish(ctx, nc, natsbroker.DefaultSubject, p)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "published trigger for %s/%s to %s (stream sequence %d)\n", o.Namespace, o.Name, natsbroker.DefaultSubject, seq)
	return nil
}

// triggerHTTP posts the trigger and, with --wait, waits for its outcome.
// A 502, 503 or 504 (no leader now, or the leader did not answer a
// forwarding replica) and a 429 are retried with backoff, at least the
// Retry-After the endpoint sent, until --timeout.
func triggerHTTP(ctx context.Context, o triggerOptions, stdout, stderr io.Writer) error {
	token := o.Token
	if o.TokenFile != "" {
		b, err := os.ReadFile(o.TokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	var body []byte
	if o.Reason != "" {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false) // the reason as given: "<" stays one byte
		if err := enc.Encode(map[string]string{"reason": o.Reason}); err != nil {
			return err
		}
		body = b.Bytes()
	}
	base := strings.TrimRight(o.URL, "/")
	u := base + "/reconcile/" + url.PathEscape(o.Namespace) + "/" + url.PathEscape(o.Name)
	if o.Wait > 0 {
		u += "?wait=" + o.Wait.String()
	}
	method := http.MethodPost
	for failures := 1; ; failures++ {
		code, b, retryAfter, err := send(ctx, method, u, body, token)
		if err != nil {
			return err
		}
		switch code {
		case http.StatusOK: // the outcome
			var out trigger.Outcome
			if err := json.Unmarshal(b, &out); err != nil {
				return fmt.Errorf("200 with a body that is no outcome: %s", b)
			}
			if out.State != trigger.Pending { // Pending: a GET of a trigger whose reconcile has not finished
				return reportOutcome(out, stdout)
			}
		case http.StatusAccepted:
			var a trigger.Accepted
			_ = json.Unmarshal(b, &a)
			if o.Wait == 0 || a.StatusPath == "" {
				fmt.Fprintf(stdout, "202 Accepted: %s\n", bytes.TrimSpace(b))
				return nil
			}
			// The wait ended first: ask for the outcome until --timeout.
			method, body, u = http.MethodGet, nil, base+a.StatusPath
			fmt.Fprintf(stderr, "demo-operator trigger: accepted as %s; waiting for its outcome\n", a.ID)
		default:
			var st struct {
				Reason, Message, Leader string
			}
			_ = json.Unmarshal(b, &st)
			msg := strings.TrimSpace(fmt.Sprintf("%d %s: %s %s", code, http.StatusText(code), st.Reason, st.Message))
			if !slices.Contains([]int{http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout}, code) {
				return errors.New(msg)
			}
			wait := max(retryAfter, queue.Backoff{Base: 500 * time.Millisecond, Cap: 5 * time.Second}.Delay(failures))
			if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
				return fmt.Errorf("%s; no time left to retry within --timeout", msg)
			}
			fmt.Fprintf(stderr, "demo-operator trigger: %s; retrying in %s\n", msg, wait.Round(time.Millisecond))
			if !pause(ctx, wait) {
				return fmt.Errorf("%s; gave up: %w", msg, ctx.Err())
			}
			continue
		}
		if !pause(ctx, time.Second) { // polling a pending outcome
			return fmt.Errorf("no outcome within --timeout: %w", ctx.Err())
		}
	}
}

// send makes one request and returns the answer's code, body and
// Retry-After.
func send(ctx context.Context, method, u string, body []byte, token string) (int, []byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var retryAfter time.Duration
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		retryAfter = time.Duration(secs) * time.Second
	}
	return resp.StatusCode, b, retryAfter, nil
}

// reportOutcome prints a finished reconcile's outcome; it is an error
// unless the reconcile succeeded or was requeued.
func reportOutcome(out trigger.Outcome, stdout io.Writer) error {
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	switch out.State {
	case trigger.Succeeded, trigger.Requeued:
		fmt.Fprintf(stdout, "reconciled: %s\n", b)
		return nil
	default:
		return fmt.Errorf("reconcile %s: %s", out.State, b)
	}
}

// pause waits d, or until ctx ends (false).
func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}
