//go:build integration

package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/internal/logsink"
	"github.com/opkit/opkit/internal/testcluster"
	"github.com/opkit/opkit/trigger"
)

// startOn starts a replica whose clients, the trigger's reviews among
// them, talk to API server server of c, with a related watcher; its logs
// go to logs.
func startOn(t *testing.T, c *testcluster.Cluster, server int, ns, id string, logs *logsink.Buffer) *operatorReplica {
	t.Helper()
	return startOnWith(t, c, server, ns, id, replicaOptions{log: slog.New(slog.NewTextHandler(logs, nil)), checkCallers: true, owns: true})
}

// startOnWith starts a replica of options o whose clients talk to API
// server server of c.
func startOnWith(t *testing.T, c *testcluster.Cluster, server int, ns, id string, o replicaOptions) *operatorReplica {
	t.Helper()
	cfg := c.ConfigFor(server)
	return startOperatorReplica(t, dynamic.NewForConfigOrDie(cfg), kubernetes.NewForConfigOrDie(cfg), ns, id, o)
}

// Three replicas; the API server of one follower is stopped, then started
// again, ten times. Every trigger sent to that follower while its API
// server is down reaches the leader, whose API server works, and is
// reconciled there (the follower cannot check the caller, so it
// forwards); once its API server is back, the follower's watch and
// elector resume without the slow path a lasting refusal takes, and a
// trigger through it is answered again.
func TestIntegrationTriggersThroughAFollowerWhoseAPIServerRestarts(t *testing.T) {
	c, dyn, kube, ns := privateWidgets(t, testcluster.Options{APIServers: 2})
	ctx := context.Background()
	token := pipelineToken(t, c, kube, ns)
	create(t, dyn, ns, "w", 1)
	logs := &logsink.Buffer{}
	lead := startOn(t, c, 0, ns, "a", logs)
	eventually(t, time.Minute, "a leads", func() error {
		if lead.ctrl.Held() != 1 {
			return errors.New("not yet")
		}
		return nil
	})
	follower := startOn(t, c, 1, ns, "b", logs)
	startOn(t, c, 0, ns, "d", logs)
	eventually(t, time.Minute, "b knows the leader's endpoint", func() error {
		d, err := follower.ctrl.Trigger().Intake(ctx, trigger.Pointer{Key: opkit.Key{Namespace: ns, Name: "w"}}, trigger.IntakeOptions{})
		if err != nil || d.Endpoint != lead.op.TriggerURL() {
			return fmt.Errorf("b decides %+v (%v)", d, err)
		}
		return nil
	})

	post := func(reason string) (int, trigger.Outcome) {
		code, _, body := postWithToken(t, follower.op.TriggerURL()+"/reconcile/"+ns+"/w?wait=30s&reason="+reason, token)
		var out trigger.Outcome
		_ = json.Unmarshal([]byte(body), &out)
		if code != http.StatusOK || out.State != trigger.Succeeded || out.Replica != lead.id {
			t.Errorf("trigger %s through b: %d %s, want 200 with the leader's success", reason, code, body)
		}
		return code, out
	}
	var resumes []time.Duration
	for round := range 10 {
		if err := c.StopAPIServer(1); err != nil {
			t.Fatal(err)
		}
		post(fmt.Sprintf("down-%d", round))
		if err := c.StartAPIServer(1); err != nil {
			t.Fatal(err)
		}
		ready := time.Now()
		eventually(t, time.Minute, "b's watch and elector resumed", follower.ctrl.Check)
		resumes = append(resumes, time.Since(ready))
		post(fmt.Sprintf("up-%d", round))
	}
	if slow := logs.Lines("replica=b", "retrying slowly"); len(slow) > 0 {
		t.Errorf("b took the slow path of a lasting refusal: %q", slow)
	}
	t.Logf("b resumed after its API server was ready in %v (worst %v)", resumes, slices.Max(resumes))
}

// pipelineToken grants the ServiceAccount "pipeline" of ns update on
// widgets (what the trigger endpoint asks), waits until a review says
// so, and returns a token of it for the endpoint's audience.
func pipelineToken(t *testing.T, c *testcluster.Cluster, kube kubernetes.Interface, ns string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "trigger"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{widgets.Group}, Resources: []string{widgets.Resource}, Verbs: []string{"update"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "trigger"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "trigger"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "pipeline", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token, err := c.ServiceAccountToken(ctx, ns, "pipeline", trigger.DefaultAudience)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the pipeline's grant", func() error {
		sar, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User: "system:serviceaccount:" + ns + ":pipeline", Groups: []string{"system:serviceaccounts", "system:authenticated"},
			ResourceAttributes: &authzv1.ResourceAttributes{Namespace: ns, Verb: "update", Group: widgets.Group, Resource: widgets.Resource, Name: "w"}}}, metav1.CreateOptions{})
		if err != nil || !sar.Status.Allowed {
			return fmt.Errorf("not allowed yet (%v)", err)
		}
		return nil
	})
	return token
}
