package envtest

// The etcd under the API servers: starting it, and Compact through its gateway.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
)

// startEtcd starts etcd with its client URL on port and its peer URL on
// peerPort of 127.0.0.1, its data in the temp dir. It does not wait for it.
func (e *Environment) startEtcd(port, peerPort int) error {
	e.etcdURL = "http://127.0.0.1:" + strconv.Itoa(port)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	var err error
	e.etcd, err = startProcess("etcd", e.bins.Etcd, filepath.Join(e.dir, "etcd.log"), []string{
		"--name=opkit",
		"--data-dir=" + filepath.Join(e.dir, "etcd-data"),
		"--listen-client-urls=" + e.etcdURL,
		"--advertise-client-urls=" + e.etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=opkit=" + peerURL,
		"--unsafe-no-fsync=true", // throwaway data: durability buys nothing
		"--log-level=warn",
	})
	if err != nil {
		return fmt.Errorf("envtest: %w", err)
	}
	return nil
}

// Compact compacts etcd's history up to its current revision and returns that
// revision. It talks to etcd's JSON gateway, with no etcd client library.
//
// Afterwards etcd refuses reads and watches at older revisions, which the API
// server reports as 410 Gone -- but only for requests that reach etcd. With
// the watch cache on (the default) the API server keeps serving a watch or an
// exact list from a compacted resourceVersion out of memory (observed with
// v1.37.2); to make such a watch fail with 410, use an environment started with
// Options.DisableWatchCache, or restart the API server after Compact (its new
// cache starts at the current revision).
func (e *Environment) Compact(ctx context.Context) (int64, error) {
	var rng struct {
		Header struct {
			Revision json.Number `json:"revision"`
		} `json:"header"`
	}
	// Any key will do: the header carries the store's current revision.
	if err := e.etcdPost(ctx, "/v3/kv/range", map[string]any{"key": "Lw==", "limit": 1, "keys_only": true}, &rng); err != nil {
		return 0, err
	}
	rev, err := strconv.ParseInt(rng.Header.Revision.String(), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("envtest: etcd range: bad revision %q: %w", rng.Header.Revision, err)
	}
	if err := e.etcdPost(ctx, "/v3/kv/compaction", map[string]any{"revision": rev, "physical": true}, nil); err != nil {
		return 0, err
	}
	return rev, nil
}

func (e *Environment) etcdPost(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.etcdURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("envtest: etcd %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("envtest: etcd %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("envtest: etcd %s: HTTP %d: %s", path, resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("envtest: etcd %s: decode %s: %w", path, data, err)
		}
	}
	return nil
}
